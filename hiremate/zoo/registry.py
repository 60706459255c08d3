"""The zoo's registry: one :class:`ModelSpec` per model name, and :func:`get` that builds one.

Builders are plain functions ``build(layers, width, batch) -> (model, sample)`` that create
their tensors in float32; :func:`get` fills in the defaults, checks the arguments, seeds the
random generator in a private context (so that two calls give identical weights and samples
and the caller's random state is left untouched) and converts the model and the floating
tensors of the sample to the requested dtype. Keeping those concerns here means a builder only
says what its model is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hiremate.errors import ConfigError

logger = logging.getLogger(__name__)

Sample = torch.Tensor | tuple[Any, ...] | dict[str, Any]
Builder = Callable[..., tuple[torch.nn.Module, Sample]]

SEED = 0
SCALE_ARGS = ("layers", "width", "batch")


@dataclass(frozen=True)
class ModelSpec:
    """What the zoo knows about one model: how to build it and what its arguments mean.

    ``defaults`` maps each scale argument that applies (``layers``, ``width``, ``batch``) to its
    default; an argument absent from it does not apply and is refused. ``meaning`` says in
    words what each argument scales (shown in errors and in :func:`describe`).
    ``width_multiple`` is the number the width must be a multiple of (e.g. the head count).
    ``stage_layers`` says that ``layers`` may also be a tuple of per-stage depths.
    """

    name: str
    build: Builder
    summary: str
    defaults: dict[str, int]
    meaning: dict[str, str] = field(default_factory=dict)
    width_multiple: int = 1
    min_width: int = 1
    stage_layers: bool = False


_REGISTRY: dict[str, ModelSpec] = {}


def register(
    name: str,
    summary: str,
    defaults: dict[str, int],
    meaning: dict[str, str] | None = None,
    width_multiple: int = 1,
    min_width: int = 1,
    stage_layers: bool = False,
) -> Callable[[Builder], Builder]:
    """Register the decorated builder under ``name`` (a name may be registered once)."""

    def decorate(build: Builder) -> Builder:
        if name in _REGISTRY:
            raise ConfigError(f"zoo model {name!r} is registered twice; give the new model "
                              "another name")
        unknown = set(defaults) - set(SCALE_ARGS)
        if unknown:
            raise ConfigError(f"zoo model {name!r}: unknown scale arguments {sorted(unknown)}; "
                              f"the scale arguments are {', '.join(SCALE_ARGS)}")
        _REGISTRY[name] = ModelSpec(
            name=name,
            build=build,
            summary=summary,
            defaults=dict(defaults),
            meaning=dict(meaning or {}),
            width_multiple=width_multiple,
            min_width=min_width,
            stage_layers=stage_layers,
        )
        return build

    return decorate


def names() -> list[str]:
    """The names :func:`get` accepts, sorted."""
    return sorted(_REGISTRY)


def spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``name``; raises :class:`ConfigError` for an unknown name."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown zoo model {name!r}; valid names are: {', '.join(names())}"
        ) from None


def describe(name: str) -> str:
    """One line per scale argument of ``name``: its default and what it scales."""
    s = spec(name)
    lines = [f"{s.name}: {s.summary}"]
    for arg, default in s.defaults.items():
        lines.append(f"  {arg} (default {default}): {s.meaning.get(arg, '')}".rstrip())
    return "\n".join(lines)


def _check_int(name: str, arg: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"zoo model {name!r}: {arg} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def resolve_args(name: str, **given: Any) -> dict[str, Any]:
    """Defaults filled in and values checked; raises :class:`ConfigError` on a bad argument.

    An argument passed as ``None`` takes its default. An argument that the model has no use
    for is refused rather than ignored, so a sweep never silently runs the same model twice.
    """
    s = spec(name)
    out: dict[str, Any] = {}
    for arg in SCALE_ARGS:
        value = given.get(arg)
        if arg not in s.defaults:
            if value is not None:
                applicable = ", ".join(s.defaults) or "none"
                raise ConfigError(
                    f"zoo model {name!r} takes no {arg!r} argument (it applies to: "
                    f"{applicable}); valid names are: {', '.join(names())}"
                )
            continue
        if value is None:
            out[arg] = s.defaults[arg]
            continue
        if arg == "layers" and s.stage_layers and isinstance(value, (tuple, list)):
            # Per-stage depths (e.g. ResNet-50's (3, 4, 6, 3)); the builder checks the length.
            out[arg] = tuple(_check_int(name, "each entry of layers", v, 1) for v in value)
            continue
        minimum = s.min_width if arg == "width" else 1
        out[arg] = _check_int(name, arg, value, minimum)
        if arg == "width" and value % s.width_multiple:
            raise ConfigError(
                f"zoo model {name!r}: width must be a multiple of {s.width_multiple} "
                f"(the number of heads or groups), got {value}"
            )
    return out


def _convert(sample: Any, dtype: torch.dtype) -> Any:
    """Floating tensors of ``sample`` cast to ``dtype``; integer tensors (token ids) kept."""
    if isinstance(sample, torch.Tensor):
        return sample.to(dtype) if sample.is_floating_point() else sample
    if isinstance(sample, tuple):
        return tuple(_convert(v, dtype) for v in sample)
    if isinstance(sample, dict):
        return {k: _convert(v, dtype) for k, v in sample.items()}
    return sample


def get(
    name: str,
    layers: int | tuple[int, ...] | None = None,
    width: int | None = None,
    batch: int | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.nn.Module, Sample]:
    """Build zoo model ``name`` and a sample input for it; see :mod:`hiremate.zoo`."""
    args = resolve_args(name, layers=layers, width=width, batch=batch)
    dtype = torch.float32 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(
            f"zoo model {name!r}: dtype must be a floating torch.dtype "
            f"(e.g. torch.float32, torch.float64), got {dtype!r}"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model, sample = spec(name).build(**args)
    model = model.to(dtype)
    sample = _convert(sample, dtype)
    logger.debug("zoo %s %s: %d parameters", name, args,
                 sum(p.numel() for p in model.parameters()))
    return model, sample


def split_sample(sample: Sample) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` to call a model with ``sample`` (a tensor, tuple or dict)."""
    if isinstance(sample, dict):
        return (), dict(sample)
    if isinstance(sample, tuple):
        return sample, {}
    return (sample,), {}


def output_loss(output: Any) -> torch.Tensor:
    """A scalar that depends on every element of every floating tensor of a model's output.

    Works on tensors, tuples, lists, dicts and Hugging Face ``ModelOutput`` objects (which are
    dicts). Each tensor contributes ``mean(t * w)`` with fixed weights ``w`` going linearly from
    -1 to 1 over its elements: a plain sum or mean would be constant on a LayerNorm output
    (``nn.Transformer`` ends with one) and so give zero gradients everywhere, which no
    gradient test could tell from a broken backward.
    """
    tensors = [t for t in _leaves(output) if t.is_floating_point()]
    if not tensors:
        raise ConfigError("the model's output holds no floating tensor to build a loss from")
    total = None
    for t in tensors:
        w = torch.linspace(-1.0, 1.0, t.numel(), dtype=t.dtype, device=t.device)
        term = (t * w.reshape(t.shape)).mean()
        total = term if total is None else total + term
    return total


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _leaves(v)]
    return []
