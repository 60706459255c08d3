"""Costs of every op of the joint graph: time and temporary memory.

``cost_model="measure"`` (default) runs the joint graph once for real on the model's device and
then times every *unique* op signature (op, shapes, dtypes, strides, constants): median of
repeats. Temporary memory is what an op allocates beyond its outputs, from the CUDA allocator's
statistics on GPU and from the profiler's memory events on CPU. ``cost_model="flops"`` is the
fast analytic option: a roofline estimate from FLOPs and bytes, with no execution at all.
"""

from __future__ import annotations

import copy
import gc
import logging

import operator
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from hiremate.errors import ConfigError
from hiremate.graphbuilder.opinfo import op_kind, schema_name

log = logging.getLogger(__name__)

COST_MODELS = ("measure", "flops")
#: roofline of the analytic model (per device kind): FLOP/s, bytes/s, fixed cost per op
_ROOFLINE = {"cpu": (5e10, 1e10, 3e-6), "cuda": (5e13, 1e12, 8e-6)}


@dataclass(frozen=True)
class OpCost:
    time: float        # seconds
    temp: int          # bytes allocated and freed inside the op
    flops: float


def op_costs(gm: torch.fx.GraphModule, inputs: list[Any], cost_model: str = "measure",
             repeats: int = 5, progress: Callable[[int], None] | None = None) -> dict[str, OpCost]:
    """Cost of every ``call_function`` node of ``gm``, keyed by node name."""
    if cost_model not in COST_MODELS:
        raise ConfigError(f"unknown cost_model {cost_model!r}; choose one of {COST_MODELS}")
    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    flops = {n.name: _flops(n) for n in nodes}
    if cost_model == "flops":
        return {n.name: OpCost(_roofline(n, flops[n.name]), 0, flops[n.name]) for n in nodes}
    device = _device_of(inputs)
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        env, temps = _run_and_trace_memory(gm, inputs, device)
        times = _time_unique(nodes, env, repeats, device, progress)
        per_op = _in_situ_overhead(gm, inputs, nodes, times, device)
    return {n.name: OpCost(times.get(n.name, 0.0) + (per_op if n.target is not operator.getitem
                                                     else 0.0),
                           temps.get(n.name, 0), flops[n.name])
            for n in nodes}


def _in_situ_overhead(gm, inputs, nodes, times, device, runs: int = 5) -> float:
    """Per-op cost that isolated timing misses: run the whole joint graph as straight-line
    code (fx's own code generation, the way the executor runs a schedule: cold caches,
    allocator traffic, one Python call per op) and spread the difference between its time and
    the sum of isolated times evenly over the ops: median of ``runs`` replays after a warm-up,
    measured the way ``hiremate.measure`` times an iteration."""
    with warnings.catch_warnings():  # pytree specs warn about a deprecated check when copied
        warnings.simplefilter("ignore", FutureWarning)
        replayable = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    replayable.graph._codegen = torch.fx.graph.CodeGen()
    replayable.recompile()
    flat = pytree.tree_leaves(inputs)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    samples = []
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as hiremate.measure does: a cyclic collection would land in a random run
    for _ in range(runs + 1):
        fresh = [v.clone() if isinstance(v, torch.Tensor) else v for v in flat]
        sync()
        start = time.perf_counter()
        result = replayable(*fresh)
        sync()
        samples.append(time.perf_counter() - start)
        del result, fresh
    if gc_was_enabled:
        gc.enable()
    replay = statistics.median(samples[1:])
    counted = [n for n in nodes if n.target is not operator.getitem]
    isolated = sum(times.get(n.name, 0.0) for n in counted)
    per_op = max(0.0, (replay - isolated) / max(len(counted), 1))
    log.debug("in-situ replay %.3f ms vs isolated %.3f ms: %.2f us per op",
              replay * 1e3, isolated * 1e3, per_op * 1e6)
    return per_op


def _device_of(inputs: list[Any]) -> torch.device:
    for t in pytree.tree_leaves(inputs):
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


def _args(node: torch.fx.Node, env: dict[str, Any]) -> tuple[tuple, dict]:
    def look(a):
        return env[a.name] if isinstance(a, torch.fx.Node) else a
    return (pytree.tree_map(look, node.args, is_leaf=lambda x: isinstance(x, torch.fx.Node)),
            pytree.tree_map(look, dict(node.kwargs), is_leaf=lambda x: isinstance(x, torch.fx.Node)))


def _run_and_trace_memory(gm, inputs, device) -> tuple[dict[str, Any], dict[str, int]]:
    """Run every op once, keeping all values alive; measure each op's temporary bytes."""
    env: dict[str, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    flat = pytree.tree_leaves(inputs)
    for ph, value in zip(placeholders, flat):
        env[ph.name] = value
    for node in gm.graph.nodes:  # tensor constants of the program (T5's torch.tensor(0))
        if node.op == "get_attr":
            env[node.name] = getattr(gm, node.target)
    temps: dict[str, int] = {}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if device.type == "cuda":
        for node in calls:
            args, kwargs = _args(node, env)
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            env[node.name] = node.target(*args, **kwargs)
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) - before
            net = torch.cuda.memory_allocated(device) - before
            temps[node.name] = max(0, peak - net)
        return env, temps
    from torch.profiler import ProfilerActivity, profile, record_function

    from hiremate.quiet import QuietContext

    # the profiler's native side prints a line when it starts and when it stops: to the log
    with QuietContext(profile(activities=[ProfilerActivity.CPU], profile_memory=True),
                      "torch profiler") as prof:
        for node in calls:
            args, kwargs = _args(node, env)
            with record_function(f"hrm::{node.name}"):
                env[node.name] = node.target(*args, **kwargs)
    ranges: list[tuple[int, int, str]] = []
    memory: list[tuple[int, int]] = []
    for ev in prof.profiler.kineto_results.events():
        name = ev.name()
        if name == "[memory]":
            memory.append((ev.start_ns(), ev.nbytes()))
        elif name.startswith("hrm::"):
            ranges.append((ev.start_ns(), ev.end_ns(), name[5:]))
    memory.sort()
    ranges.sort()
    j = 0
    for start, end, name in ranges:
        while j < len(memory) and memory[j][0] < start:
            j += 1
        running = peak = 0
        k = j
        while k < len(memory) and memory[k][0] <= end:
            running += memory[k][1]
            peak = max(peak, running)
            k += 1
        temps[name] = max(0, peak - max(running, 0))
    return env, temps


def _signature(node: torch.fx.Node, env: dict[str, Any]) -> str:
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


def _time_unique(nodes, env, repeats, device, progress) -> dict[str, float]:
    """Median time of each unique op signature, shared by all nodes with that signature."""
    by_signature: dict[str, float] = {}
    times: dict[str, float] = {}
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for i, node in enumerate(nodes):
        if progress is not None:
            progress(i)
        if node.target is operator.getitem:
            times[node.name] = 0.0
            continue
        sig = _signature(node, env)
        if sig not in by_signature:
            by_signature[sig] = _time_one(node, env, repeats, sync)
        times[node.name] = by_signature[sig]
    log.debug("timed %d unique op signatures for %d ops", len(by_signature), len(nodes))
    return times


def _time_one(node, env, repeats, sync) -> float:
    """Median over ``repeats`` samples; each sample is the fastest of a few back-to-back runs,
    so a run interrupted by the OS scheduler (common on a loaded machine) does not count."""
    kind = op_kind(node.target)
    args, kwargs = _args(node, env)

    def fresh():
        if not kind.writes:
            return args, kwargs
        a = list(args)
        for i in kind.writes:
            if i < len(a) and isinstance(a[i], torch.Tensor):
                a[i] = a[i].clone()
        return tuple(a), kwargs

    def once() -> float:
        a, k = fresh()
        sync()
        start = time.perf_counter()
        node.target(*a, **k)
        sync()
        return time.perf_counter() - start

    first = once()  # warm-up (lazy initialisation, caches)
    inner = max(3, min(5, int(1e-3 / max(first, 1e-7))))
    samples = [min(once() for _ in range(inner)) for _ in range(repeats)]
    return statistics.median(samples)


# -- analytic model -----------------------------------------------------------------------------
def _numel(v: Any) -> int:
    return v.numel() if isinstance(v, torch.Tensor) else 0


def _flops(node: torch.fx.Node) -> float:
    out = node.meta.get("val")
    name = schema_name(node.target) if not node.target is operator.getitem else "getitem"
    ins = [a.meta.get("val") for a in node.all_input_nodes]
    if name in ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"):
        a, b = (ins[-2], ins[-1])
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return 2.0 * _numel(out) * a.shape[-1]
    if name == "aten::convolution" and isinstance(ins[1], torch.Tensor):
        w = ins[1]
        return 2.0 * _numel(out) * (w.numel() // max(w.shape[0], 1))
    if name == "aten::convolution_backward" and len(ins) > 2 and isinstance(ins[2], torch.Tensor):
        w = ins[2]
        return 4.0 * _numel(ins[0]) * (w.numel() // max(w.shape[0], 1))
    return float(sum(_numel(v) for v in pytree.tree_leaves(out)))


def _roofline(node: torch.fx.Node, flops: float) -> float:
    if node.target is operator.getitem or op_kind(node.target).view_of is not None:
        return 0.0
    out = node.meta.get("val")
    dev = "cpu"
    for v in pytree.tree_leaves(out):
        if isinstance(v, torch.Tensor):
            dev = "cuda" if v.device.type == "cuda" else "cpu"
            break
    rate, bandwidth, fixed = _ROOFLINE[dev]
    moved = sum(_numel(v) * v.element_size() for v in pytree.tree_leaves(out)
                if isinstance(v, torch.Tensor))
    moved += sum(_numel(a.meta.get("val")) * a.meta["val"].element_size()
                 for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor))
    return fixed + max(flops / rate, moved / bandwidth)


__all__ = ["COST_MODELS", "OpCost", "op_costs"]
