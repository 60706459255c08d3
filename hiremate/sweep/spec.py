"""What a sweep is: models x budgets x methods, read from a YAML file and checked.

A sweep file (``configs/sweeps/*.yaml``) is read with ``yaml.safe_load`` and turned into a
:class:`SweepSpec`. Every unknown key, method or model raises :class:`ConfigError` listing the
valid ones, so that a typo never silently runs a different sweep. Why a spec object: the runner,
the results store and the plots all key their data by the labels it defines (model label, budget
label, method name), so they must agree on one parser.

Example::

    name: smoke
    models:
      - {name: mlp, layers: 2, width: 32}          # a zoo model with its sizes
      - {factory: "mypkg.models:make", kwargs: {depth: 4}, label: mine}  # (model, sample)
    budgets: [floor, 0.5, 0.8, "2MiB"]              # fractions of the eager peak, sizes, or
                                                    # floor: the lowest the first preset meets
    methods: [eager, checkpoint, compile, rotor]
    repeats: 3
    paired_timing: true   # time eager in alternation with each method (load-robust ratios)
    presolve: true        # hiremate presets: one graph per model, all budgets solved first
    floor_steps: 6        # solves that bisect for the floor below the guaranteed budget

Models may also be plain strings: ``gpt2`` (a zoo name with its defaults) or
``package.module:factory`` (imported with importlib; no ``eval``).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from hiremate.errors import ConfigError
from hiremate.units import parse_bytes

#: Methods that are not hiremate presets (see :mod:`hiremate.sweep.methods`).
PEERS = ("eager", "checkpoint", "checkpoint_sequential", "compile")
#: ``<preset>+loss``: the preset with the sweep's loss captured into the graph (every other
#: method, and a plain preset, runs the loss outside what it schedules)
LOSS_CAPTURED = "+loss"
#: Peers with no notion of a budget: measured once per model, not once per budget.
UNBUDGETED = ("eager", "checkpoint", "checkpoint_sequential")
#: Label of the budget column for unbudgeted cells.
NO_BUDGET = "-"

SPEC_KEYS = (
    "name", "description", "models", "budgets", "methods", "repeats", "warmup", "dtype",
    "device", "n_jobs", "backend", "threads", "tolerance", "hiremate_overrides", "paired_timing",
    "presolve", "compile_backend", "floor_steps",
)
MODEL_KEYS_ZOO = ("name", "layers", "width", "batch", "label")
MODEL_KEYS_FACTORY = ("factory", "kwargs", "label")
DTYPES = ("float32", "float64", "bfloat16", "float16")
BACKENDS = ("loky", "dask", "threading", "multiprocessing", "sequential")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def preset_names() -> list[str]:
    """hiremate presets (``configs/*.yaml``); empty when the config module is missing."""
    try:
        from hiremate.config import preset_names as names
    except ImportError:
        return []
    return list(names())


def method_names() -> list[str]:
    """Every method a sweep may name: the peers, the hiremate presets and each preset with the
    loss captured (``<preset>+loss``)."""
    presets = [p for p in preset_names() if p not in PEERS]
    return list(PEERS) + presets + [p + LOSS_CAPTURED for p in presets]


def preset_of(method: str) -> tuple[str, bool]:
    """``(preset, loss captured)`` of a hiremate method name."""
    if method.endswith(LOSS_CAPTURED):
        return method[:-len(LOSS_CAPTURED)], True
    return method, False


@dataclass(frozen=True)
class ModelEntry:
    """One model of the grid: a zoo model with sizes, or a ``module:factory`` with kwargs."""

    label: str
    zoo: str | None = None
    layers: int | tuple[int, ...] | None = None
    width: int | None = None
    batch: int | None = None
    factory: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if isinstance(out["layers"], tuple):
            out["layers"] = list(out["layers"])
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelEntry":
        data = dict(data)
        if isinstance(data.get("layers"), list):
            data["layers"] = tuple(data["layers"])
        return cls(**data)

    def build(self, dtype: Any = None) -> tuple[Any, Any]:
        """A fresh ``(model, sample)``: zoo models are deterministic, factories are trusted."""
        if self.zoo is not None:
            from hiremate import zoo

            return zoo.get(self.zoo, layers=self.layers, width=self.width, batch=self.batch,
                           dtype=dtype)
        fn = import_factory(self.factory or "")
        result = fn(**self.kwargs)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ConfigError(f"factory {self.factory!r} must return (model, sample), got "
                              f"{type(result).__name__}")
        model, sample = result
        if dtype is not None:
            model = model.to(dtype)
        return model, sample


@dataclass(frozen=True)
class Budget:
    """A budget of the grid: a fraction of the measured eager peak, a number of bytes, or the
    model's floor (``floor``: the lowest whole-step budget the sweep's first hiremate preset
    meets on that model's graph, so that "how low can it go" is measured, not guessed from a
    grid; peers get the same fraction of the eager peak)."""

    label: str
    fraction: float | None = None
    nbytes: int | None = None
    floor: bool = False

    def resolve(self, eager_peak: int, floor_bytes: int | None = None) -> tuple[int, float]:
        """``(bytes, fraction of eager_peak)`` of this budget for a model whose floor (when
        known) is ``floor_bytes``."""
        if self.floor:
            if floor_bytes is None:
                raise ConfigError("budget 'floor' needs a hiremate preset among the methods and "
                                  "the model's graph; neither was found for this model")
            return int(floor_bytes), floor_bytes / max(1, eager_peak)
        if self.fraction is not None:
            return max(1, int(math.floor(self.fraction * eager_peak))), self.fraction
        assert self.nbytes is not None
        return self.nbytes, self.nbytes / max(1, eager_peak)


@dataclass
class SweepSpec:
    """A parsed and checked sweep file; see the module docstring."""

    name: str
    models: list[ModelEntry]
    budgets: list[Budget]
    methods: list[str]
    description: str = ""
    repeats: int = 3
    warmup: int = 1
    dtype: str = "float32"
    device: str = "auto"
    n_jobs: int = 1
    backend: str = "loky"
    threads: int | None = None
    tolerance: float = 0.05
    paired_timing: bool = True  # time eager in alternation with each method (see sweep.methods)
    presolve: bool = True  # one graph per model, all budgets solved first (see sweep.presolve)
    hiremate_overrides: dict[str, Any] = field(
        default_factory=lambda: {"n_jobs": 1, "progress": False})
    compile_backend: str | None = None
    floor_steps: int = 6  # bisecting solves below the guaranteed floor (see sweep.presolve)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["models"] = [m.to_dict() for m in self.models]
        return out

    @property
    def budgeted_methods(self) -> list[str]:
        return [m for m in self.methods if m not in UNBUDGETED]

    @property
    def floor_preset(self) -> str | None:
        """The preset whose lowest budget a ``floor`` budget is: the first one listed that runs
        the loss outside (the floor is searched on the model's graph, which holds no loss)."""
        return next((m for m in self.methods if m not in PEERS and not preset_of(m)[1]), None)

    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)


def import_factory(text: str) -> Callable[..., Any]:
    """The callable named by ``package.module:attr`` (attr may be dotted), via importlib."""
    if not isinstance(text, str) or not _FACTORY.match(text):
        raise ConfigError(f"model factory {text!r} must read 'package.module:function'")
    module_name, attr = text.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} of factory {text!r}: {exc}"
                          ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r} (factory {text!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"factory {text!r} is not callable")
    return obj


def _zoo_label(name: str, args: Mapping[str, Any]) -> str:
    parts = [name]
    for key, short in (("layers", "L"), ("width", "W"), ("batch", "B")):
        value = args.get(key)
        if value is not None:
            text = "x".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
            parts.append(f"{short}{text}")
    return "-".join(parts)


def parse_model(entry: Any) -> ModelEntry:
    """A :class:`ModelEntry` from a string or a mapping of the sweep file."""
    from hiremate import zoo

    if isinstance(entry, str):
        entry = {"factory": entry} if ":" in entry else {"name": entry}
    if not isinstance(entry, Mapping):
        raise ConfigError(f"a model must be a zoo name, 'package.module:factory' or a mapping, "
                          f"got {entry!r}")
    if "factory" in entry:
        unknown = [k for k in entry if k not in MODEL_KEYS_FACTORY]
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} in factory model {dict(entry)}; valid "
                              f"keys: {', '.join(MODEL_KEYS_FACTORY)}")
        import_factory(entry["factory"])  # fail early on a bad name
        kwargs = entry.get("kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"kwargs of factory {entry['factory']!r} must be a mapping")
        label = str(entry.get("label") or entry["factory"])
        return ModelEntry(label=label, factory=entry["factory"], kwargs=dict(kwargs))
    if "name" not in entry:
        raise ConfigError(f"model {dict(entry)} needs 'name' (a zoo model: "
                          f"{', '.join(zoo.names())}) or 'factory' ('package.module:function')")
    unknown = [k for k in entry if k not in MODEL_KEYS_ZOO]
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in model {dict(entry)}; valid keys: "
                          f"{', '.join(MODEL_KEYS_ZOO)} (or factory, kwargs, label)")
    name = entry["name"]
    from hiremate.zoo.registry import resolve_args

    args = {k: entry.get(k) for k in ("layers", "width", "batch")}
    if isinstance(args["layers"], list):
        args["layers"] = tuple(args["layers"])
    resolve_args(name, **args)  # unknown name or bad size: ConfigError listing the valid ones
    label = str(entry.get("label") or _zoo_label(name, args))
    return ModelEntry(label=label, zoo=name, **args)


def parse_budget(value: Any) -> Budget:
    """A fraction in (0, 1] of the eager peak, a size (``"2MiB"``, an int of bytes), or
    ``floor``."""
    if isinstance(value, str) and value.strip().lower() == "floor":
        return Budget(label="floor", floor=True)
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"budget {value!r} is neither a fraction in (0, 1] nor a size")
    if isinstance(value, float) or (isinstance(value, str) and re.fullmatch(r"\s*0?\.\d+\s*|\s*1\.0*\s*", value)):
        frac = float(value)
        if not 0 < frac <= 1:
            raise ConfigError(f"budget {value!r}: a fraction of the eager peak must lie in (0, 1]")
        return Budget(label=f"{frac:g}", fraction=frac)
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"budget {value} bytes must be positive")
        return Budget(label=str(value), nbytes=value)
    if isinstance(value, str):
        nbytes = parse_bytes(value)
        if nbytes <= 0:
            raise ConfigError(f"budget {value!r} must be positive")
        return Budget(label=value.strip().replace(" ", ""), nbytes=nbytes)
    raise ConfigError(f"budget {value!r} is neither a fraction in (0, 1], a size like '2MiB', "
                      "nor 'floor'")


def _positive_int(key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"sweep key {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def parse_spec(data: Any, default_name: str = "sweep") -> SweepSpec:
    """A checked :class:`SweepSpec` from the mapping of a sweep file."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a sweep file must hold a mapping with keys {', '.join(SPEC_KEYS)}")
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        raise ConfigError(f"unknown sweep key(s) {', '.join(map(repr, unknown))}; valid keys: "
                          f"{', '.join(SPEC_KEYS)}")
    for key in ("models", "budgets", "methods"):
        if not isinstance(data.get(key), list) or not data[key]:
            raise ConfigError(f"sweep key {key!r} must be a non-empty list")
    models = [parse_model(m) for m in data["models"]]
    labels = [m.label for m in models]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"models {dupes} appear twice; give them distinct 'label's")
    budgets = [parse_budget(b) for b in data["budgets"]]
    if len({b.label for b in budgets}) != len(budgets):
        raise ConfigError(f"budgets {data['budgets']} repeat a value")
    valid = method_names()
    methods = []
    for m in data["methods"]:
        if m not in valid:
            raise ConfigError(f"unknown method {m!r}; valid methods: {', '.join(valid)} (peers: "
                              f"{', '.join(PEERS)}; the rest are hiremate presets, with "
                              f"'{LOSS_CAPTURED}' the loss captured into the graph)")
        if m not in methods:
            methods.append(m)
    if "eager" not in methods:  # the reference of every fraction and relative time
        methods.insert(0, "eager")
    spec = SweepSpec(name=str(data.get("name") or default_name), models=models, budgets=budgets,
                     methods=methods, description=str(data.get("description") or ""))
    if any(b.floor for b in budgets) and spec.floor_preset is None:
        raise ConfigError("budget 'floor' is the lowest budget a hiremate preset meets with the "
                          "loss outside: add a preset (e.g. hiremate) to the methods, or remove "
                          "'floor'")
    if "repeats" in data:
        spec.repeats = _positive_int("repeats", data["repeats"])
    if "warmup" in data:
        spec.warmup = _positive_int("warmup", data["warmup"], 0)
    if "floor_steps" in data:
        spec.floor_steps = _positive_int("floor_steps", data["floor_steps"], 0)
    if "n_jobs" in data:
        n = data["n_jobs"]
        if isinstance(n, bool) or not isinstance(n, int) or n == 0:
            raise ConfigError(f"n_jobs must be a non-zero integer (-1: all cores), got {n!r}")
        spec.n_jobs = n
    if "threads" in data and data["threads"] is not None:
        spec.threads = _positive_int("threads", data["threads"])
    if "dtype" in data:
        if data["dtype"] not in DTYPES:
            raise ConfigError(f"dtype {data['dtype']!r} is not one of {', '.join(DTYPES)}")
        spec.dtype = data["dtype"]
    if "device" in data:
        if not isinstance(data["device"], str):
            raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda', got {data['device']!r}")
        spec.device = data["device"]
    if "backend" in data:
        if data["backend"] not in BACKENDS:
            raise ConfigError(f"backend {data['backend']!r} is not one of {', '.join(BACKENDS)}")
        spec.backend = data["backend"]
    for flag in ("paired_timing", "presolve"):
        if flag in data:
            if not isinstance(data[flag], bool):
                raise ConfigError(f"{flag} must be true or false, got {data[flag]!r}")
            setattr(spec, flag, data[flag])
    if "tolerance" in data:
        tol = data["tolerance"]
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or tol < 0:
            raise ConfigError(f"tolerance must be a number >= 0, got {tol!r}")
        spec.tolerance = float(tol)
    if "hiremate_overrides" in data:
        over = data["hiremate_overrides"] or {}
        if not isinstance(over, Mapping):
            raise ConfigError("hiremate_overrides must be a mapping of configuration keys")
        spec.hiremate_overrides = dict(over)
    if data.get("compile_backend") is not None:
        spec.compile_backend = str(data["compile_backend"])
    return spec


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read sweep file {path}: {exc}") from exc
    return parse_spec(data, default_name=path.stem)


def spec_from_dict(data: Mapping[str, Any]) -> SweepSpec:
    """Rebuild a spec from :meth:`SweepSpec.to_dict` (the copy kept in results.json)."""
    data = dict(data)
    data["models"] = [ModelEntry.from_dict(m) for m in data["models"]]
    data["budgets"] = [Budget(**b) for b in data["budgets"]]
    return SweepSpec(**data)
