"""Window search: the flat H-ILP re-solved over a sliding window of phases, the rest of a
schedule fixed (a large-neighbourhood search).

Why: the whole-graph MILP of :mod:`hiremate.solvers.hilp.flat` finds what the hierarchy's menus
cannot express (a layer run three times where the menus run it twice), but on a graph of a few
dozen layers its branch and bound takes minutes, so the default runs it only where the other
paths leave a wide gap to the moment bound. Fixing which nodes run in every phase outside a
window (``R[t, k]`` for ``t`` outside it) leaves a MILP of the same model that presolve shrinks
to the window's choices, solved in a fraction of a second; what each value's liveness and the
memory rows allow stays free over the whole schedule, so a window may also drop a value that an
earlier phase kept, to make room. Freeing only the window's liveness loses that: on a chain of
16 Linear layers at 0.4 such windows improved nothing, and these found the whole MILP's optimum
(docs/results-history.md, "Stop 70").

Windows of ``window`` phases start every ``stride`` phases, in order, round after round, until
a round wins less than ``round_gain`` (or ``max_rounds``); each MILP stops at
``work_limit`` branch-and-bound nodes on one HiGHS thread with a fixed seed, and a window's
schedule is kept only when the simulator finds it faster within the budget. So the result
depends on the inputs only; ``time_limit`` is a safety cap on the wall clock, logged when it
decides.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from hiremate.errors import ConfigError, InfeasibleBudgetError, SolverError
from hiremate.ir.graph import Graph
from hiremate.ir.schedule import Compute, Schedule
from hiremate.ir.simulator import simulate
from hiremate.ir.tracker import memory_floor
from hiremate.units import fmt_bytes

from hiremate.solvers.hilp.backends import solve_milp
from hiremate.solvers.hilp.flat import (
    Phases, assignment, index_order, phases_from_schedule, phases_from_solution,
    phases_to_schedule,
)
from hiremate.solvers.hilp.model import HilpModel, build_model

log = logging.getLogger(__name__)


#: HiGHS without strong branching on the windows' MILPs: on a 16-layer chain at 0.3 of its
#: autodiff peak it took most of their LP iterations and half their time, and the windows found
#: the same schedules without it (docs/results-history.md, "Stop 70")
WINDOW_HIGHS = {"mip_pscost_minreliable": 0}


@dataclass(frozen=True)
class WindowConfig:
    """``window`` phases per MILP, a new window every ``stride`` phases; ``work_limit``
    branch-and-bound nodes per window; at most ``max_rounds`` passes over the schedule, a pass
    after one that won less than ``round_gain`` (a fraction of the time) not run;
    ``max_nodes``: graphs above it are left alone (the model grows with the square of the
    graph, and every window's MILP carries all of it); ``time_limit``: the wall-clock safety
    cap of one search, in seconds."""

    window: int = 12
    stride: int = 6
    work_limit: int = 20
    mip_gap: float = 1e-6
    max_rounds: int = 4
    round_gain: float = 0.005
    max_nodes: int = 90
    time_limit: float = 300.0

    def __post_init__(self) -> None:
        for key in ("window", "stride", "work_limit", "max_rounds", "max_nodes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"hilp-window's {key} must be a positive integer, got "
                                  f"{value!r}")
        if self.stride > self.window:
            raise ConfigError(f"hilp-window's stride ({self.stride}) must be at most its "
                              f"window ({self.window}): phases between windows would never be "
                              "searched")
        if isinstance(self.round_gain, bool) or not 0 <= self.round_gain < 1:
            raise ConfigError(f"hilp-window's round_gain must be a fraction in [0, 1), got "
                              f"{self.round_gain!r}")
        if not self.time_limit > 0:
            raise ConfigError(f"hilp-window's time_limit must be positive seconds, got "
                              f"{self.time_limit!r}")


class HilpWindowSearch:
    """The flat H-ILP solved window by window from a schedule (module doc). As a polisher it
    improves a given schedule; as a flat solver it starts from the flat H-ILP's warm start."""

    name = "hilp-window"

    def __init__(self, config: WindowConfig | None = None, **overrides):
        config = config or WindowConfig()
        self.config = replace(config, **overrides) if overrides else config

    def applicable(self, graph: Graph) -> bool:
        return len(graph.nodes) <= self.config.max_nodes

    def schedule(self, graph: Graph, budget: int) -> Schedule:
        """The flat H-ILP's warm start (store-all, TW-Remat's schedules, the LP's roundings),
        improved window by window; :class:`~hiremate.InfeasibleBudgetError` when none of them
        fits, naming full recomputation's peak, which always does."""
        from hiremate.solvers.hilp.flat import HilpSolver, recompute_phases, warm_start

        # full recomputation is among the starts, so its peak is a budget always met
        lowest = simulate(graph, phases_to_schedule(graph, recompute_phases(graph))).peak
        phases = None
        if budget >= memory_floor(graph):
            model = build_model(graph, budget, None)
            phases = warm_start(graph, model, budget, None, lp_time=self.config.time_limit / 4,
                                hints=HilpSolver().heuristic_hints(graph))
        if phases is None:
            raise InfeasibleBudgetError(
                f"{self.name}: none of its starting schedules (store-all, TW-Remat's, the LP "
                f"relaxation's roundings, full recomputation) fits {fmt_bytes(budget)}; raise "
                f"the budget to {fmt_bytes(lowest)}, or use the flat H-ILP (hilp), whose "
                "search may find a schedule below that", min_budget=lowest)
        better = self._search(graph, budget, phases, model)
        return phases_to_schedule(graph, better if better is not None else phases)

    def polish(self, graph: Graph, budget: int, schedule: Schedule) -> Schedule | None:
        """A schedule of ``graph`` within ``budget`` faster than ``schedule`` (simulated), or
        None: when no window improves it, the graph is above ``max_nodes``, ``schedule`` is of
        blocks, or it has no phase form (a node first computed out of index order that cannot
        wait for its turn)."""
        if not self.applicable(graph) or any(
                isinstance(op, Compute) and op.option is not None for op in schedule):
            return None
        given = simulate(graph, schedule)
        if not given.valid or given.peak > budget:
            return None
        phases = phases_from_schedule(graph, schedule) or phases_from_schedule(
            graph, index_order(graph, schedule))
        if phases is None:
            log.info("hilp-window: the schedule has no phase form; left as it is")
            return None
        best = self._search(graph, budget, phases)
        if best is None:
            return None
        out = phases_to_schedule(graph, best)
        sim = simulate(graph, out)
        if sim.valid and sim.peak <= budget and sim.time < given.time * (1 - 1e-12):
            return out
        return None

    def _search(self, graph: Graph, budget: int, phases: Phases,
                model: HilpModel | None = None) -> Phases | None:
        """Better phases than ``phases`` (None when no window improves them); ``model``: the
        flat H-ILP of ``graph`` at ``budget`` when the caller has built it."""
        cfg = self.config
        T = len(graph.nodes)
        start_sim = simulate(graph, phases_to_schedule(graph, phases))
        if not start_sim.valid or start_sim.peak > budget:
            return None
        model = model or build_model(graph, budget, None)
        milp = model.milp
        rt, rk = np.tril_indices(T)
        r_cols = model.r(rt, rk)
        x = assignment(model, graph, phases)
        best_time, improved = start_sim.time, None
        starts = list(range(0, max(T - cfg.window, 0) + cfg.stride, cfg.stride))
        deadline = time.perf_counter() + cfg.time_limit
        last_gain = None  # the window that improved last: a round back to it without a gain ends
        solved = 0
        for _ in range(cfg.max_rounds):
            gained, round_start = False, best_time
            for a in starts:
                if a == last_gain and not gained:
                    return improved  # every window since that one left the schedule as it is
                if time.perf_counter() > deadline:
                    log.warning("hilp-window stopped by its time_limit (%gs) after %d windows: "
                                "the result depends on the machine's load; raise time_limit "
                                "or lower work_limit", cfg.time_limit, solved)
                    return improved
                outside = (rt < a) | (rt >= a + cfg.window)
                lo, hi = milp.col_lo.copy(), milp.col_hi.copy()
                lo[r_cols[outside]] = hi[r_cols[outside]] = x[r_cols[outside]]
                try:
                    res = solve_milp(replace(milp, col_lo=lo, col_hi=hi), "highs",
                                     max(deadline - time.perf_counter(), 1.0), cfg.mip_gap, x,
                                     1, work_limit=cfg.work_limit, highs_options=WINDOW_HIGHS)
                except SolverError as exc:  # no HiGHS: the schedule stays as it is
                    log.info("hilp-window: %s", exc)
                    return improved
                solved += 1
                log.debug("hilp-window: phases %d-%d: %s in %.2fs", a, a + cfg.window,
                          res.status, res.solve_time)
                if res.x is None:
                    continue
                candidate = phases_from_solution(model, res.x)
                sim = simulate(graph, phases_to_schedule(graph, candidate))
                if sim.valid and sim.peak <= budget and sim.time < best_time * (1 - 1e-9):
                    log.debug("hilp-window: phases %d-%d: %.6g -> %.6g", a, a + cfg.window,
                              best_time, sim.time)
                    best_time, improved, last_gain, gained = sim.time, candidate, a, True
                    x = assignment(model, graph, candidate)
            if not gained or best_time > round_start * (1 - cfg.round_gain):
                break  # another round would start from nearly the same schedule
        log.info("hilp-window on %d nodes: %d windows, %s", T, solved,
                 "improved" if improved is not None else "no gain")
        return improved
