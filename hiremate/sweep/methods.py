"""The methods a sweep compares, each measured with the one harness (:func:`hiremate.measure`).

- ``eager``: the model as it is (the reference of every fraction and relative time);
- ``checkpoint``: ``torch.utils.checkpoint`` (``use_reentrant=False``) around each repeated
  block, found by :func:`find_blocks`;
- ``checkpoint_sequential``: ``torch.utils.checkpoint.checkpoint_sequential`` with
  ``round(sqrt(n))`` segments, for models that are an ``nn.Sequential`` or that compute exactly
  what ``nn.Sequential(*children)`` computes on the sample (checked); otherwise
  :class:`NotApplicable`;
- ``compile``: ``torch.compile`` with ``torch._functorch.config.activation_memory_budget`` set to
  the budget's fraction of the eager peak (``aot_eager_decomp_partition`` on CPU, ``inductor``
  on CUDA), its compile time taken as its solve time;
- any hiremate preset (``configs/*.yaml``): :class:`hiremate.HRockmate` with the budget in bytes,
  the loss run outside the module as for every other method; ``<preset>+loss``: the same with
  the loss captured into the graph (``loss_fn=zoo.output_loss``), so that the solvers may free
  and recompute what the loss holds.

Why these peers: they are what a user would pick instead of hiremate, and measuring them with
the same harness on the same models is the only fair comparison.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hiremate.errors import ConfigError, SolverError
from hiremate.runtime.measurement import Measurement, measure
from hiremate.sweep.spec import PEERS, SweepSpec, preset_of
from hiremate.zoo import output_loss, split_sample

log = logging.getLogger(__name__)


class NotApplicable(Exception):
    """The method cannot run on this model (e.g. ``checkpoint_sequential`` on a non-chain)."""


@dataclass
class MethodResult:
    """What one method gives for one cell, before the runner adds budget and reference facts."""

    measurement: Measurement
    solve_time: float | None = None       # hiremate: solving; compile: compilation
    setup_time: float | None = None       # wall time to get the callable (capture included)
    predicted_peak: int | None = None
    predicted_time: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def returned_loss(output: Any) -> Any:
    """The loss of a module that returns it (a hiremate module with its loss captured)."""
    return output


def measure_sample(fn: Any, sample: Any, spec: SweepSpec,
                   loss_fn: Any = output_loss) -> Measurement:
    """``measure`` of ``fn`` on ``sample`` with the zoo's loss (``loss_fn``: how ``fn``'s
    output becomes it) and the sweep's repeats."""
    args, kwargs = split_sample(sample)
    return measure(fn, *args, loss_fn=loss_fn, repeats=spec.repeats, warmup=spec.warmup,
                   **kwargs)


def paired_time_ratio(fn: Any, twin: Any, sample: Any, spec: SweepSpec,
                      loss_fn: Any = output_loss) -> dict[str, float]:
    """Time of ``fn`` relative to eager ``twin`` (an untouched copy of the model), measured in
    alternation: ``repeats`` rounds of one iteration of each; the ratio of the fastest round of
    each (the medians are kept too).

    Why: on a shared machine the load changes from one cell to the next, so a ratio against an
    eager time measured minutes earlier says more about the load than about the method.
    Alternating within one cell puts both sides under the same load. Contention only ever adds
    time (a stalled thread, a descheduled process), so the fastest of several iterations is the
    least disturbed figure of each side; medians, even paired, still moved a lot between cells
    running the same schedule (docs/sweeps.md, "The sweep file")."""
    args, kwargs = split_sample(sample)
    one = dict(repeats=1, warmup=0)
    measure(twin, *args, loss_fn=output_loss, **one, **kwargs)  # warm the twin (allocator)
    ours, theirs = [], []
    for _ in range(max(spec.repeats, 3)):
        ours.append(measure(fn, *args, loss_fn=loss_fn, **one, **kwargs).time)
        theirs.append(measure(twin, *args, loss_fn=output_loss, **one, **kwargs).time)
    ours.sort()
    theirs.sort()
    med_ours, med_theirs = ours[len(ours) // 2], theirs[len(theirs) // 2]
    best_ours, best_theirs = ours[0], theirs[0]
    return {"paired_time": best_ours, "paired_eager_time": best_theirs,
            "time_rel_paired": best_ours / best_theirs if best_theirs > 0 else math.nan,
            "paired_time_median": med_ours, "paired_eager_time_median": med_theirs,
            "time_rel_paired_median": med_ours / med_theirs if med_theirs > 0 else math.nan}


# --------------------------------------------------------------------------------------------
# torch.utils.checkpoint around blocks


class CheckpointedBlock(nn.Module):
    """``inner`` run under ``torch.utils.checkpoint`` (non-reentrant: kwargs and any output)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """The block's own attributes show through (``nn.TransformerEncoder`` reads
        ``layers[0].self_attn``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The containers whose children are the repeated blocks: ``(qualified name, container)``.

    Candidates are the ``nn.ModuleList`` and ``nn.Sequential`` below the root with at least two
    children. The one holding the most parameters wins (ties: more children); every other
    candidate with as many children that is neither inside nor around a chosen one joins it (an
    ``nn.Transformer``'s encoder and decoder layers, a UNet's down and up paths). With no
    candidate the root itself is returned: its top-level children are the blocks.
    """
    candidates = [(name, mod) for name, mod in model.named_modules()
                  if name and isinstance(mod, (nn.ModuleList, nn.Sequential)) and len(mod) >= 2]
    if not candidates:
        return [("", model)]
    best_name, best = max(candidates, key=lambda c: (_n_params(c[1]), len(c[1])))
    chosen = [(best_name, best)]

    def related(a: str, b: str) -> bool:
        return a == b or a.startswith(b + ".") or b.startswith(a + ".")

    for name, mod in candidates:
        if len(mod) == len(best) and not any(related(name, c) for c, _ in chosen):
            chosen.append((name, mod))
    return chosen


def wrap_blocks(model: nn.Module) -> list[str]:
    """Put every block of :func:`find_blocks` under :class:`CheckpointedBlock`, in place;
    returns the qualified names of the wrapped blocks."""
    wrapped = []
    for name, container in find_blocks(model):
        for child_name, child in list(container.named_children()):
            if isinstance(child, CheckpointedBlock):
                continue
            if isinstance(container, (nn.ModuleList, nn.Sequential)):
                container[int(child_name)] = CheckpointedBlock(child)
            else:
                setattr(container, child_name, CheckpointedBlock(child))
            wrapped.append(f"{name}.{child_name}" if name else child_name)
    return wrapped


# --------------------------------------------------------------------------------------------
# checkpoint_sequential


class SequentialCheckpoint(nn.Module):
    """``checkpoint_sequential`` of ``seq`` in ``segments`` segments, as a module (so that the
    harness finds its parameters and leaves their gradients out)."""

    def __init__(self, seq: nn.Sequential, segments: int):
        super().__init__()
        self.seq = seq
        self.segments = segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint_sequential

        return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)


def as_sequential(model: nn.Module, sample: Any) -> nn.Sequential:
    """``model`` as an ``nn.Sequential`` of its children, or :class:`NotApplicable`."""
    args, kwargs = split_sample(sample)
    if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor):
        raise NotApplicable("checkpoint_sequential needs a model called on one tensor")
    if isinstance(model, nn.Sequential):
        return model
    children = list(model.children())
    if len(children) < 2:
        raise NotApplicable(f"{type(model).__name__} has fewer than two children to chain")
    seq = nn.Sequential(*children)
    try:
        with torch.no_grad():
            same = _same_output(model(args[0]), seq(args[0]))
    except Exception as exc:  # the children do not chain: shapes or types mismatch
        raise NotApplicable(f"{type(model).__name__}'s children do not chain ({exc})") from None
    if not same:
        raise NotApplicable(f"{type(model).__name__} does not compute the chain of its children")
    return seq


def _same_output(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and torch.equal(a, b))


# --------------------------------------------------------------------------------------------
# the methods


def run_eager(model: nn.Module, sample: Any, spec: SweepSpec) -> MethodResult:
    return MethodResult(measurement=measure_sample(model, sample, spec), setup_time=0.0)


def _paired(fn: Any, twin: Any, sample: Any, spec: SweepSpec,
            loss_fn: Any = output_loss) -> dict[str, float]:
    return {} if twin is None else paired_time_ratio(fn, twin, sample, spec, loss_fn)


def run_checkpoint(model: nn.Module, sample: Any, spec: SweepSpec,
                   twin: nn.Module | None = None) -> MethodResult:
    start = time.perf_counter()
    wrapped = wrap_blocks(model)
    setup = time.perf_counter() - start
    m = measure_sample(model, sample, spec)
    return MethodResult(measurement=m, setup_time=setup,
                        extra={"blocks": len(wrapped), "wrapped": ",".join(wrapped[:8]),
                               **_paired(model, twin, sample, spec)})


def run_checkpoint_sequential(model: nn.Module, sample: Any, spec: SweepSpec,
                              twin: nn.Module | None = None) -> MethodResult:
    seq = as_sequential(model, sample)
    segments = max(1, round(math.sqrt(len(seq))))
    fn = SequentialCheckpoint(seq, segments)
    m = measure_sample(fn, sample, spec)
    return MethodResult(measurement=m, setup_time=0.0,
                        extra={"segments": segments, **_paired(fn, twin, sample, spec)})


def compile_backend(spec: SweepSpec, model: nn.Module) -> str:
    """The sweep's ``compile_backend``, else inductor on CUDA, aot_eager_decomp_partition else."""
    if spec.compile_backend:
        return spec.compile_backend
    on_cuda = any(p.is_cuda for p in model.parameters())
    return "inductor" if on_cuda else "aot_eager_decomp_partition"


def run_compile(model: nn.Module, sample: Any, spec: SweepSpec, fraction: float,
                twin: nn.Module | None = None) -> MethodResult:
    """torch.compile with ``activation_memory_budget = fraction`` (clipped to (0, 1]); the
    first forward+backward (where compilation happens) is timed as the solve time."""
    import torch._dynamo
    import torch._functorch.config as functorch_config

    fraction = min(1.0, max(1e-6, fraction))
    backend = compile_backend(spec, model)
    torch._dynamo.reset()
    try:
        with functorch_config.patch(activation_memory_budget=fraction):
            compiled = torch.compile(model, backend=backend)
            args, kwargs = split_sample(sample)
            graphs = _compiled_graphs()
            start = time.perf_counter()
            with torch.enable_grad():
                output_loss(compiled(*args, **kwargs)).backward()
            compile_time = time.perf_counter() - start
            first = _compiled_graphs() - graphs
            if first == 0:
                raise SolverError(
                    "torch.compile compiled no graph of the model (dynamo ran it eagerly), so "
                    "this cell would measure eager PyTorch as compile's; run with "
                    "TORCH_LOGS=recompiles,graph_breaks to see why")
            model.zero_grad(set_to_none=True)
            m = measure_sample(compiled, sample, spec)
            paired = _paired(compiled, twin, sample, spec)
            again = _compiled_graphs() - graphs - first
    finally:
        torch._dynamo.reset()
    if again:  # the timed calls compiled too: their time is not compile's steady state
        log.warning("torch.compile recompiled the model %d time(s) after its first step; "
                    "the cell's times include compilation", again)
    return MethodResult(measurement=m, solve_time=compile_time, setup_time=compile_time,
                        extra={"compile_backend": backend, "activation_memory_budget": fraction,
                               "compiled_graphs": first, "recompiled_graphs": again,
                               **paired})


def _compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (its counter survives ``reset``)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_hiremate(model: nn.Module, sample: Any, spec: SweepSpec, method: str,
                 budget: int, twin: nn.Module | None = None,
                 graph: Any = None) -> MethodResult:
    """:class:`hiremate.HRockmate` with the method's preset and the sweep's overrides, on
    ``graph`` when the sweep captured one for the model (else it captures its own; always for
    ``<preset>+loss``); raises :class:`hiremate.InfeasibleBudgetError` when no schedule fits."""
    from hiremate.api import HRockmate

    preset, captured = preset_of(method)
    start = time.perf_counter()
    if captured:  # the model's graph holds no loss: this one captures the model and its loss
        module = HRockmate(model, sample, budget, config=preset, loss_fn=output_loss,
                           **spec.hiremate_overrides)
    elif graph is not None:
        module = HRockmate.from_graph(model, graph, budget, config=preset, sample=sample,
                                      loss_fn=output_loss, capture_loss=False,
                                      **spec.hiremate_overrides)
    else:
        # the loss runs outside, as it does for every other method the sweep times
        module = HRockmate(model, sample, budget, config=preset, loss_fn=output_loss,
                           capture_loss=False, **spec.hiremate_overrides)
    setup = time.perf_counter() - start
    report = module.report()
    loss_fn = returned_loss if captured else output_loss
    m = measure_sample(module, sample, spec, loss_fn)
    extra = {k: report[k] for k in ("autodiff_peak", "autodiff_time", "path", "winner",
                                    "loss_captured")
             if k in report and isinstance(report[k], (int, float, str))}
    extra.update(_paired(module, twin, sample, spec, loss_fn))
    return MethodResult(
        measurement=m, solve_time=float(report.get("solve_time", setup)), setup_time=setup,
        predicted_peak=_int_or_none(report.get("predicted_peak")),
        predicted_time=_float_or_none(report.get("predicted_time")), extra=extra)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def run_method(method: str, model: nn.Module, sample: Any, spec: SweepSpec, budget: int | None,
               fraction: float | None, twin: nn.Module | None = None,
               graph: Any = None) -> MethodResult:
    """Dispatch ``method`` (a peer or a hiremate preset) on a fresh ``model``; ``twin`` (an
    untouched copy) times eager in alternation with the method (:func:`paired_time_ratio`);
    ``graph``: the model's graph captured once for the sweep (hiremate presets only)."""
    if method == "eager":
        return run_eager(model, sample, spec)
    if method == "checkpoint":
        return run_checkpoint(model, sample, spec, twin)
    if method == "checkpoint_sequential":
        return run_checkpoint_sequential(model, sample, spec, twin)
    if budget is None or fraction is None:
        raise ConfigError(f"method {method!r} needs a budget; give the sweep's budgets, or "
                          "use a method that runs without one (eager, checkpoint, "
                          "checkpoint_sequential)")
    if method == "compile":
        return run_compile(model, sample, spec, fraction, twin)
    assert method not in PEERS
    return run_hiremate(model, sample, spec, method, budget, twin, graph)
