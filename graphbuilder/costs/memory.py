"""Temporary memory of every op: what it allocates and frees inside itself, beyond its outputs.

Memory, unlike time, does not depend on the machine's load, so every cost model takes it from
one real run of the joint graph: the CUDA allocator's history on a GPU, the profiler's memory
events on the CPU (where convolution kernels allocate scratch that no tensor of the graph
shows; leaving it out made measured peaks exceed the simulator's by up to 1.9x).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from hiremate.cuda_trace import device_trace, events_from_cuda_trace, record_cuda_history
from hiremate.errors import GraphCaptureError

log = logging.getLogger(__name__)


def node_args(node: torch.fx.Node, env: dict[str, Any]) -> tuple[tuple, dict]:
    """``node``'s arguments with the values of ``env`` in place of the nodes they name."""
    def look(a):
        return env[a.name] if isinstance(a, torch.fx.Node) else a
    is_node = lambda x: isinstance(x, torch.fx.Node)  # noqa: E731
    return (pytree.tree_map(look, node.args, is_leaf=is_node),
            pytree.tree_map(look, dict(node.kwargs), is_leaf=is_node))


def run_and_trace_memory(gm: torch.fx.GraphModule, inputs: list[Any], device: torch.device,
                         param_grads: Iterable[str] = ()
                         ) -> tuple[dict[str, Any], dict[str, int]]:
    """Run every op of ``gm`` once, keeping all values alive: the values by node name, and
    each op's temporary bytes (its peak during the call minus what it leaves allocated).

    ``param_grads`` names the nodes whose values are parameter gradients. Neither the simulator
    nor the measurement counts them, so the allocation that makes one is left out here too:
    a convolution's backward peaks on its scratch *before* it allocates the weight's gradient,
    and subtracting that gradient from the peak would hide as much scratch as it weighs.
    """
    env: dict[str, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for ph, value in zip(placeholders, pytree.tree_leaves(inputs)):
        env[ph.name] = value
    for node in gm.graph.nodes:  # tensor constants of the program (T5's torch.tensor(0))
        if node.op == "get_attr":
            env[node.name] = getattr(gm, node.target)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    wanted = set(param_grads)
    relaid: list[str] = []
    if device.type == "cuda":
        temps = _cuda_temps(calls, env, device, wanted, relaid)
    else:
        temps = _cpu_temps(calls, env, wanted, relaid)
    if relaid:
        raise ViewsNeedCopies(relaid)
    return env, temps


class ViewsNeedCopies(GraphCaptureError):
    """``view`` ops of the traced program that the real run could not take: the fake tensors
    laid their input out otherwise than the kernel did (CPU ``native_batch_norm`` returns a
    contiguous result for a transposed input, its fake one keeps the input's strides), so the
    ``reshape`` that traced as a view copies in eager. ``names``: those ops, all of the run
    (each was taken as eager's ``reshape`` to go on)."""

    def __init__(self, names: list[str]):
        super().__init__(f"the traced views {', '.join(names)} cannot be taken on the real "
                         "run's values, even after copying their inputs; please report this "
                         "model")
        self.names = names


def run_node(node: torch.fx.Node, args: tuple, kwargs: dict, relaid: list[str]) -> Any:
    """``node``'s op on real values; a ``view`` whose input the kernel laid out so that it
    cannot be viewed is noted in ``relaid`` and taken as ``reshape`` takes it (a copy)."""
    try:
        return node.target(*args, **kwargs)
    except RuntimeError:
        if node.target is not torch.ops.aten.view.default or not isinstance(args[0],
                                                                            torch.Tensor):
            raise
        relaid.append(node.name)
        return args[0].reshape(*args[1:], **kwargs)


def owned_storage_bytes(gm: torch.fx.GraphModule, env: dict[str, Any]) -> dict[str, int]:
    """Bytes of the storage each op's value is the first to hold, from the run that kept every
    value alive (so no address is reused), by node name; views and values that share an
    earlier storage are left out. Why: a kernel can allocate more than its output's elements
    and keep it. CPU ``col2im`` (``F.fold``) allocates its output like its input and shrinks
    it with ``resize_``, which keeps the storage: the value holds its input's size, where its
    fake tensor shows the result's."""
    seen: set[int] = set()
    owned: dict[str, int] = {}
    for node in gm.graph.nodes:
        value = env.get(node.name)
        for t in pytree.tree_leaves(value) if node.op != "call_function" else ():
            if isinstance(t, torch.Tensor):
                seen.add(_storage(t)[0])
        if node.op != "call_function" or not isinstance(value, torch.Tensor):
            continue
        address, nbytes = _storage(value)
        if address and address not in seen:
            seen.add(address)
            owned[node.name] = nbytes
    return owned


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """Address and bytes of ``t``'s storage ((0, 0) for a tensor without one)."""
    try:
        storage = t.untyped_storage()
        return int(storage.data_ptr()), int(storage.nbytes())
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, symbolic
        return 0, 0


def _grad_addresses(env: dict[str, Any], param_grads: set[str]) -> set[int]:
    return {_storage(t)[0] for name in param_grads
            for t in pytree.tree_leaves(env.get(name)) if isinstance(t, torch.Tensor)}


def _cuda_temps(calls: list[torch.fx.Node], env: dict[str, Any], device: torch.device,
                param_grads: set[str], relaid: list[str]) -> dict[str, int]:
    """Each op's scratch from the allocator's history (which blocks, in order), so that a
    parameter gradient's block is left out wherever it falls; from its peak statistics where
    the history is unavailable."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    try:
        cleared = record_cuda_history(device, True)
        record_cuda_history(device, False)
    except Exception as exc:  # the private API missing or refusing
        cleared = False
        log.info("capture: CUDA memory history unavailable (%s)", exc)
    if not cleared:  # each op's trace must start empty
        log.info("capture: per-op CUDA memory history unavailable; scratch from peak statistics")
        return _cuda_temps_from_statistics(calls, env, device, param_grads, relaid)
    per_node: list[tuple[str, list[tuple[int, int]]]] = []
    for node in calls:
        args, kwargs = node_args(node, env)
        torch.cuda.synchronize(device)
        record_cuda_history(device, True)
        try:
            env[node.name] = run_node(node, args, kwargs, relaid)
            torch.cuda.synchronize(device)
            trace = device_trace(device)
        finally:
            record_cuda_history(device, False)
        per_node.append((node.name, events_from_cuda_trace(trace)))
    return temps_from_events(per_node, _grad_addresses(env, param_grads))


def _cuda_temps_from_statistics(calls: list[torch.fx.Node], env: dict[str, Any],
                                device: torch.device, param_grads: set[str], relaid: list[str]
                                ) -> dict[str, int]:
    stats: dict[str, tuple[int, int]] = {}
    for node in calls:
        args, kwargs = node_args(node, env)
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        env[node.name] = run_node(node, args, kwargs, relaid)
        torch.cuda.synchronize(device)
        stats[node.name] = (torch.cuda.max_memory_allocated(device) - before,
                            torch.cuda.memory_allocated(device) - before)
    grads = _grad_addresses(env, param_grads)
    temps: dict[str, int] = {}
    for node in calls:
        peak, net = stats[node.name]
        # the allocator's statistics do not say whether a parameter gradient was made before
        # or after the peak: assume after (its bytes are then scratch, never too little)
        made = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in pytree.tree_leaves(env[node.name]) if isinstance(t, torch.Tensor)}
        net -= min(net, sum(n for addr, n in made.items() if addr in grads))
        temps[node.name] = max(0, peak - net)
    return temps


def walk_events(events: Iterable[Any]) -> Iterator[Any]:
    """Every event of a profiler's event tree (``experimental_event_tree()``), depth first,
    each before its children, in the tree's order."""
    stack = list(events)[::-1]
    while stack:
        event = stack.pop()
        yield event
        stack.extend(list(event.children)[::-1])


def _cpu_temps(calls: list[torch.fx.Node], env: dict[str, Any], param_grads: set[str],
               relaid: list[str]) -> dict[str, int]:
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    from hiremate.quiet import QuietContext

    # the profiler's native side prints a line when it starts and when it stops: to the log
    with QuietContext(profile(activities=[ProfilerActivity.CPU], profile_memory=True),
                      "torch profiler") as prof:
        for node in calls:
            args, kwargs = node_args(node, env)
            with record_function(f"hrm::{node.name}"):
                env[node.name] = run_node(node, args, kwargs, relaid)
    tops = [e for e in walk_events(prof.profiler.kineto_results.experimental_event_tree())
            if e.tag == _EventType.TorchOp and e.name.startswith("hrm::")]
    per_node: list[tuple[str, list[Any]]] = [
        (top.name[5:], sorted((e for e in walk_events(top.children) if e.tag == _EventType.Allocation
                               and torch.device(e.extra_fields.device).type == "cpu"),
                              key=lambda e: e.start_time_ns))
        for top in tops]
    return temps_from_events(
        [(name, [(int(e.extra_fields.ptr), int(e.extra_fields.alloc_size)) for e in allocations])
         for name, allocations in per_node],
        _grad_addresses(env, param_grads))


def temps_from_events(per_node: list[tuple[str, list[tuple[int, int]]]], grads: set[int]
                      ) -> dict[str, int]:
    """Each op's scratch from its ``(address, bytes)`` allocation events (bytes < 0: a free),
    ops in run order: its peak minus what it leaves allocated, the blocks of parameter
    gradients (at ``grads``' addresses) left out wherever they fall in the op."""
    # a parameter gradient is the last block allocated at its address (the run keeps every
    # value alive, so nothing reuses the address afterwards)
    last_at: dict[int, tuple[int, int]] = {}
    for i, (_, events) in enumerate(per_node):
        for j, (addr, nbytes) in enumerate(events):
            if nbytes > 0 and addr in grads:
                last_at[addr] = (i, j)
    left_out = set(last_at.values())
    temps: dict[str, int] = {}
    for i, (name, events) in enumerate(per_node):
        running = peak = 0
        for j, (_, nbytes) in enumerate(events):
            if (i, j) not in left_out:
                running += nbytes
                peak = max(peak, running)
        temps[name] = max(0, peak - max(running, 0))
    return temps
