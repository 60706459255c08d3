"""Costs of every op of the joint graph: time and temporary memory.

Temporary memory (what an op allocates beyond its outputs: convolution scratch, workspaces) is
taken from one real run of the joint graph under every cost model, since memory does not
depend on the machine's load (:mod:`.memory`). Times come from the chosen ``cost_model``:

- ``"measured"``: every unique op signature timed on the model's device, interleaved rounds and
  the minimum (:mod:`.timing`); CUDA events on a GPU. Faithful, and on a quiet machine stable.
- ``"flops"``: FLOPs and bytes over fixed machine constants (:mod:`.analytic`): identical on
  every machine, for comparing solvers and for the papers' tables.
- ``"roofline"``: FLOPs and bytes per op class over coefficients fitted on this machine once and
  cached (:mod:`.roofline`): deterministic and close to this machine's times.
- ``"auto"`` (default): ``measured`` on a GPU, ``roofline`` on the CPU, where a busy machine
  makes measured times move run to run.

``"measure"`` is accepted as the former name of ``"measured"``.
"""

from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from hiremate.errors import ConfigError
from hiremate.graphbuilder.costs.analytic import fixed_machine_time, flops_of
from hiremate.graphbuilder.costs.memory import owned_storage_bytes, run_and_trace_memory
from hiremate.graphbuilder.costs.roofline import load_or_fit
from hiremate.graphbuilder.costs.timing import in_situ_overhead, time_nodes

COST_MODELS = ("auto", "measured", "flops", "roofline")
_ALIASES = {"measure": "measured"}


@dataclass(frozen=True)
class OpCost:
    time: float        # seconds
    temp: int          # bytes allocated and freed inside the op
    flops: float
    in_situ: float = 0.0  # seconds of ``time`` that are the in-situ share (``measured`` only)
    stored: int = 0    # bytes of the storage the op's value owns in a real run (0: none new)


def check_cost_model(cost_model: Any) -> str:
    """``cost_model`` as one of :data:`COST_MODELS` (aliases resolved), or a ConfigError."""
    name = _ALIASES.get(cost_model, cost_model) if isinstance(cost_model, str) else cost_model
    if name not in COST_MODELS:
        raise ConfigError(f"unknown cost_model {cost_model!r}; choose one of "
                          f"{', '.join(COST_MODELS)} (auto: measured on a GPU, roofline on CPU)")
    return name


def resolve_cost_model(cost_model: str, device: torch.device) -> str:
    """The cost model that runs for ``cost_model`` on ``device`` (``auto`` decided)."""
    name = check_cost_model(cost_model)
    if name == "auto":
        return "measured" if device.type == "cuda" else "roofline"
    return name


def op_costs(gm: torch.fx.GraphModule, inputs: list[Any], cost_model: str = "auto",
             repeats: int = 7, progress: Callable[[int], None] | None = None,
             cache_dir: str | Path | None = None, param_grads: Iterable[str] = ()
             ) -> dict[str, OpCost]:
    """Cost of every ``call_function`` node of ``gm``, keyed by node name. ``repeats``: timing
    rounds of ``measured``; ``cache_dir``: where the ``roofline`` fit is kept (default
    ``$HIREMATE_CACHE`` or ``~/.cache/hiremate``); ``param_grads``: the nodes whose values are
    parameter gradients (memory that no budget counts, so not an op's scratch either)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be a positive integer, got {repeats!r}")
    device = device_of(inputs)
    name = resolve_cost_model(cost_model, device)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    flops = {n.name: flops_of(n) for n in nodes}
    shares: dict[str, float] = {}
    # events, the launch-covering spin and the allocator history act on the current device:
    # make it the model's (a model on cuda:1 would otherwise be timed on cuda:0's stream)
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with on_device, torch.random.fork_rng(
            devices=[device.index or 0] if device.type == "cuda" else []):
        env, temps = run_and_trace_memory(gm, inputs, device, param_grads)
        if name == "measured":
            times = time_nodes(nodes, env, repeats, device, progress)
            per_op = in_situ_overhead(gm, inputs, nodes, times, device)
            shares = {k: per_op if t > 0 else 0.0 for k, t in times.items()}
            times = {k: t + shares[k] for k, t in times.items()}
    stored = owned_storage_bytes(gm, env)
    del env
    if name == "flops":
        times = {n.name: fixed_machine_time(n, flops[n.name]) for n in nodes}
    elif name == "roofline":
        from hiremate.paths import default_cache_dir

        fit = load_or_fit(device, float_dtype_of(inputs),
                          Path(cache_dir) if cache_dir is not None else default_cache_dir())
        times = {n.name: fit.time(n, flops[n.name]) for n in nodes}
    return {n.name: OpCost(times.get(n.name, 0.0) if n.target is not operator.getitem else 0.0,
                           temps.get(n.name, 0), flops[n.name],
                           shares.get(n.name, 0.0) if n.target is not operator.getitem else 0.0,
                           stored.get(n.name, 0))
            for n in nodes}


def device_of(inputs: list[Any]) -> torch.device:
    for t in pytree.tree_leaves(inputs):
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


def float_dtype_of(inputs: list[Any]) -> torch.dtype:
    """The dtype of the first floating-point input (the parameters come first)."""
    for t in pytree.tree_leaves(inputs):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.dtype
    return torch.get_default_dtype()


__all__ = ["COST_MODELS", "OpCost", "check_cost_model", "op_costs", "resolve_cost_model"]
