"""H-ILP solvers: build the MILP once, hand it to a backend, turn the solution into a schedule.

``HilpSolver`` ("hilp") and ``CheckmateSolver`` ("checkmate") share the flat formulation of
:mod:`hiremate.solvers.hilp.model`; on a graph whose nodes have one option each, H-ILP *is*
rk-Checkmate (HiRemate, section 3.2.2, "Optimality w.r.t. partitioning").

Extraction does not trust the solver's deletion variables: the phases (which nodes run in each
phase, read from ``R``) are replayed with eager freeing (each value freed right after its last
read before it is produced again, or after it is produced if nobody reads it), which for a fixed
compute sequence uses the least memory; the result is checked with :func:`hiremate.simulate`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from hiremate.errors import ConfigError, InfeasibleBudgetError, SolverError
from hiremate.ir.graph import SOURCE_KINDS, Graph
from hiremate.ir.option import Option
from hiremate.ir.schedule import Compute, Delete, Schedule
from hiremate.ir.simulator import SimulationResult, simulate
from hiremate.ir.tracker import MemoryTracker, memory_floor
from hiremate.units import fmt_bytes

from hiremate.solvers.hilp.backends import BACKENDS, SAFETY_TIME, MilpResult, solve_milp
from hiremate.solvers.hilp.model import HilpModel, build_model, gcd_unit

log = logging.getLogger(__name__)

Phases = list[list[int]]


@dataclass(frozen=True)
class HilpConfig:
    """Solver settings. ``mip_gap`` is relative. ``work_limit`` is per MILP, in the backend's
    deterministic unit (:data:`~hiremate.solvers.hilp.backends.DEFAULT_WORK`: HiGHS and CBC
    branch-and-bound nodes, CP-SAT deterministic seconds; None: that default); when it runs
    out the best schedule found so far is returned, the same at any machine load.
    ``time_limit`` (seconds) is only a safety cap on the wall clock (a solve it stops may give
    another schedule on another run, and is logged as a warning); ``seed`` the backend's
    random seed. ``max_nodes`` is the applicability
    limit (the MILP grows with the square of the number of nodes). ``heuristic_hints``: offer
    TW-Remat's schedules to the warm start; at tight budgets HiGHS rarely improves on its
    starting point within a time limit, and full recomputation (the fallback) can be many
    times slower than what TW-Remat finds in a fraction of a second. ``large_work_limit``
    replaces ``work_limit`` on graphs of more than ``large_above`` compute nodes (both or
    neither): there a branch-and-bound node is costly (strong branching over thousands of
    binaries), and the composer polishes the schedules of the other paths, which recovers
    most of what the nodes would add (docs/results-history.md, "Stop 53"); on small graphs the nodes
    are cheap. The composer lifts the limit where no other path fits the budget."""

    backend: str = "highs"
    time_limit: float = SAFETY_TIME
    mip_gap: float = 1e-6
    threads: int = 1
    work_limit: float | None = None
    seed: int = 0
    warm_start: bool = True
    heuristic_hints: bool = True
    max_nodes: int = 250
    pulp_solver: str = "auto"
    large_above: int | None = None
    large_work_limit: float | None = None

    def work_key(self, n_nodes: int) -> str:
        """Which setting limits a MILP over a graph of ``n_nodes`` compute nodes."""
        if self.large_above is not None and n_nodes > self.large_above:
            return "large_work_limit"
        return "work_limit"


@dataclass
class HilpResult:
    """A solved instance: the schedule, the solver's status and figures, the simulation."""

    schedule: Schedule
    status: str
    objective: float
    bound: float
    build_time: float
    solve_time: float
    simulation: SimulationResult
    phases: Phases = field(default_factory=list)
    stats: dict = field(default_factory=dict)


# -- schedules from phases ------------------------------------------------------------------------
def phases_to_schedule(graph: Graph, phases: Phases) -> Schedule:
    """Compute steps of ``phases`` in order, each value freed as early as possible."""
    seq = [k for phase in phases for k in phase]
    deletable = [d.kind not in SOURCE_KINDS for d in graph.data]
    for o in graph.outputs:
        deletable[o] = False
    final = set(graph.final_data)
    nodes = graph.nodes
    # backwards scan: next event of each value after the current position
    nxt: dict[int, str] = {}
    frees: list[list[int]] = [[] for _ in seq]
    for i in range(len(seq) - 1, -1, -1):
        node = nodes[seq[i]]
        related = dict.fromkeys(node.inputs + node.outputs)
        for d in related:
            if not deletable[d]:
                continue
            event = nxt.get(d)
            if event == "use" or (event is None and d in final):
                continue
            frees[i].append(d)
        for d in node.outputs:
            nxt[d] = "prod"
        for d in node.inputs:
            nxt[d] = "use"
    steps: list[Compute | Delete] = []
    for i, k in enumerate(seq):
        steps.append(Compute(k))
        steps.extend(Delete(d) for d in sorted(frees[i]))
    return tuple(steps)


def autodiff_phases(graph: Graph) -> Phases:
    """Store-everything: each phase runs only its own node."""
    return [[t] for t in range(len(graph.nodes))]


def recompute_phases(graph: Graph) -> Phases:
    """Least memory in phase form: each phase recomputes every forward ancestor of its node
    (forward values then never outlive their phase); gradients are kept until read."""
    loss = graph.loss
    data = graph.data
    anc: list[set[int]] = []
    for node in graph.nodes:
        need: set[int] = set()
        for d in node.inputs:
            p = data[d].producer
            if p is not None and p < loss:
                need.add(p)
                need |= anc[p]
        anc.append(need)
    return [sorted(anc[t] | {t}) for t in range(len(graph.nodes))]


def phases_from_schedule(graph: Graph, schedule: Schedule) -> Phases | None:
    """The phases of a schedule found elsewhere (a hierarchical or heuristic solve), so that it
    can warm-start the flat MILP. Phase ``t`` holds the computations after the first one of
    node ``t - 1`` up to the first one of node ``t``, run in index order (the MILP's order
    inside a phase). None when nodes are first computed out of index order or a node runs
    twice in one phase: the flat model cannot express that schedule."""
    phases: Phases = [[] for _ in graph.nodes]
    t = 0  # the next node to run for the first time
    for step in schedule:
        if not isinstance(step, Compute):
            continue
        k = step.node
        if k > t:
            return None
        if k == t:
            phases[t].append(k)
            t += 1
        elif t >= len(phases) or k in phases[t]:
            return None
        else:
            phases[t].append(k)
    if t != len(graph.nodes):
        return None
    return [sorted(p) for p in phases]


def index_order(graph: Graph, schedule: Schedule) -> Schedule:
    """``schedule`` with each first computation that comes before its index's turn delayed to
    that turn (frees derived again): the flat H-ILP first computes nodes in index order, so
    only such a schedule has a phase form. TW-Remat's and the hierarchy's schedules often
    compute a node early (a hoisted constant, a branch taken first); delayed, they warm-start
    the MILP instead of being dropped. The original when the result is not valid."""
    from hiremate.ir.sequence import sequence_to_schedule

    out: list[int] = []
    early: set[int] = set()
    t = 0
    for step in schedule:
        if not isinstance(step, Compute):
            continue
        k = step.node
        if k < t:
            out.append(k)
        elif k == t:
            out.append(k)
            t += 1
            while t in early:
                early.discard(t)
                out.append(t)
                t += 1
        else:
            early.add(k)  # runs at its turn (a repeat before then is dropped)
    if early or t != len(graph.nodes):
        return schedule
    moved = sequence_to_schedule(graph, out)
    return moved if simulate(graph, moved).valid else schedule


def warm_start(graph: Graph, model: HilpModel, budget: int, save_budget: int | None,
               lp_time: float, hints: Sequence[Schedule] = ()) -> Phases | None:
    """A feasible schedule to start from: store-all, else the best of ``hints`` (schedules from
    other solvers), the LP relaxation rounded at a few thresholds and full recomputation; the
    fastest that fits. Any phases give a valid schedule once freed eagerly (checked in the
    simulator below), so only the budgets need checking."""
    def fits(phases: Phases) -> float:
        sched = phases_to_schedule(graph, phases)
        sim = simulate(graph, sched)
        if not sim.valid or sim.peak > budget:
            return math.inf
        if save_budget is not None and _memory_before_loss(graph, sched, sim) > save_budget:
            return math.inf
        return sim.time

    base = autodiff_phases(graph)
    if fits(base) < math.inf:
        return base
    candidates = [recompute_phases(graph)]
    for hint in hints:
        ph = phases_from_schedule(graph, hint)
        if ph is None:  # first computations out of index order: delay them to their turn
            ph = phases_from_schedule(graph, index_order(graph, hint))
        if ph is not None:
            candidates.append(ph)
        else:
            log.info("H-ILP warm start: a hinted schedule has no phase form; skipped")
    try:
        lp = solve_milp(model.milp, "highs", time_limit=lp_time, relax=True)
    except SolverError as exc:  # no HiGHS for the relaxation: start from the other candidates
        log.warning("H-ILP warm start without the LP relaxation: %s", exc)
        lp = None
    if lp is not None and lp.x is not None:
        T = len(graph.nodes)
        rt, rk = np.tril_indices(T)
        val = lp.x[model.r(rt, rk)]
        for theta in (0.5, 0.25, 0.1, 0.75, 0.9, 0.01):
            on = (val >= theta) | (rt == rk)
            ph: Phases = [[] for _ in range(T)]
            for t, k in zip(rt[on].tolist(), rk[on].tolist()):
                if k != graph.loss or t == graph.loss:
                    ph[t].append(k)
            candidates.append(ph)
        for theta in (0.5, 0.25, 0.75, 0.1, 0.9):
            candidates.append(_phases_from_kept(graph, model, lp.x, theta))
    scored = [(fits(ph), i) for i, ph in enumerate(candidates)]
    best, i = min(scored)
    return candidates[i] if best < math.inf else None


def _phases_from_kept(graph: Graph, model: HilpModel, x: np.ndarray, theta: float) -> Phases:
    """Checkmate-style rounding: a forward value is kept into phase t when its LP ``P`` is at
    least ``theta``; each phase recomputes the producers of the values it needs and lacks."""
    T, loss = len(graph.nodes), graph.loss
    jof = {int(d): j for j, d in enumerate(model.data_ids)}
    phases: Phases = []
    for t in range(T):
        run = {t}
        stack = [t]
        while stack:
            k = stack.pop()
            for d in graph.nodes[k].inputs:
                p = graph.data[d].producer
                if p is None or p >= loss or p in run or p >= t:
                    continue
                idx = int(model.p(jof[d], t))
                if idx >= 0 and x[idx] >= theta:
                    continue
                run.add(p)
                stack.append(p)
        phases.append(sorted(run))
    return phases


def assignment(model: HilpModel, graph: Graph, phases: Phases) -> np.ndarray:
    """The full variable vector of ``phases`` with eager freeing (a warm start for backends):
    the schedule replayed by the simulator's :class:`~hiremate.ir.tracker.MemoryTracker`,
    memory in the model's ``mem_unit``."""
    milp = model.milp
    x = np.zeros(milp.shape[1])
    T = model.n_nodes
    ids = model.data_ids.tolist()
    jof = {d: j for j, d in enumerate(ids)}
    edge = {(int(j), int(k)): e for e, (j, k) in enumerate(zip(model.e_j, model.e_k))}
    schedule = phases_to_schedule(graph, phases)
    tracker = MemoryTracker(graph)
    unit = model.mem_unit
    every = np.arange(len(ids))

    def held(t: int) -> None:  # P[t, j]: value j alive when phase t starts
        alive = np.array([d in tracker.alive for d in ids], bool)
        idx = model.p(every, np.full(len(ids), t))
        x[idx[idx >= 0]] = alive[idx >= 0]

    pos = 0
    for t, phase in enumerate(phases):
        held(t)
        run = set(phase)
        for k in range(t + 1):
            x[model.v(t, k)] = tracker.memory / unit
            if k not in run:
                continue
            assert schedule[pos] == Compute(k)
            pos += 1
            x[model.r(t, k)] = 1
            for d in graph.nodes[k].outputs:
                if d in jof and d not in tracker.alive:
                    x[model.c(jof[d], t)] = 1
            tracker.compute(k)
            while pos < len(schedule) and isinstance(schedule[pos], Delete):
                d = schedule[pos].data
                x[model.d(edge[(jof[d], k)], t)] = 1
                tracker.delete(d)
                pos += 1
    held(T)
    return x


def phases_from_solution(model: HilpModel, x: np.ndarray) -> Phases:
    T = model.n_nodes
    rt, rk = np.tril_indices(T)
    on = x[model.r(rt, rk)] > 0.5
    phases: Phases = [[] for _ in range(T)]
    for t, k in zip(rt[on].tolist(), rk[on].tolist()):
        phases[t].append(k)
    return [sorted(p) for p in phases]


# -- solvers --------------------------------------------------------------------------------------
class HilpSolver:
    """Flat H-ILP over a CD-graph (rk-Checkmate when every node has one option)."""

    name = "hilp"
    #: menus take (peak, save) budget pairs: options that save less for the same peak
    menu_pairs = True

    def __init__(self, config: HilpConfig | None = None, **overrides):
        config = config or HilpConfig()
        self.config = replace(config, **overrides) if overrides else config
        self._twremat = None  # made on first use; caches its family per graph
        if self.config.backend not in BACKENDS:
            raise SolverError(f"unknown H-ILP backend {self.config.backend!r}; "
                              f"choose one of {', '.join(BACKENDS)}")
        if (self.config.large_above is None) != (self.config.large_work_limit is None):
            raise ConfigError("H-ILP's large_above and large_work_limit go together: give "
                              "both (the work limit on graphs above that many compute nodes) "
                              "or neither")

    def applicable(self, graph: Graph) -> bool:
        return len(graph.nodes) <= self.config.max_nodes

    def build(self, graph: Graph, budget: int, save_budget: int | None = None) -> HilpModel:
        unit = gcd_unit(graph) if self.config.backend == "cpsat" else None
        return build_model(graph, budget, save_budget, mem_unit=unit)

    def solve(self, graph: Graph, budget: int, save_budget: int | None = None,
              hints: Sequence[Schedule] = ()) -> HilpResult:
        """Solve, extract and simulate; raise InfeasibleBudgetError when no schedule exists.
        ``hints``: schedules from other solvers; the fastest that fits warm-starts the MILP, so
        the result is never slower than them (when the flat model can express them)."""
        floor = memory_floor(graph)
        if budget < floor:
            raise InfeasibleBudgetError(
                f"{self.name}: budget {fmt_bytes(budget)} is below {fmt_bytes(floor)}, the "
                "memory some node needs for its inputs, outputs and temporary buffers; "
                "raise the budget or partition the graph more finely", min_budget=floor)
        model = self.build(graph, budget, save_budget)
        hint_phases: Phases | None = None
        hint = None
        ws_start = time.perf_counter()
        if self.config.warm_start:
            hint_phases = warm_start(graph, model, budget, save_budget,
                                     lp_time=0.25 * self.config.time_limit,
                                     hints=list(hints) + self.heuristic_hints(graph))
            if hint_phases is not None:
                hint = assignment(model, graph, hint_phases)
        cfg = self.config
        work_key = cfg.work_key(len(graph.nodes))
        work = getattr(cfg, work_key)
        res: MilpResult = solve_milp(
            model.milp, cfg.backend,
            max(cfg.time_limit - (time.perf_counter() - ws_start), 0.05 * cfg.time_limit),
            cfg.mip_gap, hint, cfg.threads,
            pulp_solver=cfg.pulp_solver, work_limit=work, seed=cfg.seed)
        log.info("%s/%s on %d nodes, budget %s: %s, objective %.6g in %.2fs (+%.2fs build)",
                 self.name, cfg.backend, len(graph.nodes), fmt_bytes(budget), res.status,
                 res.objective, res.solve_time, model.build_time)
        if res.status == "infeasible" and hint_phases is None:
            raise InfeasibleBudgetError(
                f"{self.name}: no schedule of {len(graph.nodes)} nodes fits in "
                f"{fmt_bytes(budget)}" + (f" with at most {fmt_bytes(save_budget)} kept "
                                          "before the loss" if save_budget is not None else "")
                + "; raise the budget", min_budget=None)
        if not res.has_solution:  # time out, or infeasible within MEM_MARGIN: the warm start
            if hint_phases is None:
                exc = SolverError(
                    f"{self.name}/{cfg.backend} found no schedule within its limits "
                    f"({work_key} {work}, time_limit {cfg.time_limit:g}s) for "
                    f"{len(graph.nodes)} nodes; raise {work_key} or time_limit, or partition "
                    "the graph")
                exc.timed_out = True  # neither a schedule nor a proof: menus skip the budget
                raise exc
            phases, status = hint_phases, "hint"
        else:
            phases, status = phases_from_solution(model, res.x), res.status
        schedule = phases_to_schedule(graph, phases)
        sim = simulate(graph, schedule)
        if (not sim.valid or sim.peak > budget) and status != "hint" and hint_phases is not None:
            # sizes spanning many orders of magnitude (a 1-byte tensor beside a 1 TiB one) fall
            # below the backend's coefficient tolerance: keep the warm start, which was checked
            log.warning("%s: the MILP solution does not fit the simulator (%s); using the warm "
                        "start", self.name, sim.error or fmt_bytes(sim.peak) + " > budget")
            phases, status = hint_phases, "hint"
            schedule = phases_to_schedule(graph, phases)
            sim = simulate(graph, schedule)
        if status != "hint" and hint_phases is not None:
            # a limit may stop the MILP at an incumbent slower than its warm start (CBC and
            # CP-SAT take the start as a hint only): never return worse than the start
            hint_sched = phases_to_schedule(graph, hint_phases)
            hint_sim = simulate(graph, hint_sched)
            if hint_sim.time < sim.time:
                log.info("%s: the MILP stopped at %.6g, slower than its warm start (%.6g); "
                         "using the warm start", self.name, sim.time, hint_sim.time)
                phases, status, schedule, sim = hint_phases, "hint", hint_sched, hint_sim
        if not sim.valid or sim.peak > budget:
            raise SolverError(
                f"{self.name}: the extracted schedule disagrees with the simulator "
                f"({sim.error or 'peak ' + fmt_bytes(sim.peak) + ' > ' + fmt_bytes(budget)}); "
                "this is a bug in the H-ILP formulation, please report it")
        return HilpResult(schedule, status, res.objective, res.bound, model.build_time,
                          res.solve_time, sim, phases, dict(model.stats))

    def heuristic_hints(self, graph: Graph) -> list[Schedule]:
        """TW-Remat's schedules of ``graph``, offered to the warm start (none with
        ``heuristic_hints`` off); the window search starts from them too."""
        if not self.config.heuristic_hints:
            return []
        from hiremate.solvers.twremat import TWRemat

        if self._twremat is None:
            self._twremat = TWRemat()
        if not self._twremat.applicable(graph):
            return []
        return [c.schedule for c in self._twremat.candidates(graph)]

    def schedule(self, graph: Graph, budget: int) -> Schedule:
        return self.solve(graph, budget).schedule

    def menu(self, graph: Graph, budgets) -> list[Option]:
        """Pareto-optimal options over ``budgets``: ints (peak) or (peak, save) pairs (an
        infeasible status is a proof, so budgets it dominates are not solved)."""
        from hiremate.solvers.menu import solve_menu

        return solve_menu(self, graph, budgets, exact=True)


class CheckmateSolver(HilpSolver):
    """rk-Checkmate: the flat case of H-ILP, for graphs of plain compute nodes."""

    name = "checkmate"


def lower_bound(graph: Graph, budget: int, save_budget: int | None = None,
                time_limit: float = 600.0) -> float | None:
    """Value of the LP relaxation, solved to optimality within ``time_limit`` seconds: no
    schedule within ``budget`` is faster. ``inf`` when even the relaxation is infeasible;
    None when the LP stopped before its optimum (a point it stopped at bounds nothing)."""
    model = build_model(graph, budget, save_budget)
    res = solve_milp(model.milp, "highs", time_limit=time_limit, relax=True)
    if res.status == "optimal":
        return res.objective
    if res.status == "infeasible":
        return math.inf
    log.info("lower_bound: the LP relaxation stopped %s after %.3gs: no bound",
             res.status, res.solve_time)
    return None


def _memory_before_loss(graph: Graph, schedule: Schedule, sim: SimulationResult) -> int:
    """Memory held just before the loss step (``sim`` is the valid simulation of ``schedule``)."""
    cut = schedule.index(Compute(graph.loss))
    return sim.profile[cut - 1] if cut else 0


HILP_SOLVERS = {"hilp": HilpSolver, "checkmate": CheckmateSolver}
