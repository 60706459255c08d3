"""``HilpTop``: the hierarchical H-ILP as a top-level composer over a sequence of blocks.

Same role as :class:`hiremate.solvers.chain.rk_rotor_top.RkRotorTop`: given the blocks (with option
menus) and a budget, return candidate schedules of the *full* graph, each simulated. The MILP's
memory model (:mod:`hiremate.solvers.hilp.hier`) bounds the full graph's memory from above, but the
simulator is the truth: the translated compute sequence gets its frees from
:func:`~hiremate.ir.sequence.sequence_to_schedule` (eager, never later than the MILP's), and when
its simulated peak leaves room below the budget, the MILP is solved again with a higher abstract
budget (or a lower one when it overshoots), ``retries`` times at most, two budgets a round.

Then, ``refine_rounds`` times at most, the menus of the large blocks are refined for the
context of the fastest schedule found (:mod:`hiremate.solvers.hilp.refine`: each block's H-ILP
solved again at the memory the rest of that schedule leaves to it) and the top level is solved
again with them, starting from the abstract budget that worked; the rounds stop as soon as one
brings no new option or no faster schedule. Every candidate of every round is returned.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from hiremate.errors import ConfigError, SolverError
from hiremate.ir.graph import Graph
from hiremate.ir.simulator import SimulationResult, simulate
from hiremate.units import fmt_bytes

from hiremate.solvers.hilp.backends import SAFETY_TIME, backend_and_work, solve_milp
from hiremate.solvers.hilp.hier import (
    HierModel, TopGraph, build_hier_model, carry_solution, lowest_budget_met, solution_sequence,
    top_graph,
)
from hiremate.solvers.hilp.starts import COLD_SHARE, chain_start, from_cold, plan_start
from hiremate.solvers.hilp.topgraph import block_solvers, gcd_unit_top

if TYPE_CHECKING:
    from typing import Iterable

    from hiremate.ir.blocks import Candidate, TopProblem
    from hiremate.ir.option import Option

log = logging.getLogger(__name__)

#: a schedule that leaves less than this fraction of the budget unused is not solved again at
#: a higher abstract budget: each retry is a whole MILP, and the last percent of memory buys
#: fractions of a percent of time
RETRY_ROOM = 0.02


@dataclass
class TopSolution:
    """One solved top-level MILP, translated and simulated."""

    abstract_budget: int
    status: str
    objective: float
    bound: float
    seconds: float
    sequence: list[int]
    steps: list
    sim: SimulationResult | None
    model: HierModel | None = None  # the MILP and its solution, to warm-start a later one
    x: np.ndarray | None = None


class HilpTop:
    """Hierarchical H-ILP (HiRemate, section 3.2.2 and appendix B) at the top
    level: blocks are compute nodes with option menus, phantoms carry what a block's forward
    keeps for its backward."""

    name = "hilp-top"
    composer = True
    #: option-specific dependencies (:func:`~hiremate.solvers.hilp.hier.top_graph`); False:
    #: every option of a block keeps all that any of them reads (the union model, for tests)
    option_deps = True

    def __init__(self, time_limit: float = SAFETY_TIME, mip_gap: float = 1e-4, retries: int = 4,
                 backend: str = "highs", threads: int = 1, checkpoint: bool = True,
                 refine_rounds: int = 1, refine_min: int = 8, refine_time: float = SAFETY_TIME,
                 pulp_solver: str = "auto", work_limit: float | None = None, seed: int = 0,
                 refine_solves: int = 16, refine_work: float | None = None, workers: int = 1,
                 menu_work: float | None = None, cold_share: float = COLD_SHARE):
        """``backend``: the MILP backend (:data:`~hiremate.solvers.hilp.backends.BACKENDS`;
        with ``pulp``, ``pulp_solver`` names PuLP's solver, e.g. ``CBC``). ``work_limit``:
        per top-level MILP, in the backend's deterministic unit
        (:data:`~hiremate.solvers.hilp.backends.DEFAULT_WORK`; None: that default), the limit
        that decides, so that a solve gives the same schedule at any load; ``time_limit``:
        a wall-clock safety cap in seconds; ``seed``: the backend's seed.
        ``refine_rounds``: context-aware menu refinement rounds (0: off) for the blocks of
        at least ``refine_min`` forward nodes, at most ``refine_solves`` block H-ILPs per
        round, each with ``refine_work`` (None: the default work limit) and a wall-clock cap
        of ``refine_time`` seconds. ``workers``: threads that solve a round of the top-level
        search at once (the composer passes the configuration's cores; the schedule does not
        depend on them). ``menu_work``: the work limit of each MILP of a subgraph's menu
        (:meth:`compose_menu`; None: ``work_limit``); a menu has many MILPs, each of which
        finds its schedule at the root as a rule, while the top-level solve has one budget.
        ``cold_share``: the share of a MILP's work limit spent on its first schedule when no
        plan fits its budget (:func:`~hiremate.solvers.hilp.starts.from_cold`; 1: all of it)."""
        from hiremate.solvers.hilp.backends import BACKENDS

        if backend not in BACKENDS:
            raise ConfigError(f"hilp-top: unknown backend {backend!r}; choose one of "
                              f"{', '.join(BACKENDS)}")
        self.time_limit = float(time_limit)
        self.mip_gap = float(mip_gap)
        self.retries = int(retries)
        self.backend = backend
        self.threads = int(threads)
        self.checkpoint = bool(checkpoint)
        if int(refine_rounds) != refine_rounds or refine_rounds < 0:
            raise ConfigError(f"hilp-top: refine_rounds={refine_rounds} must be a whole "
                              "number >= 0 (0 turns the menu refinement off)")
        self.refine_rounds = int(refine_rounds)
        self.refine_min = int(refine_min)
        self.refine_time = float(refine_time)
        self.pulp_solver = str(pulp_solver)
        self.work_limit = None if work_limit is None else float(work_limit)
        self.seed = int(seed)
        self.refine_solves = int(refine_solves)
        self.refine_work = None if refine_work is None else float(refine_work)
        self.workers = max(int(workers), 1)
        if menu_work is not None and not float(menu_work) > 0:
            raise ConfigError(f"hilp-top: menu_work={menu_work} must be a positive work limit "
                              "(or null for work_limit)")
        self.menu_work = None if menu_work is None else float(menu_work)
        if not 0 < float(cold_share) <= 1:
            raise ConfigError(f"hilp-top: cold_share={cold_share} must be in (0, 1]")
        self.cold_share = float(cold_share)

    def applicable(self, graph: Graph) -> bool:
        return True

    def memory_unit(self, top: TopGraph, budget: int) -> float:
        """The memory scale of the top-level models: the budget (coefficients near 1 for the
        LP-based backends), or for CP-SAT, which needs integer coefficients, the largest
        integer dividing every memory figure (exact)."""
        if self.backend == "cpsat":
            return float(gcd_unit_top(top))
        return float(max(budget, 1))

    def solve_at(self, problem: "TopProblem", top: TopGraph, abstract: int,
                 start_from: TopSolution | None = None,
                 mem_unit: float | None = None, save_budget: int | None = None,
                 work_limit: float | None = None, chains: "Iterable[tuple]" = ()
                 ) -> TopSolution:
        """Solve the MILP of ``top`` under ``abstract`` bytes; translate and simulate.
        ``start_from``: a solution of a model of the same top graph, at most as many options
        per block, the same ``mem_unit`` and a budget no higher, offered to the backend as a
        starting point (it satisfies the new model, so a time-limited solve can only improve
        on it). ``mem_unit``: the memory scale of the model (default:
        :meth:`memory_unit` of ``abstract``). ``save_budget``: the bound on the memory held
        just before the loss node runs (:func:`build_hier_model`). ``work_limit``: the MILP's,
        if not the solver's. ``chains``: block-chain operations (:meth:`compose`) whose
        points bound the result where the MILP is not solved to optimality: the fastest of
        them and the start is returned when the MILP's own schedule is slower or missing."""
        from hiremate.ir.sequence import sequence_to_schedule

        start = time.perf_counter()
        if mem_unit is None:
            mem_unit = self.memory_unit(top, abstract)
        hm: HierModel = build_hier_model(top, abstract, mem_unit, save_budget)
        starts = [plan_start(hm, self._milp)]
        if start_from is not None and start_from.model is not None:
            starts.append(carry_solution(start_from.model, start_from.x, hm))
        starts = [x for x in starts if x is not None]
        objective = lambda x: float(hm.milp.c @ x)  # noqa: E731
        hint = min(starts, key=objective) if starts else None
        if hint is None and self.cold_share < 1:
            backend, work = backend_and_work(
                hm.milp, self.backend, self.work_limit if work_limit is None else work_limit)
            res = from_cold(lambda x, w: self._milp(hm.milp, x, w), float(work),
                            backend != "cpsat", self.cold_share)
        else:
            res = self._milp(hm.milp, hint, work_limit)
        floors = [] if hint is None else [hint]
        if res.status != "optimal":
            # the other composers' schedules as floors only, not as the backend's start: given
            # as its start, a chain changes which of several optimal schedules the MILP
            # returns, and the polish of another one was slower as often as faster
            floors += [x for x in (chain_start(hm, ops, self._milp) for ops in chains)
                       if x is not None]
        floor = min(floors, key=objective) if floors else None
        if floor is not None and (not res.has_solution
                                  or res.objective > objective(floor) + 1e-9 * abs(res.objective)):
            # a limit stopped the MILP without reaching its warm start (a backend that takes
            # it as a hint only) or a chain's schedule: that point is a solution, never
            # return worse
            res = replace(res, status="feasible", x=floor, objective=objective(floor))
        secs = time.perf_counter() - start
        if not res.has_solution:
            return TopSolution(abstract, res.status, math.inf, res.bound, secs, [], [], None)
        seq, steps = solution_sequence(hm, res.x)
        sim = simulate(problem.graph, sequence_to_schedule(problem.graph, seq))
        log.info("hilp-top at %s: %s, objective %.6g, simulated %s in %.2fs (%s)",
                 fmt_bytes(abstract), res.status, res.objective,
                 fmt_bytes(sim.peak) if sim.valid else sim.error, secs, hm.stats)
        return TopSolution(abstract, res.status, res.objective, res.bound, secs, seq, steps, sim,
                           hm, res.x)

    def _milp(self, milp, hint=None, work_limit: float | None = None):
        """One top-level MILP with this solver's backend and limits (``work_limit``: this
        one's, if not the solver's)."""
        return solve_milp(milp, self.backend, self.time_limit, self.mip_gap, hint,
                          threads=self.threads, pulp_solver=self.pulp_solver,
                          work_limit=self.work_limit if work_limit is None else work_limit,
                          seed=self.seed)

    def compose(self, problem: "TopProblem", budget: int, save_budget: int | None = None,
                chains: "Iterable[tuple]" = ()) -> tuple[list["Candidate"], int | None]:
        """Candidates within ``budget`` (simulated) and the lowest simulated peak reached.
        ``chains``: other composers' schedules of these blocks as block-chain operations
        (rk-Rotor's), fastest first; the first :data:`CHAIN_FLOORS` become points of each
        top-level MILP (:func:`~hiremate.solvers.hilp.starts.chain_start`), so that a work
        limit never leaves it without a schedule, nor with one slower than the fastest of them
        that its model admits (:meth:`solve_at`).

        ``save_budget``: the memory held just before the loss node runs (after the step before
        it, :func:`simulated_save`) may not exceed it, in the MILP and in the simulator (the
        MILP's bound is an upper bound of the simulated save, as its peak is of the simulated
        peak; the candidates are checked all the same). The lowest peak is then that of the
        schedules within the save budget."""
        from hiremate.ir.blocks import Candidate
        from hiremate.ir.simulator import autodiff_schedule
        from hiremate.solvers.hilp.refine import refine

        found, lowest, kept = self._search(problem, budget, int(budget), save_budget=save_budget,
                                           chains=list(chains)[:CHAIN_FLOORS])
        for r in range(self.refine_rounds):
            if not kept:
                break
            best = min(kept, key=lambda c: c[0].sim.time)
            cand, top, steps, sol = best
            new_problem, facts = refine(problem, top, steps, cand.schedule, budget,
                                        self.refine_min, self.refine_time,
                                        max_solves=self.refine_solves,
                                        work_limit=self.refine_work)
            log.info("hilp-top refinement round %d: %s", r + 1, facts)
            if new_problem is None:
                break
            try:
                more, low, kept2 = self._search(new_problem, budget,
                                                int(cand.detail["abstract_budget"]), sol,
                                                save_budget)
            except SolverError as exc:
                if not getattr(exc, "timed_out", False):
                    raise
                log.warning("hilp-top refinement round %d stopped: %s", r + 1, exc)
                break
            found.extend(more)
            if low is not None:
                lowest = low if lowest is None else min(lowest, low)
            if not kept2 or min(c[0].sim.time for c in kept2) >= cand.sim.time:
                break
            problem, kept = new_problem, kept2
        # the store-everything schedule is always valid: a candidate whenever it fits (the MILP
        # may miss it at the budget's edge, e.g. with huge sizes), and a budget that always works
        store_all = autodiff_schedule(problem.graph)
        sim_all = simulate(problem.graph, store_all)
        if save_fits(problem.graph, store_all, sim_all, save_budget):
            if sim_all.peak <= budget and not found:
                found.append(Candidate(store_all, sim_all, self.name, {"store_all": True}))
            lowest = sim_all.peak if lowest is None else min(lowest, sim_all.peak)
        return found, lowest

    def compose_menu(self, problem: "TopProblem", budgets: "Iterable[tuple[int, int | None]]",
                     ceiling: int | None = None) -> list["Option"]:
        """Options of ``problem.graph`` (a subgraph's CD-graph, whose loss node stands for the
        rest of the model) for the level above: the schedule of one MILP at each
        ``(peak, save)`` budget (:meth:`solve_at`), simulated and summarised by
        :func:`~hiremate.solvers.menu.option_from_schedule`; their Pareto front. A budget with
        no candidate (infeasible, or no solution in the time limit) is skipped; none at all
        raises :class:`~hiremate.errors.InfeasibleBudgetError`, as
        :func:`~hiremate.solvers.menu.solve_menu` does. ``ceiling`` (default: the highest
        budget given): the peak that sets the MILPs' memory scale and the loose fallback
        budget; a part of a budget grid passes the grid's top, so that its MILPs are the
        whole grid's. A save bound of the outputs alone (a phantom-free option) is met without
        its MILP where the same peak's looser saves have schedules: each of them behind a
        checkpoint (:func:`~hiremate.solvers.menu.checkpointed`), which costs one plain forward
        more than that schedule and, on the subgraphs measured, about what the MILP's root
        returns, in a fraction of its work (the tight-save MILPs were the slowest of a menu)."""
        from hiremate.errors import InfeasibleBudgetError
        from hiremate.ir.option import pareto_front
        from hiremate.ir.sequence import sequence_to_schedule
        from hiremate.solvers.menu import (
            InfeasibleBudgets, checkpointed, loosest_first, option_from_schedule, option_steps,
            output_bytes,
        )

        # one MILP per budget: a menu needs schedules spread over the budgets, not one that
        # meets each exactly, so there are no retries (the MILP's memory bounds the simulated
        # one from above, so its schedule is within the budget as a rule)
        budgets = list(budgets)
        top = top_graph(problem, self.checkpoint, option_deps=self.option_deps)
        ceiling = max([int(p) for p, _ in budgets] + ([] if ceiling is None else [ceiling]))
        unit = self.memory_unit(top, ceiling)
        # the MILP's memory bounds the simulated one from above, so near a subgraph's own
        # floor (one node's peak dominating: a language model's head) a budget the simulator
        # meets can be infeasible for the MILP; such a budget falls back to the save bound
        # alone, then to the peak alone, so that options trading save for time still come
        loose = 2 * ceiling
        found: dict[int, Option] = {}
        tried: dict[tuple, TopSolution | None] = {}
        # every MILP here has one memory scale, so a budget proved infeasible settles the
        # tighter ones: the saves of a peak are solved loosest first, the options kept in order.
        # A budget whose MILP found no schedule within its work limit settles them too: a
        # tighter one, with the same limit, would only spend as much again to find none (so
        # does one its wall-clock cap stopped, a result that already depends on the load)
        settled = InfeasibleBudgets()
        # a save bound of the outputs alone asks for a phantom-free option: the schedules of
        # the looser saves of the same peak (solved before it) behind a checkpoint give one
        # each, for a plain forward more and a fraction of the MILP's work, which runs only
        # where that peak has no other schedule
        outputs = output_bytes(problem.graph)
        behind: list[Option] = []
        for i in loosest_first(budgets):
            peak, save = budgets[i]
            same_peak = [j for j in sorted(found) if int(budgets[j][0]) == int(peak)]
            if save is not None and int(save) <= outputs and same_peak:
                behind += [checkpointed(problem.graph, option_steps(found[j]), self.name)
                           for j in same_peak]
                continue
            sol = None
            for p_try, s_try in ((int(peak), save), (loose, save), (int(peak), None)):
                key = (p_try, None if s_try is None else int(s_try))
                if key in tried:  # the loose budget, met at a lower peak: its schedule again,
                    sol = tried[key]  # as a part of the grid solved alone finds it
                    if sol is not None and sol.sim is not None:
                        break
                    continue
                tried[key] = None
                if settled.settles(*key):  # sol stays the last try's, which had no schedule
                    log.debug("hilp-top menu: budget %s: settled (a looser one had no schedule)",
                              key)
                    continue
                sol = tried[key] = self.solve_at(problem, top, p_try, mem_unit=unit,
                                                 save_budget=key[1], work_limit=self.menu_work)
                if sol.sim is not None:
                    break
                settled.add(*key)  # infeasible, or no schedule within the limits
                log.debug("hilp-top menu: budget %s: %s", key, sol.status)
            if sol is None or sol.sim is None:
                continue
            if not sol.sim.valid:
                raise SolverError(f"hilp-top produced an invalid schedule (a bug): "
                                  f"{sol.sim.error}")
            sched = sequence_to_schedule(problem.graph, sol.sequence)
            found[i] = option_from_schedule(problem.graph, sched, self.name)
        options = [found[i] for i in sorted(found)] + behind
        if not options:
            raise InfeasibleBudgetError(
                f"{self.name}: none of the {len(budgets)} menu budgets is feasible; widen the "
                "grid (budget_grid) or raise the budgets")
        return pareto_front(options)

    def _search(self, problem: "TopProblem", budget: int, abstract: int,
                start_from: TopSolution | None = None, save_budget: int | None = None,
                chains: list[tuple] | None = None
                ) -> tuple[list["Candidate"], int | None, list[tuple]]:
        """The MILP at ``abstract`` (warm-started from ``start_from`` when its abstract budget
        is not higher), then at abstract budgets searched so that the simulated peak meets
        ``budget``: the candidates within it, the lowest simulated peak, and ``(candidate,
        top graph, top steps, top solution)`` of each candidate (for the refinement).
        ``save_budget`` bounds every MILP's save (it is not searched: the abstract budget
        moves the peak only) and a schedule whose simulated save exceeds it counts as over
        the budget.

        After the first try, each round solves :data:`ROUND_TRIES` abstract budgets (on
        ``workers`` threads: HiGHS releases the GIL), each warm-started from the fastest
        schedule that fitted before the round; which budgets a round tries depends on the
        earlier rounds' results only, so the schedule does not depend on ``workers``."""
        top = top_graph(problem, self.checkpoint, self.option_deps)
        state = _Search(budget)
        # one memory scale for every try, so that a solution of a lower abstract budget is a
        # solution of a higher one too: each try starts from the fastest schedule that fitted
        # below it (a time-limited try then never returns a slower one)
        unit = self.memory_unit(top, budget)
        warm_from = start_from
        proposals, left = [abstract], max(self.retries, 1)
        while proposals and left > 0:
            proposals = proposals[:left]
            left -= len(proposals)
            hints = [warm_from if warm_from is not None and warm_from.abstract_budget <= a
                     else None for a in proposals]
            sols = self._solve_round(problem, top, proposals, hints, unit, save_budget,
                                     chains or [])
            for sol in sols:
                if self._record(problem, top, sol, state, save_budget) and (
                        sol.model is not None and (warm_from is None or warm_from.sim is None
                                                   or sol.sim.time < warm_from.sim.time)):
                    warm_from = sol
            if state.stop:
                break
            empty = [sol.status for sol in sols if sol.sim is None]
            if empty and not state.found:
                cold = (f", of which cold_share {self.cold_share:g} without a start"
                        if self.cold_share < 1 else "")
                exc = SolverError(f"hilp-top found no solution within its limits (work_limit "
                                  f"{self.work_limit}{cold}, time_limit {self.time_limit:g}s; "
                                  f"{empty[0]}); raise its work_limit or time_limit")
                exc.timed_out = True
                raise exc
            proposals = state.next_budgets()
        log.info("hilp-top: %d top nodes, tries (abstract, status, simulated peak) %s",
                 len(top.graph.nodes), state.tried)
        return state.found, state.lowest, state.kept

    def _solve_round(self, problem: "TopProblem", top: TopGraph, budgets: list[int],
                     hints: list[TopSolution | None], unit: float,
                     save_budget: int | None, chains: list[tuple]) -> list[TopSolution]:
        """:meth:`solve_at` at each of ``budgets`` (with its hint), on up to ``workers``
        threads; the solutions in the order of ``budgets``."""
        def one(i: int) -> TopSolution:
            return self.solve_at(problem, top, budgets[i], start_from=hints[i], mem_unit=unit,
                                 save_budget=save_budget, chains=chains)

        if self.workers < 2 or len(budgets) < 2:
            return [one(i) for i in range(len(budgets))]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(self.workers, len(budgets)),
                                thread_name_prefix="hiremate-hilp-top") as pool:
            return list(pool.map(one, range(len(budgets))))

    def _record(self, problem: "TopProblem", top: TopGraph, sol: TopSolution,
                state: "_Search", save_budget: int | None) -> bool:
        """One try's outcome, into ``state``: a candidate when it fits (then True), the
        search's bounds."""
        from hiremate.ir.blocks import Candidate
        from hiremate.ir.sequence import sequence_to_schedule

        abstract, sim = sol.abstract_budget, sol.sim
        state.tried.append((abstract, sol.status, sim.peak if sim else None))
        if sim is None:
            # a lower abstract budget is infeasible too, or a retry ran out of time: keep the
            # schedules the other tries found
            state.stop = state.stop or sol.status == "infeasible" or bool(state.found)
            return False
        if not sim.valid:
            raise SolverError(f"hilp-top produced an invalid schedule (a bug): {sim.error}")
        sched = sequence_to_schedule(problem.graph, sol.sequence)
        if not save_fits(problem.graph, sched, sim, save_budget):
            # not expected (the MILP bounds the save from above): count it as too high
            log.warning("hilp-top at %s: simulated save %s over the save budget %s",
                        fmt_bytes(abstract), fmt_bytes(simulated_save(problem.graph, sched,
                                                                      sim)),
                        fmt_bytes(save_budget))
            state.over(abstract, sim.peak)
            state.stop = True
            return False
        state.lowest = sim.peak if state.lowest is None else min(state.lowest, sim.peak)
        seen = tuple(sol.sequence)
        if sim.peak > state.budget:
            proved = sol.status == "optimal" and sol.model is not None
            state.over(abstract, sim.peak, lowest_budget_met(sol.model, sol.x) if proved else None)
            return False
        if seen in state.sequences:
            state.stop = True  # a higher abstract budget gave the same schedule
            return False
        state.sequences.add(seen)
        state.found.append(Candidate(sched, sim, self.name, {
            "abstract_budget": abstract, "objective": sol.objective, "bound": sol.bound,
            "status": sol.status, "seconds": sol.seconds,
            "block_solvers": block_solvers(top, sol.steps)}))
        state.kept.append((state.found[-1], top, sol.steps, sol))
        state.fit(abstract, sim.peak, sol.status == "optimal")
        return True


#: other composers' schedules made points of each top-level MILP: a chain's point costs a MILP
#: whose choices are all fixed (hundredths of a second), and the fastest few cover the budgets
#: the search tries
CHAIN_FLOORS = 3

#: abstract budgets a round of the top-level search tries after its first try
ROUND_TRIES = 2


class _Search:
    """The state of :meth:`HilpTop._search`: what was tried and found, the highest abstract
    budget known to fit (``ok``, with its simulated peak ``ok_peak``) and the simulated peak of
    each abstract budget that overflowed (``over_at``; the lowest above ``ok`` bounds the
    search; ``same_from``: for an overflow whose MILP was solved to optimality, the lowest
    abstract budget that still admits its solution, down to which it stays optimal)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.found: list = []
        self.kept: list[tuple] = []
        self.lowest: int | None = None
        self.tried: list[tuple] = []
        self.sequences: set[tuple[int, ...]] = set()
        self.stop = False
        self.ok: int | None = None
        self.ok_peak = 0
        self.ok_proved = True
        self.over_at: dict[int, int] = {}
        self.same_from: dict[int, int] = {}

    def fit(self, abstract: int, peak: int, proved: bool = True) -> None:
        """A try at ``abstract`` fitted with simulated ``peak``; ``proved``: its MILP was
        solved to optimality (not stopped by its work limit)."""
        if self.ok is None or abstract > self.ok:
            self.ok, self.ok_peak, self.ok_proved = abstract, peak, proved

    def over(self, abstract: int, peak: int, same_from: int | None = None) -> None:
        self.over_at[abstract] = peak
        if same_from is not None:
            self.same_from[abstract] = min(same_from, abstract)

    def next_budgets(self) -> list[int]:
        """The next round's abstract budgets (ascending; none: the search is done). Above a
        fitting try whose schedule leaves more than :data:`RETRY_ROOM` of the budget unused:
        that room and half of it; between a fit and an overflow: the interval's thirds, until
        it is within ``RETRY_ROOM``; below an overflow with nothing fitting: the overflow and
        twice it. Nothing above a fitting try that its work limit stopped: the room such a
        schedule leaves is the unfinished search's more than the memory model's, and a higher
        budget only widens a search that did not finish the narrower one (FNO3d's whole step:
        the try above gave the same schedule, at the cost of another MILP)."""
        limit = RETRY_ROOM * self.budget
        above = [a for a in self.over_at if self.ok is None or a > self.ok]
        bad = min(above) if above else None
        if self.ok is not None:
            room = self.budget - self.ok_peak
            if room <= limit or not self.ok_proved:
                return []
            if bad is None:
                wanted = [self.ok + room // 2, self.ok + room]
            else:
                # below an overflow proved optimal, down to where its solution is still
                # admitted, a MILP finds its objective again (FNO3d: a third round gave the
                # same schedule)
                bad = max(min(self.same_from.get(a, a) for a in above), self.ok)
                if bad - self.ok <= limit:
                    return []
                third = (bad - self.ok) / 3
                wanted = [int(self.ok + third), int(self.ok + 2 * third)]
        elif bad is not None:
            excess = self.over_at[bad] - self.budget
            wanted = [bad - 2 * excess, bad - excess]
        else:
            return []
        tried = {t[0] for t in self.tried}
        return sorted({a for a in wanted if a > 0 and a not in tried})[:ROUND_TRIES]


def simulated_save(graph: Graph, schedule, sim: SimulationResult) -> int:
    """Memory held just before ``graph``'s loss node runs in ``schedule`` (after the step
    before it; 0 when the loss comes first): what
    :func:`~hiremate.solvers.menu.option_from_schedule` and
    :func:`~hiremate.solvers.menu.budget_grid` call the save, model outputs included."""
    from hiremate.ir.schedule import Compute

    cut = list(schedule).index(Compute(graph.loss))
    return sim.profile[cut - 1] if cut else 0


def save_fits(graph: Graph, schedule, sim: SimulationResult, save_budget: int | None) -> bool:
    """``schedule``'s simulated save is within ``save_budget`` (None: no bound)."""
    return save_budget is None or simulated_save(graph, schedule, sim) <= save_budget
