"""Temporary memory of every op: what it allocates and frees inside itself, beyond its outputs.

Memory, unlike time, does not depend on the machine's load, so every cost model takes it from
one real run of the joint graph: the CUDA allocator's statistics on a GPU, the profiler's memory
events on the CPU (where convolution kernels allocate scratch that no tensor of the graph
shows; leaving it out made measured peaks exceed the simulator's by up to 1.9x).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree


def node_args(node: torch.fx.Node, env: dict[str, Any]) -> tuple[tuple, dict]:
    """``node``'s arguments with the values of ``env`` in place of the nodes they name."""
    def look(a):
        return env[a.name] if isinstance(a, torch.fx.Node) else a
    is_node = lambda x: isinstance(x, torch.fx.Node)  # noqa: E731
    return (pytree.tree_map(look, node.args, is_leaf=is_node),
            pytree.tree_map(look, dict(node.kwargs), is_leaf=is_node))


def run_and_trace_memory(gm: torch.fx.GraphModule, inputs: list[Any], device: torch.device
                         ) -> tuple[dict[str, Any], dict[str, int]]:
    """Run every op of ``gm`` once, keeping all values alive: the values by node name, and
    each op's temporary bytes (its peak during the call minus what it leaves allocated)."""
    env: dict[str, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for ph, value in zip(placeholders, pytree.tree_leaves(inputs)):
        env[ph.name] = value
    for node in gm.graph.nodes:  # tensor constants of the program (T5's torch.tensor(0))
        if node.op == "get_attr":
            env[node.name] = getattr(gm, node.target)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if device.type == "cuda":
        return env, _cuda_temps(calls, env, device)
    return env, _cpu_temps(calls, env)


def _cuda_temps(calls: list[torch.fx.Node], env: dict[str, Any], device: torch.device
                ) -> dict[str, int]:
    temps: dict[str, int] = {}
    for node in calls:
        args, kwargs = node_args(node, env)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        env[node.name] = node.target(*args, **kwargs)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        net = torch.cuda.memory_allocated(device) - before
        temps[node.name] = max(0, peak - net)
    return temps


def _cpu_temps(calls: list[torch.fx.Node], env: dict[str, Any]) -> dict[str, int]:
    from torch.profiler import ProfilerActivity, profile, record_function

    from hiremate.quiet import QuietContext

    # the profiler's native side prints a line when it starts and when it stops: to the log
    with QuietContext(profile(activities=[ProfilerActivity.CPU], profile_memory=True),
                      "torch profiler") as prof:
        for node in calls:
            args, kwargs = node_args(node, env)
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
    temps: dict[str, int] = {}
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
    return temps
