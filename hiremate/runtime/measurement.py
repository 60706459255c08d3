"""The measurement harness: peak activation memory and time of one forward+backward.

Every method (eager PyTorch, hiremate, ``torch.utils.checkpoint``, torch.compile's
``activation_memory_budget``) is measured by this one function, so that their figures compare.

What is measured (docs/design.md, "Budgets, and the real peak"): the peak of the bytes allocated during one
forward+backward, above what was allocated before the forward, *not counting parameter
gradients* (parameters are allocated before the forward, so they never count). This is the
quantity the simulator predicts and a budget bounds. Gradients of user inputs that require grad
*are* counted, as in the simulator (``DataKind.INPUT_GRAD`` is budgeted).

How parameter gradients are left out: before each run every parameter's ``.grad`` is set to
None, so autograd allocates each gradient afresh during backward. After backward the storage
address of each parameter's ``.grad`` is known; the allocation at that address that is still
alive at the end of the run *is* that gradient, and it is left out of the running sum from the
moment it was allocated (the backward op that produced it wrote straight into the gradient, so
it was never activation memory). The allocations come, with their addresses:

- on CPU, from the profiler with ``profile_memory=True``: the allocation events of its
  event tree (``kineto_results.experimental_event_tree()``) carry the pointer and the size;
- on CUDA, from the caching allocator's history (``torch.cuda.memory._record_memory_history``
  and the device trace of ``torch.cuda.memory._snapshot()``: ``alloc`` / ``free_completed``).

When those private interfaces are missing (another torch version), a fallback with no addresses
is used and named in ``Measurement.method``: every parameter gets a zero ``.grad`` before the
run, so that autograd accumulates into it in place and allocates no lasting gradient, and the
peak comes from the profiler's byte totals (CPU) or ``max_memory_allocated`` (CUDA). That
fallback still counts each incoming parameter gradient for the short time between the backward
op that makes it and its accumulation, so it can overstate the peak by up to the largest
parameter gradient.

Timing: ``warmup`` untimed runs, then ``repeats`` timed runs *without* any memory
instrumentation (the profiler slows CPU ops several times over), then ``repeats`` instrumented
runs, one memory figure each. ``time`` is the median of the timed runs, ``peak`` the largest of
the memory figures. CUDA timings synchronise the device before and after each run. The cyclic
garbage collector is paused during the timed runs (as ``timeit`` does), and no
``gc.collect()`` is forced between runs: it costs most of a second once torch is imported, and
the memory figure does not need it, since it only counts blocks allocated during the run.

``measure`` leaves the user's state as it found it: the ``.grad`` of every parameter and input
is saved before the first run and put back after the last one, so nothing accumulates; the
buffers of the modules it can see (``fn``, the module of a bound method, modules among the
arguments: BatchNorm's running statistics) and the global RNG states (dropout) are restored by
:func:`hiremate.runtime.preserve.preserved`, so that measuring a model, or building a wrapper that
calibrates with this function, does not train its statistics. A plain function that closes over
a module hides that module's buffers: wrap the call in ``preserved(module)`` then.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from hiremate.cuda_trace import device_trace, events_from_cuda_trace, record_cuda_history
from hiremate.errors import ConfigError
from hiremate.graphbuilder.untouched import put_back
from hiremate.runtime.preserve import preserved
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)

# Names of the ways a memory figure can be obtained (``Measurement.method``).
CPU_PROFILER = "cpu-profiler"                  # allocation events with addresses
CPU_PROFILER_TOTALS = "cpu-profiler-totals"    # fallback: byte totals, zero-filled grads
CUDA_HISTORY = "cuda-history"                  # caching-allocator trace with addresses
CUDA_PEAK_STATS = "cuda-peak-stats"            # fallback: max_memory_allocated, zero grads


@dataclass(frozen=True, slots=True)
class Measurement:
    """Result of :func:`measure`.

    ``peak``: bytes, the largest of ``peaks``; ``time``: seconds, the median of ``times`` (wall
    time of forward+loss+backward); ``device``: where it ran (e.g. ``"cpu"``, ``"cuda:0"``);
    ``method``: how the memory figures were obtained (see the module docstring).
    """

    peak: int
    time: float
    times: tuple[float, ...]
    peaks: tuple[int, ...]
    device: str
    method: str = ""

    def __str__(self) -> str:
        return (
            f"peak {fmt_bytes(self.peak)}, time {self.time * 1e3:.3f} ms "
            f"(median of {len(self.times)}) on {self.device}"
        )


# --------------------------------------------------------------------------------------------
# pure helpers: the peak of an allocation event stream


def peak_of_events(events: Iterable[tuple[int, int]], excluded: Iterable[int] = ()) -> int:
    """Peak of the running sum of ``(address, bytes)`` events (bytes < 0 for a free).

    An allocation at an address in ``excluded`` that is still alive after the last event is left
    out from the moment it was made (it is a parameter gradient). Frees of allocations made
    before the first event are ignored: the CPU profiler reports them only for blocks it saw
    allocated in an earlier profile, so counting them would make the figure depend on history;
    the peak is therefore that of the memory allocated during the run and still alive. The
    result is never below 0 (the baseline itself).
    """
    events = list(events)
    excluded = set(excluded)
    live: dict[int, int] = {}  # address -> index of the allocation event that made it
    unknown_frees: set[int] = set()  # frees of blocks allocated before the first event
    for i, (addr, nbytes) in enumerate(events):
        if nbytes > 0:
            live[addr] = i
        elif nbytes < 0:
            if live.pop(addr, None) is None:
                unknown_frees.add(i)
    skip = {live[a] for a in excluded if a in live} | unknown_frees
    current = 0
    peak = 0
    for i, (_, nbytes) in enumerate(events):
        if i in skip:
            continue
        current += nbytes
        peak = max(peak, current)
    return peak


# --------------------------------------------------------------------------------------------
# the loss


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in a nested output: tuples, lists, dicts, dataclasses, HF ``ModelOutput``s and
    any other type registered with torch's pytree."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if obj is None or depth > 64 or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if isinstance(obj, Mapping):  # dict, OrderedDict, HF ModelOutput (skips its None fields)
        children: Iterable[Any] = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    else:
        leaves, _ = pytree.tree_flatten(obj)
        if len(leaves) == 1 and leaves[0] is obj:
            return
        children = leaves
    for child in children:
        yield from _tensors(child, depth + 1)


def _loss_attribute(out: Any) -> torch.Tensor | None:
    """``out.loss`` or ``out["loss"]`` when it is a tensor (HF models with labels)."""
    if isinstance(out, torch.Tensor):
        return None
    if isinstance(out, Mapping):
        candidate = out.get("loss")
    else:
        candidate = getattr(out, "loss", None)
    return candidate if isinstance(candidate, torch.Tensor) else None


def loss_of(out: Any, loss_fn: Callable[[Any], torch.Tensor] | None = None) -> torch.Tensor:
    """The scalar to differentiate: ``loss_fn(out)``, else ``out.loss``, else the sum of the
    sums of every floating-point output tensor that requires grad; in a tuple or list where
    some of those are 0-dim beside others (a loss returned with the logits), of the 0-dim ones
    only, as ``HRockmate`` assumes by default (config ``output_gradients``)."""
    if loss_fn is not None:
        loss = loss_fn(out)
        source = "loss_fn(output)"
    else:
        loss = _loss_attribute(out)
        source = "output.loss"
        if loss is None:
            outputs = [t for t in _tensors(out) if t.is_floating_point() and t.requires_grad]
            # a tuple (loss, logits); named outputs without a "loss" entry are summed whole
            scalars = ([t for t in outputs if t.dim() == 0] if not isinstance(out, Mapping)
                       else [])
            terms = [t.sum() for t in (scalars or outputs)]
            if not terms:
                raise ConfigError(
                    f"the output of the measured function ({type(out).__name__}) holds no "
                    "floating-point tensor that requires grad, so there is nothing to run "
                    "backward on; pass loss_fn=... that turns the output into a scalar loss, "
                    "or make sure the model has trainable parameters or an input with "
                    "requires_grad=True"
                )
            loss = terms[0]
            for term in terms[1:]:
                loss = loss + term
            return loss
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else (
            type(loss).__name__)
        raise ConfigError(
            f"{source} is {what}, not a scalar tensor; pass loss_fn=... that returns a scalar "
            "(e.g. loss_fn=lambda out: out.mean())"
        )
    if not loss.requires_grad:
        raise ConfigError(
            f"{source} does not require grad, so backward cannot run; check that the model has "
            "trainable parameters or an input with requires_grad=True"
        )
    return loss


# --------------------------------------------------------------------------------------------
# the state measure must leave untouched


class _GradState:
    """Parameters and inputs whose ``.grad`` each run resets, and that are restored at the end.

    Parameters: those of ``fn`` (or of the module a bound method belongs to), of modules among
    the arguments, and ``nn.Parameter``s among the arguments. Their gradients are not counted.
    Inputs: the other leaf tensors among the arguments that require grad; their gradients count.
    """

    def __init__(self, fn: Any, arg_leaves: list[Any]):
        modules = [m for m in (fn, getattr(fn, "__self__", None)) if isinstance(m, nn.Module)]
        modules += [a for a in arg_leaves if isinstance(a, nn.Module)]
        params: dict[int, torch.Tensor] = {}
        for module in modules:
            for p in module.parameters():
                params.setdefault(id(p), p)
        inputs: dict[int, torch.Tensor] = {}
        for a in arg_leaves:
            if isinstance(a, nn.Parameter):
                params.setdefault(id(a), a)
            elif isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad:
                inputs.setdefault(id(a), a)
        self.modules = modules
        self.params = list(params.values())
        self.inputs = [t for k, t in inputs.items() if k not in params]
        self._saved = [t.grad for t in self.params + self.inputs]

    def clear(self) -> None:
        for t in self.params + self.inputs:
            t.grad = None

    def zero_params(self) -> None:
        """Zero-filled parameter grads, for the fallback that accumulates in place."""
        for p in self.params:
            p.grad = torch.zeros_like(p)

    def param_grad_addresses(self) -> set[int]:
        return {
            p.grad.untyped_storage().data_ptr() for p in self.params if p.grad is not None
        }

    def restore(self) -> None:
        for t, g in zip(self.params + self.inputs, self._saved):
            t.grad = g


def _detach_nonleaf(obj: Any) -> Any:
    """Non-leaf tensors that require grad become leaves, so that every run can backward (the
    graph that made them is freed by the first backward)."""
    if isinstance(obj, torch.Tensor) and obj.requires_grad and not obj.is_leaf:
        log.debug("measure: a non-leaf input tensor is detached into a leaf that requires grad")
        return obj.detach().requires_grad_(True)
    return obj


def _resolve_device(
    modules: list[nn.Module], tensors: list[torch.Tensor], device: Any
) -> torch.device:
    """Explicit ``device``, else that of the first parameter or buffer, else of the first tensor
    argument, else the CPU."""
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"device={device!r} is not a torch device ({exc})") from exc
    else:
        dev = None
        for module in modules:
            for t in module.parameters():
                dev = t.device
                break
            if dev is None:
                for t in module.buffers():
                    dev = t.device
                    break
            if dev is not None:
                break
        if dev is None:
            dev = tensors[0].device if tensors else torch.device("cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {dev} was asked for, but this torch has no usable CUDA device; pass "
            "device='cpu' or leave device unset to take it from the model"
        )
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(
            f"measure supports CPU and CUDA devices, not {dev}; move the model and inputs to "
            "'cpu' or 'cuda', or pass device='cpu' to measure its host-side allocations"
        )
    return dev


# --------------------------------------------------------------------------------------------
# one run, timed or instrumented


def _forward_backward(fn: Callable, args: tuple, kwargs: dict, loss_fn: Callable | None) -> None:
    with torch.enable_grad():
        out = fn(*args, **kwargs)
        loss = loss_of(out, loss_fn)
        loss.backward()
    del out, loss  # free the activations before the next run


def _cpu_profile() -> Any:
    """A CPU profile that records allocations (use it as a context manager).

    The autograd profiler that ``torch.profiler.profile`` wraps: the wrapper's start imports
    ``torch._inductor`` (seconds, once per process) only to read a CUDA-graph setting. Its
    native side prints a line to the console when it starts and when it stops; those go to
    the debug log (:class:`hiremate.quiet.QuietContext`).
    """
    from hiremate.quiet import QuietContext

    return QuietContext(torch.autograd.profiler.profile(use_kineto=True, use_cpu=True,
                                                        profile_memory=True), "torch profiler")


@functools.cache
def _cpu_addresses_available() -> bool:
    """Whether the profiler's event tree gives allocation addresses on this torch."""
    try:
        with _cpu_profile() as prof:
            probe = torch.empty(1024, dtype=torch.uint8)
            address = probe.untyped_storage().data_ptr()
            del probe
        events = _cpu_allocation_events(prof)
    except Exception as exc:  # any failure of a private API means: use the fallback
        log.info("measure: profiler allocation addresses unavailable (%s); using totals", exc)
        return False
    return (address, 1024) in events and (address, -1024) in events


def _cpu_allocation_events(prof: Any) -> list[tuple[int, int]]:
    """``(address, bytes)`` CPU allocation events of a finished profile, in time order."""
    from torch._C._profiler import _EventType

    tree = prof.kineto_results.experimental_event_tree()
    from hiremate.graphbuilder.costs.memory import walk_events

    allocations = [n for n in walk_events(tree) if n.tag == _EventType.Allocation]
    events = []
    for n in sorted(allocations, key=lambda n: n.start_time_ns):  # stable: ties keep tree order
        fields = n.extra_fields
        if torch.device(fields.device).type == "cpu" and fields.alloc_size != 0:
            events.append((int(fields.ptr), int(fields.alloc_size)))
    return events


def _cpu_total_deltas(prof: Any) -> list[int]:
    """Fallback: CPU ``[memory]`` byte deltas, with no usable addresses."""
    return [
        int(e.nbytes()) for e in prof.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]


def _peak_of_deltas(deltas: Iterable[int]) -> int:
    current = peak = 0
    for nbytes in deltas:
        current += nbytes
        peak = max(peak, current)
    return peak


def _cpu_peak(run: Callable[[], None], grads: _GradState) -> tuple[int, str]:
    with_addresses = _cpu_addresses_available()
    grads.clear()
    if not with_addresses:
        grads.zero_params()
    with _cpu_profile() as prof:
        run()
    if with_addresses:
        return peak_of_events(_cpu_allocation_events(prof), grads.param_grad_addresses()), (
            CPU_PROFILER)
    return _peak_of_deltas(_cpu_total_deltas(prof)), CPU_PROFILER_TOTALS


def _cuda_peak(run: Callable[[], None], grads: _GradState, device: torch.device) -> tuple[int, str]:
    grads.clear()
    torch.cuda.synchronize(device)
    try:
        record_cuda_history(device, True)
    except Exception as exc:  # private API missing or failing: use the allocator statistics
        log.info("measure: CUDA memory history unavailable (%s); using peak statistics", exc)
    else:
        try:
            run()
            torch.cuda.synchronize(device)
            trace = device_trace(device)
        finally:
            record_cuda_history(device, False)
        events = events_from_cuda_trace(trace)
        return peak_of_events(events, grads.param_grad_addresses()), CUDA_HISTORY
    grads.zero_params()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - base), CUDA_PEAK_STATS


# --------------------------------------------------------------------------------------------
# the harness


def measure(
    fn: Callable[..., Any],
    *args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> Measurement:
    """Peak activation memory and time of ``loss_of(fn(*args, **kwargs)).backward()``.

    ``fn`` is any callable: an ``nn.Module``, a hiremate module, a ``torch.compile``'d module, a
    function. The loss is ``loss_fn(out)`` if given, else ``out.loss`` when it is a tensor, else
    the sum of every floating-point output tensor that requires grad. ``device`` overrides the
    device found from the parameters and arguments. Raises :class:`ConfigError` on bad
    arguments or an output with nothing to differentiate.
    """
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ConfigError(f"warmup must be an integer >= 0, got {warmup!r}")
    if not callable(fn):
        raise ConfigError(f"measure needs a callable (a module or a function), got {type(fn)}")
    if loss_fn is not None and not callable(loss_fn):
        raise ConfigError(f"loss_fn must be callable, got {type(loss_fn).__name__}")

    args, kwargs = pytree.tree_map(_detach_nonleaf, (args, kwargs))
    arg_leaves = list(args) + list(kwargs.values())
    arg_leaves += [t for t in _tensors((args, kwargs)) if not any(t is a for a in arg_leaves)]
    grads = _GradState(fn, arg_leaves)
    dev = _resolve_device(
        grads.modules, [a for a in arg_leaves if isinstance(a, torch.Tensor)], device
    )
    cuda = dev.type == "cuda"
    # a forward that writes into an input that needs no gradient (x /= 255) would see another
    # input at each run, and leave the caller's changed: each run's write is put back, from a
    # copy in host memory (on a GPU, none of the device's)
    written = getattr(fn, "written_parameters", None)  # a hiremate module's, max_norm's
    kept = [(t, t.detach().to("cpu", copy=True), t._version) for t in [
        *(t for t in _tensors((args, kwargs)) if not t.requires_grad),
        *(written() if callable(written) else ())]]

    def run() -> None:
        _forward_backward(fn, args, kwargs, loss_fn)
        for t, copy, version in kept:
            if t._version != version:
                put_back(t, copy, version)

    times: list[float] = []
    peaks: list[int] = []
    method = ""
    with preserved(*grads.modules):
        try:
            for _ in range(warmup):
                grads.clear()
                run()
            gc_was_enabled = gc.isenabled()
            gc.disable()  # as timeit does: a cyclic collection would land in a random run
            try:
                for _ in range(repeats):
                    grads.clear()
                    if cuda:
                        torch.cuda.synchronize(dev)
                    start = time.perf_counter()
                    run()
                    if cuda:
                        torch.cuda.synchronize(dev)
                    times.append(time.perf_counter() - start)
            finally:
                if gc_was_enabled:
                    gc.enable()
            for _ in range(repeats):
                peak, method = _cuda_peak(run, grads, dev) if cuda else _cpu_peak(run, grads)
                peaks.append(peak)
        finally:
            grads.restore()

    result = Measurement(
        peak=max(peaks), time=statistics.median(times), times=tuple(times), peaks=tuple(peaks),
        device=str(dev), method=method,
    )
    log.debug("measure(%s): %s [%s]", type(fn).__name__, result, method)
    return result


def loss_memory(model: Any, sample: Any, loss_fn: Callable[[Any], torch.Tensor],
                output_grad_bytes: int) -> int:
    """What ``loss_fn`` allocates at its peak between a forward and its backward, beyond the
    gradients of the model's outputs (``output_grad_bytes``, which a graph counts itself):
    the loss run for real on the model's outputs (from a forward without autograd) and
    differentiated back to them, measured as :func:`measure` measures a step."""
    from hiremate.graphbuilder.capture import normalise_sample

    args, kwargs = normalise_sample(sample)
    with torch.no_grad():
        out = model(*args, **kwargs)
    flat, spec = pytree.tree_flatten(out)
    where = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not where:
        raise ConfigError("the model's output holds no floating-point tensor for loss_fn to "
                          "differentiate; pass a loss_fn that matches the model's output")
    leaves = [flat[i].detach().clone().requires_grad_() for i in where]
    del out

    def outputs(*tensors: torch.Tensor) -> Any:
        values = list(flat)
        for i, t in zip(where, tensors):
            values[i] = t
        return pytree.tree_unflatten(values, spec)

    peak = measure(outputs, *leaves, loss_fn=loss_fn, repeats=1, warmup=1).peak
    return max(0, peak - output_grad_bytes)
