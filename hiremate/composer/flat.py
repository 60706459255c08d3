"""The flat path: whole-graph solvers on small graphs, and when the whole-graph H-ILP runs.

The flat H-ILP (rk-Checkmate on the whole graph) is the one solver here whose cost is not
small: near its size limit its MILP is large, and its root alone (cuts and sub-MIP heuristics,
which no branch-and-bound node limit bounds) outlasts the rest of the solve. On most such
graphs the hierarchy and its polish already find as good a schedule, so with ``flat_gap`` set
the MILP waits for them (:func:`gated_flat_hilp`) and runs only where their best schedule
leaves more than that fraction to the moment bound
(:func:`~hiremate.solvers.hilp.moment_bound.moment_time_bound`), which no in-order schedule
beats: where the bound leaves little to win, the MILP cannot win more. With
``flat_gap_columns`` that fraction shrinks with the MILP's size (:func:`gate_threshold`), since
a small MILP costs little. Figures: docs/results-history.md, "Stop 45" and "Stop 62".
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hiremate.composer.menus import _progress
from hiremate.errors import InfeasibleBudgetError, SolverError
from hiremate.ir.blocks import Candidate
from hiremate.ir.graph import Graph
from hiremate.ir.schedule import Schedule
from hiremate.ir.simulator import simulate
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)


@dataclass
class Paths:
    """What the flat and hierarchical paths found: candidates, the budgets each solver is known
    to meet (its lowest), and why the others found nothing."""

    candidates: list[Candidate] = field(default_factory=list)
    mins: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def guaranteed_min(solver: Any, graph: Graph) -> int | None:
    """A budget ``solver`` is known to meet on ``graph`` (None when unknown)."""
    from hiremate.solvers.hilp.flat import HilpSolver, phases_to_schedule, recompute_phases

    try:
        if isinstance(solver, HilpSolver):
            return simulate(graph, phases_to_schedule(graph, recompute_phases(graph))).peak
        if hasattr(solver, "candidates"):  # TW-Remat: its family's lowest peak
            return min(c.peak for c in solver.candidates(graph))
        if hasattr(solver, "min_budget") and getattr(solver, "name", "") != "fastsa":
            return int(solver.min_budget(graph))
    except Exception as exc:
        log.debug("min budget of %s: %s", getattr(solver, "name", solver), exc)
    return None


def flat_candidate(name: str, params: dict, graph: Graph, budget: int,
                   hints: Sequence[Schedule] = ()) -> tuple[Candidate | None, int | None, str]:
    """Run one flat solver: a candidate (or None), a budget it is known to meet, an error.
    ``hints``: schedules that warm-start an H-ILP (other solvers ignore them)."""
    from hiremate.registry import make_solver

    solver = make_solver(name, params)
    start = time.perf_counter()
    if not solver.applicable(graph):
        return None, None, "not applicable"
    low = guaranteed_min(solver, graph)
    optimal = False
    try:
        from hiremate.solvers.hilp.flat import HilpSolver

        if isinstance(solver, HilpSolver):  # its status says whether it proved optimality
            res = solver.solve(graph, budget, hints=hints)
            sched, optimal = tuple(res.schedule), res.status == "optimal"
        else:
            sched = tuple(solver.schedule(graph, budget))
    except InfeasibleBudgetError as exc:
        found = exc.min_budget if low is None else low
        return None, found, str(exc)
    except (SolverError, ValueError, RuntimeError) as exc:
        log.warning("flat solver %s failed (%s: %s); the other configured solvers are used",
                    name, type(exc).__name__, exc)
        return None, low, f"{type(exc).__name__}: {exc}"
    sim = simulate(graph, sched)
    if not sim.valid or sim.peak > budget:
        return None, low, (f"schedule rejected by the simulator: "
                           f"{sim.error or fmt_bytes(sim.peak) + ' > budget'}")
    return Candidate(sched, sim, name, {"seconds": time.perf_counter() - start,
                                        "optimal": optimal}), low, ""


def flat_path(graph: Graph, budget: int, cfg: Any, found: Paths, hold_hilp: bool = False
              ) -> bool:
    """Every flat solver of the configuration on the whole graph. With ``flat_rewarm`` (and a
    hierarchy configured), the flat H-ILP runs after the others, and only when one of them
    fitted the budget; otherwise it is deferred until the hierarchy's schedules can
    warm-start it (:func:`deferred_flat_hilp`), and True is returned. ``hold_hilp``: the flat
    H-ILP does not run here at all (:func:`gated_flat_hilp` decides later)."""
    names = list(cfg.flat)
    may_defer = cfg.flat_rewarm and "hilp" in names and bool(cfg.bottom and cfg.top)
    if may_defer or hold_hilp:
        names = [n for n in names if n != "hilp"] + ([] if hold_hilp else ["hilp"])
    for name in _progress(cfg, names, "flat level"):
        if name == "hilp" and may_defer and not found.candidates and applicable(name, cfg, graph):
            log.info("flat hilp deferred: no other flat solver fits %s, so its only warm start "
                     "would be full recomputation", fmt_bytes(budget))
            return True
        t0 = time.perf_counter()
        cand, low, err = flat_candidate(name, cfg.solver_params.get(name, {}), graph, budget)
        log.info("flat %s: %s in %.2fs", name, "ok" if cand else err, time.perf_counter() - t0)
        record_flat(found, name, cand, low, err)
    return False


def gated_flat_hilp(graph: Graph, budget: int, cfg: Any, found: Paths, report: dict[str, Any],
                    polish: Callable[[list[Candidate]], list[Candidate]],
                    bound: float | None = None, early: Any = None
                    ) -> tuple[list[Candidate], bool]:
    """The flat H-ILP that :func:`flat_path` held back, run only where the other paths leave
    more than the gate's threshold (:func:`gate_threshold`) to the moment bound (module doc).
    ``polish`` polishes a list of candidates (the configured polishers; [] when none): the gap
    is measured after it, since the polish often closes what the hierarchy's schedules leave.
    Returns that polish's candidates and whether they are the final polish: so when the MILP
    was skipped; when it ran (as without the gate: cold, then rewarmed; or deferred when
    no flat heuristic fitted), the caller polishes again with the MILP's schedules among the
    starts and keeps these too, since a start the MILP's source displaces may have polished to
    the fastest schedule. The report's ``flat_gate`` says which and why.
    ``bound``: the moment bound at ``budget`` when the caller has it; ``early``: the cold MILP
    planned to start beside the hierarchy (:mod:`hiremate.composer.early`), taken or cancelled
    here (``flat_gate``'s ``early``: whether it had started before the gate)."""
    from hiremate.solvers.hilp.moment_bound import moment_time_bound

    if "hilp" not in cfg.flat or not applicable("hilp", cfg, graph):
        return [], False  # no trial: the caller polishes
    trial = polish(list(found.candidates)) if found.candidates else []
    times = [c.sim.time for c in found.candidates + trial]
    if bound is None:
        bound = moment_time_bound(graph, budget) if times else math.inf
    gap = min(times) / bound - 1 if times and 0 < bound < math.inf else math.inf
    threshold = gate_threshold(graph, budget, cfg)
    ran = gap > threshold
    report["flat_gate"] = {"gap": None if math.isinf(gap) else round(gap, 6),
                           "threshold": round(threshold, 6), "ran": ran,
                           "early": early is not None and early.started}
    if not ran:
        if early is not None:
            early.cancel()  # stop it now, not when the solve returns
        log.info("flat hilp skipped: the best schedule is %.2f%% above the bound, within "
                 "the gate's %.2f%%", 100 * gap, 100 * threshold)
        return trial, True
    if not any(c.source in cfg.flat for c in found.candidates):
        deferred_flat_hilp(graph, budget, cfg, found, report)
        return trial, False
    t0 = time.perf_counter()
    if early is not None:
        cand, low, err = early.result()
        log.info("flat hilp (started early, %.2fs): %s, %.2fs after the gate", early.seconds,
                 "ok" if cand else err, time.perf_counter() - t0)
    else:
        cand, low, err = flat_candidate("hilp", cfg.solver_params.get("hilp", {}), graph,
                                        budget)
        log.info("flat hilp: %s in %.2fs", "ok" if cand else err, time.perf_counter() - t0)
    record_flat(found, "hilp", cand, low, err)
    if cfg.flat_rewarm:
        rewarm_flat(graph, budget, cfg, found, report)
    return trial, False


def gate_threshold(graph: Graph, budget: int, cfg: Any) -> float:
    """The gap to the moment bound above which the gated flat H-ILP runs: ``cfg.flat_gap``,
    scaled down in proportion to the MILP's columns below ``cfg.flat_gap_columns`` (when set).
    The gate trades what the MILP may win against what it costs, and its cost grows with its
    size: on a chain of a few dozen nodes it takes seconds and can still find a few per cent
    that the hierarchy's menus miss (docs/results-history.md, "Stop 62"). A ``hilp`` solver
    registered in place of H-ILP without a MILP to count keeps ``cfg.flat_gap``."""
    if cfg.flat_gap_columns is None:
        return cfg.flat_gap
    from hiremate.registry import make_solver

    solver = make_solver("hilp", cfg.solver_params.get("hilp", {}))
    if not callable(getattr(solver, "build", None)):
        return cfg.flat_gap
    columns = solver.build(graph, budget).stats["cols"]
    return cfg.flat_gap * min(1.0, columns / cfg.flat_gap_columns)


def applicable(name: str, cfg: Any, graph: Graph) -> bool:
    """Whether the configured solver ``name`` takes ``graph`` (its size limit)."""
    from hiremate.registry import make_solver

    return make_solver(name, cfg.solver_params.get(name, {})).applicable(graph)


def record_flat(found: Paths, name: str, cand: Candidate | None, low: int | None,
                err: str) -> None:
    if cand is not None:
        found.candidates.append(cand)
    if low is not None:
        found.mins[f"flat:{name}"] = low
    if err:
        found.errors[f"flat:{name}"] = err


def fastest_per_source(candidates: Sequence[Candidate], n: int) -> list[Candidate]:
    """The fastest candidate of each of the ``n`` fastest sources, fastest first."""
    first: dict[str, Candidate] = {}
    for c in sorted(candidates, key=lambda c: (c.sim.time, c.sim.peak, c.source)):
        first.setdefault(c.source, c)
    return list(first.values())[:n]


def deferred_flat_hilp(graph: Graph, budget: int, cfg: Any, found: Paths,
                        report: dict[str, Any], hints: int = 3) -> None:
    """The flat H-ILP that :func:`flat_path` deferred, run once, warm-started from the fastest
    schedule of each of the ``hints`` fastest sources. Started cold, its only warm start
    would be full recomputation: the zoo UNet at 0.35 spent its whole work limit (two
    minutes) near that start, and then :func:`rewarm_flat` ran it again from the
    hierarchy's schedule (docs/results-history.md). This is that second run without the first. When
    no path found any schedule, it runs with its whole work limit (:func:`whole_work`)."""
    starts = [c.schedule for c in fastest_per_source(found.candidates, hints)]
    t0 = time.perf_counter()
    params = cfg.solver_params.get("hilp", {})
    if not found.candidates:  # no other schedule, and no polish of one, would recover them
        params = whole_work(params)
    cand, low, err = flat_candidate("hilp", params, graph, budget, hints=starts)
    seconds = time.perf_counter() - t0
    log.info("flat hilp (deferred, %d warm starts): %s in %.2fs", len(starts),
             "ok" if cand else err, seconds)
    report["flat_deferred"] = {"seconds": round(seconds, 3), "warm_starts": len(starts),
                               "time": cand.sim.time if cand is not None else None}
    record_flat(found, "hilp", cand, low, err)


def whole_work(params: dict) -> dict:
    """H-ILP parameters without the large-graph work limit (``large_above``), for a run that
    nothing else fits beside (:func:`deferred_flat_hilp`): the limit leaves to the polish of
    the other paths' schedules what the MILP's branch-and-bound nodes would add."""
    return {k: v for k, v in params.items() if k not in ("large_above", "large_work_limit")}


def rewarm_flat(graph: Graph, budget: int, cfg: Any, found: Paths,
                 report: dict[str, Any], hints: int = 3) -> None:
    """The flat H-ILP once more, warm-started from the ``hints`` fastest schedules of the other
    paths, when they beat its own and it proved nothing: within its work limit a MILP seldom
    leaves its warm start's neighbourhood, and TW-Remat's, its own, can be far from the best
    (the FNOs: docs/results-history.md). Its schedule joins the candidates as ``hilp:rewarm``."""
    own = [c for c in found.candidates if c.source == "hilp"]  # none unless hilp is in flat
    if not own or own[0].detail.get("optimal"):
        return
    others = sorted((c for c in found.candidates if c.source not in cfg.flat),
                    key=lambda c: (c.sim.time, c.sim.peak, c.source))
    better = [c.schedule for c in others if c.sim.time < own[0].sim.time][:hints]
    if not better:
        return
    t0 = time.perf_counter()
    cand, _, err = flat_candidate("hilp", cfg.solver_params.get("hilp", {}), graph, budget,
                                  hints=better)
    report["flat_rewarm"] = {"seconds": round(time.perf_counter() - t0, 3),
                             "time": cand.sim.time if cand is not None else None,
                             "error": err or None}
    if cand is not None:
        found.candidates.append(Candidate(cand.schedule, cand.sim, "hilp:rewarm", cand.detail))
