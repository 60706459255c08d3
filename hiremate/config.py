"""Configurations of the whole pipeline: which partitioner, which solvers at which level, and how
to run them (parallelism, cache, progress). Presets are YAML files in ``configs/``.

Progress bars (``progress``) are drawn on stderr when it is a terminal (``"auto"``, the
default), always (``true``) or never (``false``): a library call in a script, a notebook's
captured cell or a CI log stays quiet unless asked.

Levels (where a solver may be placed):

- ``flat``: whole-graph solvers (``schedule(graph, budget)``), tried on graphs of at most
  ``flat_max_nodes`` compute nodes; the fastest schedule within the budget wins;
- ``bottom``: menu solvers (``menu(graph, budgets)``) for each unique leaf subgraph of the
  partition (every top-level part, flattened, when ``middle`` is empty);
- ``middle``: composers that give each inner subgraph (one with subgraph children) a menu over
  its children's menus, level by level bottom-up (:mod:`hiremate.composer.levels`);
  ``middle_flat``: menu solvers run on each inner subgraph's whole graph as well;
- ``top``: composers that join the blocks' menus into one schedule (``rk-rotor``: chain of blocks);
- ``sequence_top``: composers run beside the hierarchy over the ``sequence`` partition's blocks
  (Rockmate's two levels, ``bottom`` menus of ``n_options`` each): a chain of small blocks
  sometimes suits rk-Rotor better than the hierarchy's few large top-level subgraphs, and costs
  little; empty (the default) or with ``partitioner: sequence``: not run, nor when a sequence
  block has more than ``sequence_max_block`` forward nodes (its menus would take minutes) or
  more than half of the graph's (its menu would be MILPs on most of the graph);
- ``polish``: solvers with a ``polish(graph, budget, schedule)`` method (``fastsa``: its
  annealing started from the schedule) run from the fastest candidate of each of the
  ``polish_from`` fastest sources (every path's candidates, the pool's too); what they find
  within the budget is a candidate named ``<source>+<polisher>``;
- ``refine``: polishers run in turn on the single fastest candidate once the polish is done
  (``hilp-window``: the flat H-ILP re-solved window by window around it,
  :mod:`hiremate.solvers.hilp.window`), each from the previous one's schedule; the result is a
  candidate named ``<source>+<refiner>``.

``total_options`` is the paper's N_o: the options that the blocks of one problem share, in
proportion to their forward nodes, ``n_options`` at most each.

The hierarchical path (bottom + top) runs too unless a flat H-ILP proved its schedule optimal
or the best flat schedule is predicted within ``hierarchical_above`` times autodiff's time (a
time-limited flat MILP often keeps a poor incumbent that the hierarchy beats); all candidates
are simulated and the fastest one within the budget is kept. With ``flat_rewarm``, a flat H-ILP
that proved nothing and that the hierarchy's schedules beat runs once more, warm-started from
them: within the same work limit, the search then starts from the better schedule instead of
TW-Remat's. When no other flat solver fits the budget, the flat H-ILP's only start would be full
recomputation, so it does not run first: it runs once, after the hierarchy, warm-started from
its schedules (``flat_deferred`` in the report). With ``flat_gap`` (a fraction; null: off), the
flat H-ILP waits for the hierarchy and the polish, and runs only where their best schedule is
more than that fraction above the moment bound, a time no in-order schedule beats
(``flat_gate`` in the report; :mod:`hiremate.composer.flat`): near its size limit its MILP
outlasts the rest of the solve, and where the bound leaves little it cannot win more. With
``flat_gap_columns`` as well, that fraction is the threshold of a MILP of that many columns, and
a smaller MILP's threshold shrinks in proportion: what the MILP costs grows with its size, so on
a small graph it runs for a smaller gap.
When the hierarchy's top level finds no schedule within the budget (and the budget
is not below the graph's memory floor, where none could), the graph is partitioned again with a
top at most half as large (the partitioner's ``coarser``), up to ``coarser_tops`` times: the
top level's parts then hold more of the graph, for the middle composers to schedule inside
them, where the options of a fine top's parts may not combine within the budget. With
``reuse_schedules`` (and the cache on), the schedules that earlier solves of the same graph and
configuration found at other budgets are candidates too
(:mod:`hiremate.composer.pool`): a solve never returns something slower than a schedule already
known to fit.

New input shapes (``on_new_inputs``): a call whose inputs differ from the sample (another batch
size or sequence length) is captured again for those inputs, once, with the budget resolved
again (a fraction of *their* autodiff peak, but never fewer bytes than the sample's; bytes stay
bytes) and the model left untouched; up to ``max_shapes`` such variants are kept besides the
sample's, the least recently used evicted. ``on_new_inputs: raise`` raises
:class:`hiremate.InputMismatchError` instead. With ``transfer_schedules``, new inputs whose
program has the structure of one already solved (the same model on other sizes) first try that
schedule (:func:`hiremate.solving.transfer_schedule`): when its whole step fits their budget at
no more than its overhead where it was solved, it runs without a solve; else they are solved.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from hiremate.errors import ConfigError
from hiremate.quiet import check_progress

#: Folder of the YAML presets (the repository's ``configs/``).
PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"
LEVELS = ("flat", "bottom", "middle", "middle_flat", "top", "sequence_top", "polish", "refine")
ON_NEW_INPUTS = ("recapture", "raise")
OUTPUT_GRADIENTS = ("auto", "all")


@dataclass
class Config:
    """Every knob of :class:`hiremate.HRockmate`; see the module docstring for the levels."""

    name: str = "custom"
    description: str = ""
    partitioner: str = "sequence"
    partitioner_params: dict[str, Any] = field(default_factory=dict)
    flat: list[str] = field(default_factory=lambda: ["hilp", "twremat"])
    bottom: list[str] = field(default_factory=lambda: ["hilp", "twremat"])
    top: list[str] = field(default_factory=lambda: ["rk-rotor"])
    middle: list[str] = field(default_factory=list)       # composers for inner subgraphs
    middle_flat: list[str] = field(default_factory=list)  # flat menus of inner subgraphs too
    sequence_top: list[str] = field(default_factory=list)  # composers over the sequence partition
    sequence_max_block: int = 20  # ... run when its blocks have at most this many forward nodes
    polish: list[str] = field(default_factory=list)  # local search from the best candidates
    polish_from: int = 3         # ... the fastest candidate of this many fastest sources
    refine: list[str] = field(default_factory=list)  # then polishers on the fastest one, in turn
    flat_max_nodes: int = 250
    hierarchical_above: float = 1.0  # skip the hierarchy when a flat schedule is this fast
    flat_rewarm: bool = False    # flat H-ILP again, warm-started from the hierarchy's schedules
    flat_gap: float | None = None  # flat H-ILP only where the others leave more to the bound
    flat_gap_columns: int | None = None  # ... flat_gap holds at this MILP size, scaled below it
    coarser_tops: int = 2        # partitions with a smaller top tried when the top finds nothing
    solver_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    n_options: int = 8           # options kept per block at most
    total_options: int | None = None  # N_o: options of one problem's blocks (None: n_options each)
    menu_peaks: int = 4          # menu budget grid: peaks ...
    menu_saves: int = 3          # ... times memory kept before the loss (H-ILP only)
    n_jobs: int = -1             # joblib workers for the menus (-1: all cores)
    backend: str = "loky"        # any joblib backend ("loky", "threading", "dask", ...)
    cache: bool = True
    cache_dir: str | None = None  # menus; default: $HIREMATE_CACHE or ~/.cache/hiremate (the
                                  # roofline fit, a fact of the machine, always stays there)
    progress: bool | str = "auto"  # bars: True, False, or "auto" (only when stderr is a terminal)
    calibrate: int = 2           # re-solves when the measured peak exceeds the budget (0: off)
    cost_model: str = "auto"     # node times: auto (measured on GPU, roofline on CPU), measured,
                                 # flops, roofline (hiremate.graphbuilder.costs)
    reuse_schedules: bool = True  # offer schedules found at other budgets (hiremate.composer.pool)
    on_new_inputs: str = "recapture"  # other input shapes: "recapture" (capture again) or "raise"
    max_shapes: int = 16         # variants for other input shapes kept (least recently used out)
    transfer_schedules: bool = True  # new input sizes first try the schedules solved for others
    output_gradients: str = "auto"  # "auto": a loss returned beside other outputs is what the
                                    # backward starts from; "all": every output may get one

    def __post_init__(self) -> None:
        self.validate()

    # -- checks -------------------------------------------------------------------------------
    def validate(self) -> "Config":
        from hiremate.registry import partitioner_names, solver_names

        known = solver_names()
        for level in LEVELS:
            value = getattr(self, level)
            if isinstance(value, str):
                value = [value]
                setattr(self, level, value)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"config {level!r} must be a list of solver names, got {value!r}")
            for name in value:
                if name not in known:
                    raise ConfigError(f"unknown solver {name!r} at level {level!r}; registered "
                                      f"solvers: {', '.join(sorted(known))}")
        for name in self.solver_params:
            if name not in known:
                raise ConfigError(f"solver_params names unknown solver {name!r}; registered "
                                  f"solvers: {', '.join(sorted(known))}")
        if self.partitioner not in partitioner_names():
            raise ConfigError(f"unknown partitioner {self.partitioner!r}; registered: "
                              f"{', '.join(sorted(partitioner_names()))}")
        if not (self.flat or (self.bottom and self.top)):
            raise ConfigError("a configuration needs a flat solver, or bottom and top solvers")
        from hiremate.registry import solver_class

        for level in ("polish", "refine"):
            for name in getattr(self, level):
                if not callable(getattr(solver_class(name), "polish", None)):
                    raise ConfigError(f"solver {name!r} cannot polish a schedule (no polish "
                                      f"method); {level} takes e.g. "
                                      + ("fastsa" if level == "polish" else "hilp-window"))
        if (isinstance(self.coarser_tops, bool) or not isinstance(self.coarser_tops, int)
                or self.coarser_tops < 0):
            raise ConfigError(f"coarser_tops must be an integer >= 0 (coarser partitions tried "
                              f"when the top level finds nothing), got {self.coarser_tops!r}")
        for key in ("n_options", "menu_peaks", "menu_saves", "polish_from"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ConfigError(f"{key} must be a positive integer, got {getattr(self, key)!r}")
        if self.total_options is not None and (isinstance(self.total_options, bool) or not
                                               isinstance(self.total_options, int)
                                               or self.total_options < 1):
            raise ConfigError("total_options (N_o, the options shared by the blocks of one "
                              f"problem) must be a positive integer or null, got "
                              f"{self.total_options!r}")
        from hiremate.graphbuilder.costs import check_cost_model

        self.cost_model = check_cost_model(self.cost_model)
        if not isinstance(self.calibrate, int) or self.calibrate < 0:
            raise ConfigError(f"calibrate must be an integer >= 0, got {self.calibrate!r}")
        if self.on_new_inputs not in ON_NEW_INPUTS:
            raise ConfigError(f"on_new_inputs must be one of {', '.join(map(repr, ON_NEW_INPUTS))}"
                              f", got {self.on_new_inputs!r}")
        if self.output_gradients not in OUTPUT_GRADIENTS:
            raise ConfigError(f"output_gradients must be one of "
                              f"{', '.join(map(repr, OUTPUT_GRADIENTS))}, got "
                              f"{self.output_gradients!r}")
        if (isinstance(self.max_shapes, bool) or not isinstance(self.max_shapes, int)
                or self.max_shapes < 1):
            raise ConfigError(f"max_shapes must be a positive integer (input shapes kept besides "
                              f"the sample's), got {self.max_shapes!r}")
        if not isinstance(self.n_jobs, int) or self.n_jobs == 0:
            raise ConfigError(f"n_jobs must be a non-zero integer (-1: all cores), got {self.n_jobs!r}")
        self._check_types()
        return self

    def _check_types(self) -> None:
        """The remaining fields' types, so that a YAML typo fails here and not mid-solve."""
        expect = {"name": str, "description": str, "backend": str, "cache": bool,
                  "reuse_schedules": bool, "flat_rewarm": bool, "partitioner_params": dict,
                  "transfer_schedules": bool, "solver_params": dict}
        for key, typ in expect.items():
            if hasattr(self, key) and not isinstance(getattr(self, key), typ):
                raise ConfigError(f"{key} must be a {typ.__name__}, got {getattr(self, key)!r}")
        check_progress(self.progress)
        if self.flat_gap is not None and (isinstance(self.flat_gap, bool) or not isinstance(
                self.flat_gap, (int, float)) or not self.flat_gap >= 0):
            raise ConfigError(f"flat_gap must be a fraction >= 0 (the flat H-ILP runs where the "
                              f"best other schedule is more than that above the bound) or "
                              f"null (always), got {self.flat_gap!r}")
        if self.flat_gap_columns is not None and (isinstance(self.flat_gap_columns, bool) or
                                                  not isinstance(self.flat_gap_columns, int) or
                                                  self.flat_gap_columns < 1):
            raise ConfigError(f"flat_gap_columns must be a positive number of MILP columns (the "
                              f"size at which flat_gap holds) or null (flat_gap at every size), "
                              f"got {self.flat_gap_columns!r}")
        for key, typ in (("flat_max_nodes", int), ("hierarchical_above", (int, float)),
                         ("sequence_max_block", int)):
            v = getattr(self, key, 0)
            if isinstance(v, bool) or not isinstance(v, typ) or not v >= 0:
                raise ConfigError(f"{key} must be a number >= 0, got {v!r}")
        for name, params in self.solver_params.items():
            if not isinstance(params, dict):
                raise ConfigError(f"solver_params[{name!r}] must be a mapping of parameters, "
                                  f"got {params!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, Path)):
            raise ConfigError(f"cache_dir must be a path or null, got {self.cache_dir!r}")

    # -- conversions --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Config":
        if not isinstance(data, Mapping):
            raise ConfigError(f"a configuration must be a mapping, got {type(data).__name__}")
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in data if k not in valid]
        if unknown:
            raise ConfigError(f"unknown configuration key(s) {', '.join(map(repr, unknown))}; "
                              f"valid keys: {', '.join(valid)}")
        return cls(**copy.deepcopy(dict(data)))

    def replace(self, **overrides: Any) -> "Config":
        data = self.to_dict()
        data.update(overrides)
        return Config.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        """The file's configuration, whole (as the presets in configs/ are read)."""
        return cls.from_dict(_read_yaml(path))

    def solver_key(self, name: str) -> dict[str, Any]:
        """What identifies a solver's output: its name and parameters (menu cache key)."""
        return {"solver": name, "params": self.solver_params.get(name, {}),
                "menu_peaks": self.menu_peaks, "menu_saves": self.menu_saves}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_config(config: "str | Path | Mapping[str, Any] | Config | None" = None,
                **overrides: Any) -> Config:
    """A :class:`Config` from a preset name, a YAML path, a dict or a Config, with overrides.

    An override replaces the key it names, except ``solver_params``: there each solver's
    parameters are merged into the base's, so that ``solver_params={"hilp": {"work_limit":
    1000}}`` raises one limit and keeps the preset's other H-ILP parameters (its ``max_nodes``,
    for one) and every other solver's. To drop a preset's parameter, pass the whole
    configuration (a :class:`Config`, or a dict of every key) instead.

    A dict that chooses no solvers (no key of :data:`SOLVER_KEYS`) changes the default preset,
    as overrides do: ``HRockmate(..., config={"cost_model": "flops"})`` is the default preset
    with FLOP costs (from Config's bare defaults it would be another set of solvers, much
    slower to solve). A dict that chooses solvers, or names every key
    (``Config.to_dict()``), is a configuration of its own, from those bare defaults. A ``base``
    key says which: a preset's name to change that preset, None for the bare defaults. A YAML
    file given by its path is read by the same rule (every preset in configs/ chooses its
    solvers)."""
    if config is None:
        config = "hiremate"
    if isinstance(config, Config):
        base = config
    elif isinstance(config, Mapping):
        base = _from_mapping(config)
    elif isinstance(config, (str, Path)):
        text = str(config)
        preset = PRESET_DIR / f"{text}.yaml"
        if preset.is_file() and "/" not in text and not text.endswith((".yaml", ".yml")):
            base = Config.load(preset)
        elif Path(text).is_file():
            base = _from_mapping(_read_yaml(text))
        else:
            raise ConfigError(f"unknown preset {text!r} (and no such file); presets: "
                              f"{', '.join(preset_names())}")
    else:
        raise ConfigError(f"config must be a preset name, a path, a dict or a Config, got "
                          f"{type(config).__name__}")
    if isinstance(overrides.get("solver_params"), Mapping):
        overrides["solver_params"] = merge_mappings(base.solver_params,
                                                    overrides["solver_params"])
    return base.replace(**overrides) if overrides else base.replace()


#: the keys that choose solvers: a dict naming one of them is a configuration of its own
SOLVER_KEYS = ("partitioner", "flat", "bottom", "middle", "middle_flat", "top", "sequence_top",
               "polish", "refine")


def _read_yaml(path: str | Path) -> Any:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read a configuration from {path}: {exc}") from exc
    return {} if data is None else data


def _from_mapping(data: Mapping[str, Any]) -> Config:
    """A dict's or a file's configuration (see :func:`load_config`): the bare defaults under
    its keys when it chooses solvers, names every key or says ``base: None``; else the preset
    its ``base`` names (the default preset when it names none) under its keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a configuration must be a mapping, got {type(data).__name__}")
    data = dict(data)
    whole = (any(k in data for k in SOLVER_KEYS)
             or all(f.name in data for f in dataclasses.fields(Config)))
    base = data.pop("base", None if whole else "hiremate")
    if base is None:
        return Config.from_dict(data)
    if not isinstance(base, str) or not (PRESET_DIR / f"{base}.yaml").is_file():
        raise ConfigError(f"the configuration's base must be a preset name or None, got "
                          f"{base!r}; presets: {', '.join(preset_names())}")
    return load_config(base, **data)


def merge_mappings(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, mappings merged key by key at every depth, other values
    replaced (a value that is not a mapping is kept as it is, for :class:`Config`'s checks to
    reject where it does not belong)."""
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        both = isinstance(value, Mapping) and isinstance(old, Mapping)
        out[key] = merge_mappings(old, value) if both else value
    return out
