"""The top-level solve: the flat path, the hierarchical path over blocks, the best candidate.

What runs:

1. **Flat path** (graphs of at most ``flat_max_nodes`` compute nodes): every ``flat`` solver of
   the configuration schedules the whole graph (H-ILP = rk-Checkmate with a time limit, TW-Remat,
   FastSA, Rotor on chain-shaped graphs, autodiff); when the flat H-ILP runs (first, after the
   hierarchy, or only where the others leave it something to win: ``flat_gap``) is
   :mod:`hiremate.composer.flat`'s.
2. **Hierarchical path**: the partitioner's *top level* gives the blocks (each a top-level part,
   a forward node or a subgraph, flattened to its original nodes). Every block becomes a CD-graph
   of its own (:func:`hiremate.ir.blocks.extract`): its forward nodes, a loss node standing for the rest of the model
   (it reads the block's outputs and produces the gradients that flow in), and its backward
   nodes. Backward nodes without a forward partner join the block whose data they read (or stay
   at the top level, run as soon as their inputs exist). Blocks with equal canonical graphs are
   solved once; each ``bottom`` solver gives a menu, the menus are merged (Pareto front) and cut
   to ``n_options`` (farthest peaks). A ``top`` composer then schedules the sequence of blocks with
   their menus: rk-Rotor (Rockmate, appendix C: the blocks as a chain) and/or the hierarchical H-ILP (``hilp-top``,
   :mod:`hiremate.solvers.hilp.top`: a MILP over the blocks' forward and backward
   nodes with options and phantoms, any dependency shape between blocks); every composer's
   candidates are simulated and the fastest valid one within the budget wins.

3. **Sequence path** (``sequence_top``): Rockmate's chain of ``sequence`` blocks with the
   ``sequence_top`` composers, beside the hierarchy, when the blocks are small.
4. **Polish** (``polish``): each polishing solver (FastSA's annealing) starts from the fastest
   candidate of each of the ``polish_from`` fastest sources; a candidate is then rid of the
   recomputations nothing needs (:func:`hiremate.ir.sequence.drop_unused_recomputations`)
   and completed with the buffer writes the executor adds
   (:func:`hiremate.ir.sequence.complete_effects`) before it is ranked.
5. **Refine** (``refine``): each refining solver in turn on the fastest candidate after the
   polish (``hilp-window``: the flat H-ILP re-solved over a sliding window of phases).

Translating back: a block operation becomes the compute steps of its option's forward or
backward part (renamed to full-graph ids); the whole compute sequence gets its frees from
:func:`hiremate.ir.sequence.sequence_to_schedule` (each value freed after its last
read before it is produced again: for a fixed compute order, the least memory), which makes any
such sequence valid. Its memory is then whatever :func:`hiremate.simulate` says: a composer's
abstract model is only a guide, so each candidate is simulated on the full graph and kept only
when within the budget (rk-Rotor is re-run at a lower abstract budget when the simulated peak
overshoots).

Values read beyond a chain of blocks (a constant such as an attention mask, which the sequence
partitioner hoists into a first block and every layer's block reads as an input; a gradient
that a tail node sums at the end) stay alive across the blocks in between. ``hilp-top`` models
them exactly (they are data nodes of its top graph); rk-Rotor's chain model counts them over
their span (:func:`hiremate.ir.blocks.long_lived`), so its abstract peak bounds the simulated one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hiremate.composer.flat import (
    Paths, deferred_flat_hilp, fastest_per_source, flat_path, gated_flat_hilp, rewarm_flat,
)
from hiremate.composer.menu_cache import decode_solve, encode_solve
from hiremate.composer.menus import _progress, _runtime_free
from hiremate.errors import InfeasibleBudgetError, SolverError
from hiremate.ir.blocks import Candidate, TopProblem
from hiremate.ir.graph import Graph, graph_key
from hiremate.ir.schedule import Schedule
from hiremate.ir.sequence import complete_effects, drop_unused_recomputations
from hiremate.ir.simulator import SimulationResult, autodiff_schedule, simulate
from hiremate.solvers.protocols import compose_chains, takes_chains
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)


# -- the whole solve ----------------------------------------------------------------------------------
#: How many of a solve's other candidates its result keeps (:attr:`SolveResult.others`)
OTHERS_KEPT = 16


@dataclass
class SolveResult:
    """The fastest schedule within the budget, its simulation and the solve's report.
    ``others``: the solve's other candidates within the budget, fastest first (at most
    :data:`OTHERS_KEPT`), for a caller whose rule is stricter than the graph's simulation: the
    whole step (:mod:`hiremate.composer.whole_step`) takes the fastest of them that fits it when
    the winner does not, instead of another solve."""

    schedule: Schedule
    sim: SimulationResult
    report: dict[str, Any]
    others: list[Candidate] = field(default_factory=list)


def solve(graph: Graph, budget: int, cfg: Any, cache: Any) -> SolveResult:
    """Schedule ``graph`` within ``budget`` bytes with configuration ``cfg`` (see module doc):
    a cached answer when it still fits, else the flat path, the hierarchical path when the flat
    one is not enough, and the schedule pool, the fastest valid candidate winning."""
    start = time.perf_counter()
    gkey = graph_key(graph)
    top_key = {"kind": "solve", "graph": gkey, "budget": int(budget), "config": _runtime_free(cfg)}
    pool = _schedule_pool(graph, gkey, cfg, cache)
    cached = _cached_solution(graph, budget, cache.get(top_key, decode=decode_solve), pool,
                              start)
    if cached is not None:
        return cached
    ad = simulate(graph, autodiff_schedule(graph))
    report: dict[str, Any] = {
        "config": cfg.name, "budget": int(budget), "autodiff_peak": ad.peak,
        "autodiff_time": ad.time, "compute_nodes": len(graph.nodes),
        "data_nodes": len(graph.data), "forward_nodes": len(graph.fwd_nodes),
    }
    found = Paths()
    flat_used = bool(cfg.flat) and len(graph.nodes) <= cfg.flat_max_nodes
    # with flat_gap, the flat H-ILP waits for the other paths and may not run at all
    gated = flat_used and cfg.flat_gap is not None and bool(cfg.bottom and cfg.top)
    deferred = False
    if flat_used:
        deferred = flat_path(graph, budget, cfg, found, hold_hilp=gated)
    bound, early = _early_flat(graph, budget, cfg, found, gated)
    memo: dict = {}  # polishes by start: the gate's trial and the final one share them
    try:
        # the hierarchical path is skipped only when a flat schedule is known to be the best there
        # is (an H-ILP proof of optimality) or is within hierarchical_above of autodiff's time: a
        # time-limited flat MILP often keeps a poor incumbent that the hierarchy beats
        settled = any(c.detail.get("optimal") for c in found.candidates) or (
            bool(found.candidates) and ad.time > 0
            and min(c.sim.time for c in found.candidates) <= cfg.hierarchical_above * ad.time)
        hier_used = bool(cfg.bottom and cfg.top) and (not flat_used or not settled)
        if hier_used:
            _hierarchical_path(graph, budget, cfg, cache, found, report,
                               after_menus=early.start if early is not None else None)
            if cfg.sequence_top and cfg.partitioner != "sequence":
                _sequence_path(graph, budget, cfg, cache, found, report)
            if deferred:
                deferred_flat_hilp(graph, budget, cfg, found, report)
            elif flat_used and cfg.flat_rewarm and not gated:
                rewarm_flat(graph, budget, cfg, found, report)
        else:  # the report describes the partition even when the flat path alone decided
            _partition(graph, cfg, report)
        report["flat_path"] = flat_used
        report["hierarchical_path"] = hier_used
        pooled = _pooled(pool, budget)
        trial, trial_final = [], False
        if gated:
            trial, trial_final = gated_flat_hilp(
                graph, budget, cfg, found, report, lambda cands: _polish(
                    graph, budget, cfg, Paths(cands + pooled), report, memo) if cfg.polish else [],
                bound=bound, early=early)
    finally:
        if early is not None:
            early.cancel()  # taken or skipped by the gate, or unwanted when a path raised
    found.candidates.extend(pooled)
    if cfg.polish and found.candidates:
        again = [] if trial_final else _polish(graph, budget, cfg, found, report, memo)
        seen = {(c.source, tuple(c.schedule)) for c in again}
        found.candidates.extend(again + [c for c in trial
                                         if (c.source, tuple(c.schedule)) not in seen])
    if cfg.refine and found.candidates:
        found.candidates.extend(_refine(graph, budget, cfg, found, report, bound))
    found.candidates = _with_effects(graph, budget, found.candidates)
    fresh = [c for c in found.candidates if not any(c is p for p in pooled)]
    if pool is not None:
        report["pool"] = {"recorded": pool.record((c.schedule, c.sim, c.source) for c in fresh),
                          "fitting": len(pooled)}
    if not found.candidates:
        report["errors"] = found.errors
        _raise_nothing_fits(graph, budget, cfg, found, ad.peak, flat_used, hier_used)
    best = _best(found, report, ad)
    report["solve_time"] = time.perf_counter() - start
    cache.put(top_key, encode_solve(best.schedule, report))
    others = sorted((c for c in found.candidates if c is not best),
                    key=lambda c: (c.sim.time, c.sim.peak))
    return SolveResult(best.schedule, best.sim, report, others[:OTHERS_KEPT])


def _early_flat(graph: Graph, budget: int, cfg: Any, found: Paths, gated: bool
                ) -> tuple[float | None, Any]:
    """The moment bound and the early flat H-ILP (:mod:`hiremate.composer.early`, started
    once the hierarchy's menus are made) when the gate will decide on the flat H-ILP and a
    flat heuristic fitted; (None, None) otherwise."""
    if not gated or not found.candidates:
        return None, None
    from hiremate.composer.early import plan_early_flat_hilp
    from hiremate.solvers.hilp.moment_bound import moment_time_bound

    bound = moment_time_bound(graph, budget)
    return bound, plan_early_flat_hilp(graph, budget, cfg, found.candidates, bound)


def _cached_solution(graph: Graph, budget: int, hit: Any, pool: Any,
                     start: float) -> SolveResult | None:
    """The cached answer for this graph, budget and configuration, when it still fits the
    budget under the current costs (a faster pooled schedule replaces it)."""
    if hit is None:
        return None
    sched, cached_report = hit
    sim = simulate(graph, sched)
    if not (sim.valid and sim.peak <= budget):
        log.warning("cached schedule no longer fits; solving again")
        return None
    # the entry was solved with another capture's costs: its figures are recomputed with these
    ad = simulate(graph, autodiff_schedule(graph))
    report = dict(cached_report, solve_time=time.perf_counter() - start, cached=True,
                  autodiff_peak=ad.peak, autodiff_time=ad.time)
    best = Candidate(sched, sim, str(report.get("solver", "cache")))
    pooled = _pooled(pool, budget)
    if pooled and min(c.sim.time for c in pooled) < sim.time:
        best = min(pooled, key=lambda c: (c.sim.time, c.sim.peak))
    _describe_best(report, best, ad.peak, ad.time)
    return SolveResult(best.schedule, best.sim, report)


def _partition(graph: Graph, cfg: Any, report: dict[str, Any], partitioner: Any = None) -> Any:
    from hiremate.registry import make_partitioner

    t0 = time.perf_counter()
    if partitioner is None:
        partitioner = make_partitioner(cfg.partitioner, cfg.partitioner_params)
    hierarchy = partitioner.partition(graph)
    report["partition_time"] = time.perf_counter() - t0
    report["hierarchy"] = hierarchy.summary()
    return hierarchy


def _hierarchical_path(graph: Graph, budget: int, cfg: Any, cache: Any, found: Paths,
                       report: dict[str, Any], after_menus: Callable[[], None] | None = None
                       ) -> None:
    """Every level of the partition solved bottom-up, then every top-level composer over the
    top level's blocks. When no composer finds a schedule within the budget and the budget is
    not below the graph's memory floor, the partition is made again with a smaller top (the
    partitioner's ``coarser``), up to ``cfg.coarser_tops`` times; those candidates are named
    ``coarse<k>:<composer>``, and the report's ``coarser_tops`` lists each try.
    ``after_menus``: called once the first partition's menus are made."""
    from hiremate.ir.tracker import memory_floor
    from hiremate.registry import make_partitioner

    partitioner = make_partitioner(cfg.partitioner, cfg.partitioner_params)
    hierarchy = _partition(graph, cfg, report, partitioner)
    before = len(found.candidates)
    report.update(_compose(graph, budget, cfg, cache, found, hierarchy, bool(cfg.middle),
                           cfg.top, "", after_menus))
    tries: list[dict[str, Any]] = []
    # below the memory floor no schedule that runs the nodes in order fits: no top would help
    retry = cfg.coarser_tops if budget >= memory_floor(graph) else 0
    for k in range(1, retry + 1):
        coarser = getattr(partitioner, "coarser", None)  # optional in the protocol
        top_size = len(hierarchy.top)
        partitioner = coarser(top_size) if coarser and len(found.candidates) == before else None
        if partitioner is None:
            break
        facts: dict[str, Any] = {}
        hierarchy = _partition(graph, cfg, facts, partitioner)
        if len(hierarchy.top) >= top_size:  # no smaller top to be had
            break
        t0 = time.perf_counter()
        _compose(graph, budget, cfg, cache, found, hierarchy, bool(cfg.middle), cfg.top,
                 f"coarse{k}:")
        tries.append({**facts["hierarchy"], "seconds": round(time.perf_counter() - t0, 3),
                      "candidates": len(found.candidates) - before})
    if tries:
        report["coarser_tops"] = tries


def _sequence_path(graph: Graph, budget: int, cfg: Any, cache: Any, found: Paths,
                   report: dict[str, Any]) -> None:
    """Rockmate's two levels beside the hierarchy: the ``sequence`` partition's blocks (a chain
    cut at single boundaries), a ``bottom`` menu for each unique block with ``n_options`` each,
    and the ``sequence_top`` composers over the chain. On graphs whose hierarchy folds many
    small layers into a few large subgraphs, the chain DP over fine blocks is often faster
    to run and finds a better schedule; candidates are named ``sequence:<composer>``.

    Not run when a block holds more than half of the forward nodes: the chain then has at
    most one large block, and its menu is a dozen MILPs on most of the graph, slower than the
    hierarchy, which solves that graph in smaller parts, and leaves the chain DP little to
    choose (measured in docs/results-history.md, "Stop 61")."""
    from hiremate.registry import make_partitioner

    t0 = time.perf_counter()
    hierarchy = make_partitioner("sequence", {}).partition(graph)
    sizes = [len(hierarchy.leaves(p)) for p in hierarchy.top]
    largest = max(sizes)
    if largest > cfg.sequence_max_block:
        report["sequence_path"] = {"skipped": f"a block of {largest} forward nodes "
                                              f"(sequence_max_block {cfg.sequence_max_block})"}
        return
    if 2 * largest > sum(sizes):
        report["sequence_path"] = {"skipped": f"a block of {largest} of the chain's "
                                              f"{sum(sizes)} forward nodes (more than half)"}
        return
    seq_cfg = cfg.replace(total_options=None)
    facts = _compose(graph, budget, seq_cfg, cache, found, hierarchy, False, cfg.sequence_top,
                     "sequence:")
    report["sequence_path"] = {k: facts[k] for k in ("blocks", "unique_blocks", "largest_block")}
    report["sequence_path"]["seconds"] = round(time.perf_counter() - t0, 3)


def _compose(graph: Graph, budget: int, cfg: Any, cache: Any, found: Paths, hierarchy: Any,
             recursive: bool, top: list[str], prefix: str,
             after_menus: Callable[[], None] | None = None) -> dict[str, Any]:
    """Menus for ``hierarchy``'s units (every level when ``recursive``), then (after
    ``after_menus``, when given) each composer of ``top`` over its top level; candidates go to
    ``found`` (sources prefixed by ``prefix``). Returns the facts for the report."""
    from hiremate.registry import make_solver

    from hiremate.composer.levels import build_units, solve_levels

    units, tail = build_units(graph, hierarchy, recursive=recursive)
    blocks = [u.block for u in units]
    t0 = time.perf_counter()
    facts = solve_levels(units, cfg, cache)
    if after_menus is not None:
        after_menus()
    every = [u for unit in units for u in unit.walk()]
    leaf = facts["leaf"]
    report: dict[str, Any] = {
        "menu_time": time.perf_counter() - t0, "blocks": len(blocks), "units": len(every),
        "unique_units": len({u.key for u in every}),
        "unique_blocks": len({b.key for b in blocks}),
        "largest_block": max(len(b.graph.nodes) for b in blocks),
        "tail_nodes": len(tail), "levels": facts["levels"],
        "block_menus": [
            {"nodes": len(b.graph.nodes), "menu": len(b.options),
             "members": sum(1 for c in blocks if c.key == b.key),
             **({"solvers": leaf[b.key]["solvers"]} if b.key in leaf else {})}
            for b in {b.key: b for b in blocks}.values()]}
    problem = TopProblem(graph, blocks, tail)
    composers = [make_solver(name, _with_workers(name, cfg)) for name in top]
    # a composer that takes the others' block chains (hilp-top, rk-Rotor's as floors) runs
    # after them; the order is otherwise the configuration's
    order = sorted(range(len(top)), key=lambda i: takes_chains(composers[i]))
    chains: list[tuple[float, tuple]] = []
    by_composer: dict[int, list[Candidate]] = {}
    for i in _progress(cfg, order, f"{prefix}top level"):
        name, composer = top[i], composers[i]
        label = f"{prefix}{name}"
        try:
            if takes_chains(composer):
                cands, low = composer.compose(
                    problem, budget, chains=[ops for _, ops in sorted(chains, key=lambda c: c[0])])
            else:
                cands, low = composer.compose(problem, budget)
        except Exception as exc:  # report, and let another path win
            found.errors[f"top:{label}"] = f"{type(exc).__name__}: {exc}"
            log.warning("top-level %s failed: %s", label, exc)
            continue
        if low is not None:
            found.mins[f"top:{label}"] = low
        chains.extend(compose_chains(cands))
        for c in cands:
            c.detail["blocks"] = _winners(problem, c)
            c.detail.pop("ops", None)
            c.source = f"{prefix}{c.source}"
        by_composer[i] = cands
        if not cands:
            found.errors[f"top:{label}"] = "no sequence within the budget"
    for i in sorted(by_composer):  # the configuration's order, which breaks ties of time
        found.candidates.extend(by_composer[i])
    return report


def _with_workers(name: str, cfg: Any) -> dict[str, Any]:
    """Solver ``name``'s configured parameters; a composer that takes ``workers`` (threads it
    may run at once, which its result does not depend on) gets the cores ``cfg.n_jobs``
    grants, unless the configuration sets them."""
    import inspect

    import joblib

    from hiremate.registry import solver_class

    params = dict(cfg.solver_params.get(name, {}))
    if "workers" not in params and "workers" in inspect.signature(solver_class(name)).parameters:
        params["workers"] = cfg.n_jobs if cfg.n_jobs > 0 else max(
            (joblib.cpu_count() or 1) + 1 + cfg.n_jobs, 1)
    return params


def _with_effects(graph: Graph, budget: int, candidates: list[Candidate]) -> list[Candidate]:
    """Each candidate without the recomputations nothing needs (:func:`~hiremate.ir.sequence.
    drop_unused_recomputations`: a subgraph's forward rerun for one value reruns the others
    too) and as the executor will run it (:func:`~hiremate.ir.sequence.complete_effects`:
    skipped effect-only buffer writes added before the loss), simulated again when that
    changed it; one that no longer fits the budget is dropped."""
    out = []
    for c in candidates:
        sched = complete_effects(graph, drop_unused_recomputations(graph, c.schedule))
        if sched is not c.schedule:
            sim = simulate(graph, sched)
            if not (sim.valid and sim.peak <= budget):
                log.info("%s: over the budget once its buffer writes run; dropped", c.source)
                continue
            c = Candidate(sched, sim, c.source, c.detail)
        out.append(c)
    return out


def _polish(graph: Graph, budget: int, cfg: Any, found: Paths,
            report: dict[str, Any], memo: dict | None = None) -> list[Candidate]:
    """Each ``polish`` solver started from the fastest candidate of each of the
    ``polish_from`` fastest sources: the faster schedules within the budget it finds, named
    ``<source>+<polisher>`` (a menu-built schedule keeps inefficiencies at its joins that a
    whole-graph local search removes; see :mod:`hiremate.solvers.fastsa.polish`). ``memo``
    keeps each polish by (polisher, start schedule): the polishers are deterministic, so the
    gate's trial polish and the final one share what both start from."""
    from hiremate.registry import make_solver

    starts = fastest_per_source(found.candidates, cfg.polish_from)
    out: list[Candidate] = []
    facts = []
    memo = {} if memo is None else memo
    for name in cfg.polish:
        solver = make_solver(name, cfg.solver_params.get(name, {}))
        for start in starts:
            t0 = time.perf_counter()
            key = (name, tuple(start.schedule))
            if key not in memo:
                memo[key] = solver.polish(graph, budget, start.schedule)
            sched = memo[key]
            sim = simulate(graph, sched) if sched is not None else None
            kept = sim is not None and sim.valid and sim.peak <= budget
            if kept:
                out.append(Candidate(sched, sim, f"{start.source}+{name}"))
            facts.append({"from": start.source, "by": name, "seconds": round(
                time.perf_counter() - t0, 3), "time": start.sim.time,
                "polished": sim.time if kept else None})
    report["polish"] = facts
    return out


def _refine(graph: Graph, budget: int, cfg: Any, found: Paths, report: dict[str, Any],
            bound: float | None = None) -> list[Candidate]:
    """Each ``refine`` solver in turn on the fastest candidate so far (the polish's included),
    each from the schedule the previous one left: the faster schedules it finds, named
    ``<source>+<refiner>``. Why after the polish: a refiner such as ``hilp-window`` re-solves
    a MILP around one schedule, so it starts from the best there is rather than from several.
    Nothing runs when that candidate is the flat H-ILP's proven optimum or meets ``bound``
    (the moment bound at ``budget``, when the caller has it)."""
    from hiremate.registry import make_solver

    start = min(found.candidates, key=lambda c: (c.sim.time, c.sim.peak, c.source))
    if start.detail.get("optimal") or (bound is not None and start.sim.time <= bound):
        report["refine"] = [{"from": start.source, "skipped": "optimal"}]
        return []
    out: list[Candidate] = []
    facts = []
    for name in cfg.refine:
        t0 = time.perf_counter()
        solver = make_solver(name, cfg.solver_params.get(name, {}))
        sched = solver.polish(graph, budget, start.schedule)
        sim = simulate(graph, sched) if sched is not None else None
        kept = (sim is not None and sim.valid and sim.peak <= budget
                and sim.time < start.sim.time)
        facts.append({"from": start.source, "by": name, "seconds": round(
            time.perf_counter() - t0, 3), "time": start.sim.time,
            "refined": sim.time if kept else None})
        if kept:
            start = Candidate(sched, sim, f"{start.source}+{name}")
            out.append(start)
    report["refine"] = facts
    return out


def _raise_nothing_fits(graph: Graph, budget: int, cfg: Any, found: Paths, ad_peak: int,
                        flat_used: bool, hier_used: bool) -> None:
    """No candidate: an InfeasibleBudgetError naming the lowest budget some solver meets, or a
    SolverError with every solver's reason."""
    solvers = [f"flat: {', '.join(cfg.flat)}" if flat_used else "",
               f"bottom: {', '.join(cfg.bottom)}, top: {', '.join(cfg.top)}" if hier_used else ""]
    names = "; ".join(s for s in solvers if s)
    if found.mins:
        low = min(found.mins.values())
        raise InfeasibleBudgetError(
            f"budget {fmt_bytes(budget)} is below the {fmt_bytes(low)} ({low} bytes) that "
            f"the configured solvers ({names}) need for this graph of {len(graph.nodes)} "
            f"compute nodes (autodiff peak {fmt_bytes(ad_peak)}, of which that is "
            f"{math.ceil(1000 * low / max(ad_peak, 1)) / 1000:.3f}); raise the budget to at "
            "least that, or configure a solver that recomputes more", min_budget=low)
    raise SolverError(f"no configured solver ({names}) produced a schedule: {found.errors}")


def _best(found: Paths, report: dict[str, Any], ad: SimulationResult) -> Candidate:
    """The fastest candidate (the lower peak breaks ties), described in ``report``."""
    best = min(found.candidates, key=lambda c: (c.sim.time, c.sim.peak))
    _describe_best(report, best, ad.peak, ad.time)
    fastest: dict[str, Candidate] = {}
    for c in sorted(found.candidates, key=lambda c: -c.sim.time):
        fastest[c.source] = c  # several pool entries may share a source: the fastest shown
    report.update({
        "candidates": {src: {"peak": c.sim.peak, "time": c.sim.time}
                       for src, c in fastest.items()},
        "min_budgets": found.mins, "errors": found.errors, "cached": False,
    })
    if "blocks" in best.detail:
        report["block_solvers"] = best.detail["blocks"]
    return best


def _schedule_pool(graph: Graph, gkey: str, cfg: Any, cache: Any) -> Any:
    """The pool of schedules recorded for ``graph`` under ``cfg`` (None when not reused)."""
    from hiremate.composer.pool import SchedulePool, pool_key

    if not getattr(cfg, "reuse_schedules", False) or not cache.enabled:
        return None
    config = _runtime_free(cfg)
    config.pop("reuse_schedules", None)
    return SchedulePool(graph, cache, pool_key(gkey, config))


def _pooled(pool: Any, budget: int) -> list[Candidate]:
    if pool is None:
        return []
    return [Candidate(s, sim, src if src.startswith("pool:") else f"pool:{src}")
            for s, sim, src in pool.fitting(budget)]


def _describe_best(report: dict, best: Candidate, ad_peak: int | None,
                   ad_time: float | None) -> None:
    report.update({
        "solver": best.source, "predicted_peak": best.sim.peak, "predicted_time": best.sim.time,
        "relative_peak": best.sim.peak / ad_peak if ad_peak else 1.0,
        "relative_time": best.sim.time / ad_time if ad_time else 1.0,
    })
    if best.source.startswith("pool:"):
        report.pop("block_solvers", None)


def _winners(problem: TopProblem, cand: Candidate) -> list[str]:
    """For each block, the solver(s) whose options the chosen block sequence runs."""
    if "block_solvers" in cand.detail:  # composers other than rk-Rotor say it themselves
        return list(cand.detail["block_solvers"])
    used: list[set[str]] = [set() for _ in problem.blocks]
    for op in cand.detail.get("ops", ()):
        if op.kind == "B":
            used[op.block - 1].add(problem.blocks[op.block - 1].options[op.option].solver)
    return ["+".join(sorted(u)) or "none" for u in used]
