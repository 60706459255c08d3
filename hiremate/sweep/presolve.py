"""Solving a sweep's hiremate cells before measuring them: one graph per model, every budget.

A cell that captures and solves on its own sees its own measured op times and only the
schedules its own time-limited solvers find. Two budgets of one model could then get schedules
whose peaks go the wrong way: a 0.7 budget's schedule that also fits 0.6 is faster than the one
found at 0.6, yet at 0.6 nobody offers it.

So before the measuring phase, each model's graph is captured once (and kept in
``OUT/graphs/<model>.json``, so a resumed sweep uses the same one), and every hiremate preset
solves every budget on it, largest budget first. Each solve records its candidates in the
schedule pool (:mod:`hiremate.composer.pool`). The measuring cells then build their module on
that same graph: their solve is a cache hit that also consults the now complete pool, and so
returns the fastest known schedule within its budget. On one graph that choice gives peaks
that only go down as the budget does.

A cell's ``solve_time`` is the presolve's solving time plus its own (the cache hit and any
calibration re-solves), and ``extra.presolve_time`` says how much was the presolve's. A budget
that the presolve found infeasible is recorded as infeasible without solving it a second time.
The pool lives in the solver cache; the sweep points that at ``OUT/cache`` unless the sweep
file's ``hiremate_overrides`` name a ``cache_dir``, and presolving is skipped when they
switch the cache off. Cells run on workers that cannot read ``OUT`` still get the graph (it
travels with the work), but not the pool: they solve again on their own.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hiremate.errors import ConfigError, InfeasibleBudgetError
from hiremate.ir.graph import Graph
from hiremate.sweep.spec import PEERS, SweepSpec, preset_of

log = logging.getLogger(__name__)


@dataclass
class Presolved:
    """Graphs by model label (``Graph.to_dict`` form) and presolve outcomes by cell key."""

    graphs: dict[str, dict[str, Any]] = field(default_factory=dict)
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)


def is_hiremate_cell(cell: Any) -> bool:
    """A cell the presolve solves: a preset with a budget, the loss outside (a captured loss
    makes another graph, the model's and the loss's, which the cell captures itself)."""
    return (cell.method not in PEERS and cell.budget is not None
            and not preset_of(cell.method)[1])


def graph_path(out_dir: Path, label: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
    return out_dir / "graphs" / f"{safe}.json"


def sweep_overrides(spec: SweepSpec, out_dir: Path) -> dict[str, Any]:
    """The sweep's hiremate overrides, with the solver cache (and so the pool) under OUT."""
    overrides = dict(spec.hiremate_overrides)
    overrides.setdefault("cache_dir", str(out_dir / "cache"))
    return overrides


def _capture(cell: Any, spec: SweepSpec, path: Path) -> Graph:
    from hiremate import build_graph
    from hiremate.sweep.runner import _to_device, resolve_device

    if path.is_file():
        return Graph.load(path)
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    device = resolve_device(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, sample = cell.model.build(spec.torch_dtype())
        overrides = spec.hiremate_overrides
        graph = build_graph(model.to(device), _to_device(sample, device),
                            cost_model=overrides.get("cost_model", "auto"))
    path.parent.mkdir(parents=True, exist_ok=True)
    graph.save(path)
    return graph


def loss_bytes_of(cell: Any, spec: SweepSpec, graph: Graph) -> int:
    """What the sweep's loss (``zoo.output_loss``) allocates beyond the output gradients, as
    the cells' :class:`hiremate.HRockmate` measures it, so that presolved schedules and floors
    are those of the whole step the cells run."""
    from hiremate.runtime.measurement import loss_memory
    from hiremate.sweep.runner import _to_device, resolve_device
    from hiremate.zoo import output_loss

    device = resolve_device(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, sample = cell.model.build(spec.torch_dtype())
        grads = graph.tangent_bytes
        return int(loss_memory(model.to(device), _to_device(sample, device), output_loss, grads))


FLOOR_TOLERANCE = 0.02  # a bisecting floor search stops once its bracket is this narrow


def find_floors(spec: SweepSpec, cells: list[Any], references: dict[str, dict[str, Any]],
                out_dir: Path) -> dict[str, dict[str, Any]]:
    """``references`` with ``floor_bytes`` added for every model that has a ``floor`` cell: the
    lowest whole-step budget that the sweep's first preset is found to meet on the model's
    graph.

    A one-byte solve's infeasibility error gives a budget that is guaranteed to work, but it
    may be only an upper bound: the solvers' own lowest budget is not always their floor
    (a heuristic's), and for random ops it adds every generator state at once. So up to
    ``spec.floor_steps`` more solves bisect between that budget and the graph's memory floor
    (:func:`hiremate.ir.simulator.step_memory_floor`, below which no in-order schedule runs),
    each feasible one lowering the floor to its predicted whole-step peak, until the bracket is
    within :data:`FLOOR_TOLERANCE`. ``floor_infeasible_bytes`` is then the highest budget found
    infeasible (None when none was) and ``floor_bound_bytes`` that memory floor, so a report
    can say where the solvers' floor lies and how far it can be from the graph's."""
    preset = spec.floor_preset
    wanted = {c.model.label: c for c in cells if c.budget is not None and c.budget.floor}
    out = dict(references)
    if preset is None:
        return out
    for label, cell in wanted.items():
        ref = references.get(label)
        if not ref or ref.get("status") != "ok":
            continue
        try:
            found = _bisect_floor(cell, spec, out_dir, preset)
        except Exception as exc:  # the floor cells then record why they cannot run
            log.warning("finding the floor of %s failed: %s", label, exc)
            continue
        if found is not None:
            out[label] = {**ref, **found}
    return out


def _bisect_floor(cell: Any, spec: SweepSpec, out_dir: Path, preset: str) -> dict[str, Any] | None:
    """``floor_bytes``, ``floor_infeasible_bytes``, ``floor_bound_bytes``,
    ``floor_once_bytes`` (:func:`hiremate.ir.simulator.gradients_once_floor`: the bound for
    schedules that make each gradient once) and ``floor_solves`` of ``cell``'s model (see
    :func:`find_floors`); None when not even the guaranteed budget is known."""
    from hiremate.api import solve_graph
    from hiremate.ir.simulator import gradients_once_floor, step_memory_floor

    overrides = sweep_overrides(spec, out_dir)
    graph = _capture(cell, spec, graph_path(out_dir, cell.model.label))
    loss_bytes = loss_bytes_of(cell, spec, graph)

    def feasible_peak(budget: int) -> int | None:
        try:
            result = solve_graph(graph, budget, preset, loss_bytes, **overrides)
        except InfeasibleBudgetError:
            return None
        return int(result.report.get("predicted_peak", budget))

    try:  # a one-byte budget always fails; its error names a budget that works
        solve_graph(graph, 1, preset, loss_bytes, **overrides)
        return None
    except InfeasibleBudgetError as exc:
        if exc.min_budget is None:
            return None
        high = int(exc.min_budget)
    bound = step_memory_floor(graph, loss_bytes)
    low, infeasible, solves = min(bound, high), None, 1
    for _ in range(max(0, spec.floor_steps)):
        if high - low <= FLOOR_TOLERANCE * high:
            break
        mid = (low + high) // 2
        peak = feasible_peak(mid)
        solves += 1
        if peak is None:
            low = infeasible = mid
        else:
            high = min(high, peak, mid)
    log.info("floor of %s (%s): %d bytes; %s infeasible; %d solves", cell.model.label, preset,
             high, infeasible, solves)
    return {"floor_bytes": int(high), "floor_infeasible_bytes": infeasible,
            "floor_bound_bytes": int(bound),
            "floor_once_bytes": int(gradients_once_floor(graph, loss_bytes)),
            "floor_solves": solves}


def presolve(spec: SweepSpec, cells: list[Any], references: dict[str, dict[str, Any]],
             out_dir: Path, progress: bool | str = "auto") -> Presolved:
    """Capture one graph per model of ``cells`` and solve its hiremate cells, largest budget
    first (see the module docstring). Failures are left to the cells to report."""
    from tqdm.auto import tqdm

    from hiremate.api import solve_graph
    from hiremate.quiet import show_progress

    out = Presolved()
    overrides = sweep_overrides(spec, out_dir)
    if overrides.get("cache") is False:
        log.info("hiremate_overrides switch the cache off: cells solve on their own")
        return out
    by_model: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for cell in cells:
        ref = references.get(cell.model.label)
        if not is_hiremate_cell(cell) or not ref or ref.get("status") != "ok":
            continue
        try:
            budget, _ = cell.budget.resolve(int(ref["measured_peak"]), ref.get("floor_bytes"))
        except ConfigError:  # a floor that could not be found: the cell reports it
            continue
        by_model[cell.model.label].append((budget, cell))
    total = sum(len(v) for v in by_model.values())
    bar = tqdm(total=total, desc="presolve", unit="solve", disable=not show_progress(progress) or not total)
    try:
        for label, jobs in by_model.items():
            try:
                graph = _capture(jobs[0][1], spec, graph_path(out_dir, label))
                loss_bytes = loss_bytes_of(jobs[0][1], spec, graph)
            except Exception as exc:  # the cells capture again and record the failure
                log.warning("presolve: capturing %s failed (%s); its cells solve alone", label, exc)
                bar.update(len(jobs))
                continue
            out.graphs[label] = graph.to_dict()
            for budget, cell in sorted(jobs, key=lambda j: (-j[0], j[1].method)):
                t0 = time.perf_counter()
                try:
                    solve_graph(graph, budget, cell.method, loss_bytes, **overrides)
                    out.cells[cell.key] = {"status": "ok"}
                except InfeasibleBudgetError as exc:
                    out.cells[cell.key] = {"status": "infeasible", "message": str(exc),
                                           "min_budget": exc.min_budget}
                except Exception as exc:  # the cell solves again and records the error
                    log.warning("presolve of %s failed: %s", cell.key, exc)
                    out.cells[cell.key] = {"status": "error"}
                out.cells[cell.key]["solve_time"] = time.perf_counter() - t0
                bar.set_postfix_str(cell.key, refresh=False)
                bar.update(1)
    finally:
        bar.close()
    return out

