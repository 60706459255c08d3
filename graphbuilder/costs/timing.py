"""Measured op times that hold still when the machine is busy.

Every unique op signature (op, shapes, dtypes, strides, constants) is timed, and the nodes that
share a signature share its time. The timing is *interleaved*: a round times each signature once
(the fastest of a few back-to-back calls), and the time kept is the minimum over the rounds. A
burst of load from another process then spoils one round of some signatures, not all samples of
one, and the minimum (the run the scheduler left alone) is what the op costs on a quiet machine.
On a GPU the samples are CUDA events around the call, its launches hidden behind a spinning
kernel, so that a sample is the op's kernels' time. On the CPU with one intra-op thread the
samples are the calling thread's CPU time (:func:`cpu_clock`): a core shared with another
process for the whole build then costs nothing, where wall time would grow with the load.
"""

from __future__ import annotations

import copy
import functools
import gc
import logging
import operator
import time
import warnings
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from hiremate.graphbuilder.costs.memory import node_args
from hiremate.graphbuilder.opinfo import op_kind

log = logging.getLogger(__name__)

#: back-to-back calls per sample: enough for about a millisecond, between these bounds
_INNER_BOUNDS = (2, 5)
#: GPU cycles spun before each timed CUDA call (about 0.1 ms at 2 GHz): longer than one op's
#: launches take on the CPU, so that none of them is waited for inside the events
_LAUNCH_COVER_CYCLES = 200_000


def signature(node: torch.fx.Node, env: dict[str, Any]) -> str:
    """What decides an op's time: its target, and its arguments' shapes, dtypes, strides and
    constant values."""
    def describe(a):
        if isinstance(a, torch.fx.Node):
            v = env.get(a.name)
            if isinstance(v, torch.Tensor):
                return ("T", tuple(v.shape), str(v.dtype), tuple(v.stride()), v.storage_offset())
            return ("V", type(v).__name__)
        return a
    parts = pytree.tree_map(describe, (node.args, dict(node.kwargs)),
                            is_leaf=lambda x: isinstance(x, torch.fx.Node))
    return f"{node.target}|{parts!r}"


def cpu_clock() -> tuple[Callable[[], float], float]:
    """The clock for timing ops on the CPU, and what one start/stop pair of it costs (to take
    off each interval). With one intra-op thread every op runs on the calling thread, so its
    CPU time (``time.thread_time``) is the op's cost without the time the OS gave to other
    processes, which wall time would count; with more threads the workers' CPU time would be
    missed, so wall time (``time.perf_counter``) it is. Reading the thread's CPU time is a
    system call of about half a microsecond, as much as a small op, hence the correction."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    return clock, _clock_cost(clock)


def device_clock(device: torch.device) -> tuple[Callable[[], float], float]:
    """:func:`cpu_clock` on the CPU; on a GPU wall time around synchronised calls, free."""
    return (time.perf_counter, 0.0) if device.type == "cuda" else cpu_clock()


@functools.lru_cache(maxsize=None)
def _clock_cost(clock: Callable[[], float]) -> float:
    """The fastest of many empty intervals of ``clock``: what one start/stop pair costs."""
    best = float("inf")
    for _ in range(2000):
        start = clock()
        best = min(best, clock() - start)
    return max(0.0, best)


def _sampler(node: torch.fx.Node, env: dict[str, Any], device: torch.device
             ) -> Callable[[int], float]:
    """A function ``sample(calls)``: the fastest of ``calls`` back-to-back calls of ``node``,
    in seconds. Arguments the op writes into are cloned before each call (outside the timing)."""
    kind = op_kind(node.target)
    args, kwargs = node_args(node, env)

    def fresh() -> tuple[tuple, dict]:
        if not kind.writes:
            return args, kwargs
        a = list(args)
        for i in kind.writes:
            if i < len(a) and isinstance(a[i], torch.Tensor):
                a[i] = a[i].clone()
        return tuple(a), kwargs

    if device.type == "cuda":
        start_ev = torch.cuda.Event(enable_timing=True)
        end_ev = torch.cuda.Event(enable_timing=True)

        def once() -> float:
            a, k = fresh()
            # the GPU spins while the op's kernels are launched behind the start event: the
            # events then frame the kernels alone, as in a run where the CPU is ahead of the GPU
            # (a step bound by launches instead is :func:`in_situ_overhead`'s share)
            torch.cuda._sleep(_LAUNCH_COVER_CYCLES)
            start_ev.record()
            node.target(*a, **k)
            end_ev.record()
            end_ev.synchronize()
            return start_ev.elapsed_time(end_ev) * 1e-3
    else:
        clock, cost = cpu_clock()

        def once() -> float:
            a, k = fresh()
            start = clock()
            node.target(*a, **k)
            return max(0.0, clock() - start - cost)

    return lambda calls: min(once() for _ in range(calls))


def time_nodes(nodes: list[torch.fx.Node], env: dict[str, Any], rounds: int,
               device: torch.device, progress: Callable[[int], None] | None = None
               ) -> dict[str, float]:
    """Time of every node of ``nodes`` (seconds; ``getitem`` is free): per unique signature,
    the minimum over ``rounds`` interleaved rounds (see the module docstring)."""
    times: dict[str, float] = {}
    members: dict[str, list[str]] = {}
    samplers: dict[str, Callable[[int], float]] = {}
    for node in nodes:
        if node.target is operator.getitem:
            times[node.name] = 0.0
            continue
        sig = signature(node, env)
        if sig not in samplers:
            samplers[sig] = _sampler(node, env, device)
        members.setdefault(sig, []).append(node.name)
    best: dict[str, float] = {}
    calls: dict[str, int] = {}
    for i, (sig, sample) in enumerate(samplers.items()):  # warm-up: lazy initialisation
        if progress is not None:
            progress(i)
        first = sample(1)
        best[sig] = first
        low, high = _INNER_BOUNDS
        calls[sig] = max(low, min(high, int(1e-3 / max(first, 1e-7))))
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a cyclic collection would land inside a random sample
    try:
        for _ in range(rounds):
            for sig, sample in samplers.items():
                best[sig] = min(best[sig], sample(calls[sig]))
    finally:
        if gc_was_enabled:
            gc.enable()
    for sig, names in members.items():
        for name in names:
            times[name] = best[sig]
    log.debug("timed %d unique op signatures of %d ops over %d rounds",
              len(samplers), len(nodes), rounds)
    return times


def in_situ_overhead(gm: torch.fx.GraphModule, inputs: list[Any], nodes: list[torch.fx.Node],
                     times: dict[str, float], device: torch.device, runs: int = 5,
                     seconds: float = 0.25, max_runs: int = 50) -> float:
    """Per-op cost that isolated timing misses: run the whole joint graph as straight-line code
    (fx's own code generation, as the executor runs a schedule: cold caches, allocator traffic,
    one Python call per op) and spread the difference between its fastest run and the sum of
    the isolated times evenly over the ops. At least ``runs`` timed runs, more (up to
    ``max_runs``) while they fit in about ``seconds``: on a GPU a small model's step is
    launch-bound, this difference is most of its time, and the fastest of a few runs of a
    few milliseconds moves with the host's load."""
    with warnings.catch_warnings():  # pytree specs warn about a deprecated check when copied
        warnings.simplefilter("ignore", FutureWarning)
        replayable = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    replayable.graph._codegen = torch.fx.graph.CodeGen()
    replayable.recompile()
    flat = pytree.tree_leaves(inputs)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock, cost = device_clock(device)
    samples = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        wanted = runs + 1  # the first run (lazy initialisation) is never kept
        while len(samples) < wanted:
            fresh = [v.clone() if isinstance(v, torch.Tensor) else v for v in flat]
            sync()
            start = clock()
            result = replayable(*fresh)
            sync()
            samples.append(clock() - start - cost)
            del result, fresh
            if len(samples) == 2:
                wanted = max(wanted, min(max_runs, int(seconds / max(samples[1], 1e-6))) + 1)
    finally:
        if gc_was_enabled:
            gc.enable()
    replay = min(samples[1:])
    counted = [n for n in nodes if n.target is not operator.getitem]
    isolated = sum(times.get(n.name, 0.0) for n in counted)
    per_op = max(0.0, (replay - isolated) / max(len(counted), 1))
    log.debug("in-situ replay %.3f ms vs isolated %.3f ms: %.2f us per op",
              replay * 1e3, isolated * 1e3, per_op * 1e6)
    return per_op


def time_in_place(gm: torch.fx.GraphModule, inputs: list[Any], rounds: int,
                  device: torch.device, warmup: bool = True) -> dict[str, float]:
    """Time of every op of ``gm`` as it runs inside the whole program: the program replayed
    ``rounds`` times in order, each value freed after its last use (as the executor frees
    them), each op timed where it stands, the minimum over the rounds kept. Unlike isolated
    timing this includes what a real run pays per op: fresh allocations (page faults for large
    tensors on the CPU) and caches that the previous ops left cold."""
    order = [n for n in gm.graph.nodes if n.op in ("placeholder", "get_attr", "call_function")]
    last_use: dict[str, int] = {}
    for i, node in enumerate(order):
        for a in node.all_input_nodes:
            last_use[a.name] = i
    dead_after: dict[int, list[str]] = {}
    for name, i in last_use.items():
        dead_after.setdefault(i, []).append(name)
    flat = pytree.tree_leaves(inputs)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock, cost = device_clock(device)
    best: dict[str, float] = {}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds + int(warmup)):  # a warm-up round (slow) never is the minimum
            env: dict[str, Any] = {}
            values = iter(flat)
            for i, node in enumerate(order):
                if node.op == "placeholder":
                    env[node.name] = next(values)
                elif node.op == "get_attr":
                    env[node.name] = getattr(gm, node.target)
                else:
                    args, kwargs = node_args(node, env)
                    sync()
                    start = clock()
                    env[node.name] = node.target(*args, **kwargs)
                    sync()
                    elapsed = max(0.0, clock() - start - cost)
                    best[node.name] = min(best.get(node.name, float("inf")), elapsed)
                for name in dead_after.get(i, ()):
                    env.pop(name, None)
            del env
    finally:
        if gc_was_enabled:
            gc.enable()
    return best
