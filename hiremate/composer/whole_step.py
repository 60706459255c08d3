"""The whole training step within the budget: what the graph leaves out, shown to the solvers.

The solvers schedule the graph's nodes; a training step also holds what the user's loss
allocates, the output gradients autograd keeps until the backward returns, and the
random-generator states the executor saves for the random ops a schedule reruns
(:func:`hiremate.ir.simulator.step_peak`). :func:`solve_whole_step` gives the solvers a view of
the graph in which all of that is memory they place (:mod:`hiremate.composer.step_view`),
and walks down to a lower budget only when a schedule still overflows; it lives here, below
the API, so that every caller that solves a graph (:func:`hiremate.api.solve_graph`, the
sweeps) gets the same rule.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from hiremate.composer.step_view import rng_state_reserve, step_view
from hiremate.config import Config
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.budget import resolve_budget
from hiremate.ir.buffer_writes import snapshot_reserve
from hiremate.ir.graph import Graph
from hiremate.ir.simulator import autodiff_schedule, simulate, step_peak
from hiremate.solvers.hilp.moment_bound import moment_time_bound
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)


def without_random_reruns(graph: Graph, view: Graph, budget: int, cfg: Config, solve: Any,
                          loss_bytes: int):
    """A schedule that reruns no random op, when the states kept for reruns are what overflow
    the budget (on a small model one state outweighs the activations): solved on a copy of
    ``view`` whose random ops cost a thousand times their time, so that the solvers recompute
    anything else first; None when that schedule does not fit either."""
    if not rng_state_reserve(graph):
        return None
    payload = view.to_dict()
    longest = max((n["time"] for n in payload["nodes"]), default=0.0) or 1e-6
    for node in payload["nodes"]:
        if node.get("random"):
            node["time"] = 1e3 * (node["time"] + longest)
    from hiremate.composer.menu_cache import MenuCache

    try:  # not cached: the penalised graph has the original's key
        result = solve(Graph.from_dict(payload), budget, cfg, MenuCache(enabled=False))
    except InfeasibleBudgetError:
        return None
    result.report["random_reruns"] = "avoided: their generator states would not fit"
    return result if whole_step_report(graph, result, budget, loss_bytes) <= budget else None


def whole_step_report(graph: Graph, result: Any, budget: int, loss_bytes: int) -> int:
    """Put the whole step's figures in ``result``'s report, those of ``graph`` (the solvers saw
    a view of it, whose times may be penalised and whose peaks are the step's); set its
    simulation to the graph's; return the step's predicted peak."""
    sim = result.sim = simulate(graph, tuple(result.schedule))
    autodiff = autodiff_schedule(graph)
    ad_time = simulate(graph, autodiff).time
    peak = step_peak(graph, result.schedule, loss_bytes)
    ad_peak = step_peak(graph, autodiff, loss_bytes)
    result.report.update(
        loss_bytes=loss_bytes, predicted_peak=peak, budget=int(budget),
        predicted_time=sim.time, autodiff_time=ad_time,
        relative_time=sim.time / ad_time if ad_time else 1.0,
        autodiff_peak=ad_peak, relative_peak=peak / ad_peak if ad_peak else 1.0,
        rng_state_bytes=(peak - step_peak(graph, result.schedule, loss_bytes, rng_states=False))
        if rng_state_reserve(graph) else 0)
    return peak


def step_budget(budget: int | float | str, graph: Graph, loss_bytes: int) -> int:
    """Bytes for ``budget``; a fraction is of the whole step's peak when every value is kept
    (eager PyTorch's step, the loss included), simulated only when the budget is one."""
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        return budget
    return resolve_budget(budget, graph,
                          reference=step_peak(graph, autodiff_schedule(graph), loss_bytes))


#: Reserving every generator state (what the walk's view leaves out) costs at most this
#: fraction of the budget; below it, the walk reserves them from its first solve (the reserve
#: that always works).
CHEAP_RESERVE = 0.02


def _hastened(reserves: list[int], full: int, budget: int) -> int:
    """The least next reserve after an overflow, so that the walk takes few solves (each costs
    about as much as the first: its schedule is new, only the menus are reused). Each new
    schedule peaks where a few more generator states are held, so walking down by
    the last overflow alone can take many solves of small steps. When reserving everything
    costs little of the budget it is taken at once; from the second overflow on, the reserve
    goes at least halfway to it (kept below the budget, where the infeasible branch of
    :func:`solve_whole_step` takes over)."""
    if full <= CHEAP_RESERVE * budget:
        return full
    if len(reserves) < 2:
        return 0
    return (reserves[-1] + min(full, budget - 1)) // 2


def _finished(graph: Graph, result: Any, budget: int, start: float, solves: int,
              loss_bytes: int):
    """``result`` with the walk's figures in its report: its time, its solves, and the time no
    in-order schedule of the step within the budget beats, so that a user reads how far the
    schedule can be from the best: :func:`~hiremate.solvers.hilp.moment_bound.
    moment_time_bound` of the step's view without generator states, whose peak is never above
    the step's (:mod:`~hiremate.composer.step_view`), so a schedule that fits the step fits it.
    ``solve_time`` is the search's; the bound's own seconds are ``time_bound_s``."""
    solved = time.perf_counter()
    view = step_view(graph, loss_bytes, rng_states=False).graph
    bound = moment_time_bound(view, budget)
    autodiff = result.report.get("autodiff_time") or 0.0
    result.report.update(solve_time=solved - start, whole_step_solves=solves,
                         time_bound=bound, time_bound_s=time.perf_counter() - solved,
                         relative_time_bound=bound / autodiff if autodiff else None)
    return result


def fitting_other(graph: Graph, result: Any, budget: int, loss_bytes: int,
                  schedule_of: Any = None):
    """The fastest of ``result.others`` (the solve's other candidates) whose whole step fits
    ``budget``, as a result with its own figures (the solve's report otherwise), or None.
    Why: a solve's winner may overflow the step where a slower candidate of the same solve
    fits, e.g. when a polish reruns a random op in the forward and so keeps its generator
    state there, which the solvers' view counts only from the loss; taking that candidate
    costs no solve. ``schedule_of``: the view's schedule as the graph's (None: the same)."""
    for cand in result.others:
        schedule = cand.schedule if schedule_of is None else schedule_of(cand.schedule)
        if step_peak(graph, schedule, loss_bytes) > budget:
            continue
        report = {k: v for k, v in result.report.items() if k != "block_solvers"}
        report.update(solver=cand.source, step_overflow_winner=result.report.get("solver"))
        other = copy.copy(result)
        other.schedule, other.sim, other.report, other.others = schedule, cand.sim, report, []
        whole_step_report(graph, other, budget, loss_bytes)
        return other
    return None


def solve_whole_step(graph: Graph, budget: int, cfg: Config, cache: Any, solve: Any,
                     loss_bytes: int):
    """``solve`` within ``budget`` for the whole step (:func:`hiremate.ir.simulator.step_peak`:
    the loss's memory, the output gradients autograd holds until the backward returns, and
    the generator states the executor saves for random ops it reruns). The solvers see the
    step (:mod:`~hiremate.composer.step_view`): first with each random op's generator state
    counted from the loss to the last node that may need the op rerun, which fits in one
    solve unless the states alone are dear; when that view has no schedule within the budget,
    or its schedule peaks in the forward with a state kept there, by the walk over the view
    without the states (:func:`_walk`), unless the lowest peak the solvers met with them, less
    every state, is still above the budget (then that error, after one solve). Of an
    overflowing solve, the fastest other candidate that fits the step (:func:`fitting_other`)
    is kept: the walk's result replaces it only when faster, and it is the answer when the
    walk finds nothing. The report's ``solve_time`` is the whole step's, and
    :func:`_finished` adds how many solves it took and the bound on the time."""
    start, walk = time.perf_counter(), _Walk()
    states = rng_state_reserve(graph)
    if states:
        walk.solves += 1
        view = step_view(graph, loss_bytes, rng_states=True)
        try:
            result = solve(view.graph, budget, cfg, cache)
            result.schedule = view.schedule_of(result.schedule)
        except InfeasibleBudgetError as exc:
            low = exc.min_budget
            if low is not None and low - states > budget:
                # the states weigh at most that reserve in what the solvers saw: without them
                # the lowest peak they meet is still above the budget, so each of the walk's
                # solves (whole solves, tens of seconds on a language model) would end the same
                raise
            log.info("no schedule within %s with the generator states counted (%s); "
                     "walking down without them", fmt_bytes(budget), exc)
        else:
            peak = whole_step_report(graph, result, budget, loss_bytes)
            if peak <= budget:
                return _finished(graph, result, budget, start, walk.solves, loss_bytes)
            log.info("whole step %s over %s with the generator states counted from the "
                     "loss (a state kept through the forward); walking down",
                     fmt_bytes(peak - budget), fmt_bytes(budget))
            walk.keep(fitting_other(graph, result, budget, loss_bytes, view.schedule_of))
    try:
        result = _walk(graph, budget, cfg, cache, solve, loss_bytes, walk)
    except InfeasibleBudgetError as exc:
        if not walk.fits:
            raise
        log.info("the walk found no schedule of the step within %s (%s); the fastest "
                 "candidate of an earlier solve that fits is taken", fmt_bytes(budget), exc)
        result = None
    found = [r for r in (result, *walk.fits) if r is not None]
    best = found[0] if len(found) == 1 else min(found, key=lambda r: r.sim.time)
    return _finished(graph, best, budget, start, walk.solves, loss_bytes)


@dataclass
class _Walk:
    """What the solves of one whole step have counted: ``solves``; ``fits``: a candidate of
    each overflowing solve that fits the step (:func:`fitting_other`)."""

    solves: int = 0
    fits: list[Any] = field(default_factory=list)

    def keep(self, result: Any) -> None:
        if result is not None:
            self.fits.append(result)


def _walk(graph: Graph, budget: int, cfg: Config, cache: Any, solve: Any, loss_bytes: int,
          walk: _Walk):
    """Solve the view without the generator states (:mod:`~hiremate.composer.step_view`) at
    the budget (less all of them when they cost at most :data:`CHEAP_RESERVE` of it), then,
    while the step overflows, below both the budget less what overflowed and the peak the
    solvers saw of the overflowing schedule (or at the lowest budget the solvers meet, when
    that is above), and at last with room for every state at once. The walk is hastened
    (:func:`_hastened`): each retry is a whole solve; and a budget at or below one at which
    the solvers failed ends the walk without another solve. Without random ops it is one
    solve. ``walk`` counts the solves and keeps each overflowing solve's fitting candidate."""
    view = step_view(graph, loss_bytes, rng_states=False).graph  # the graph's ids
    per_state = int(graph.meta.get("rng_state_bytes", 0) or 0)
    randoms = sum(1 for n in graph.nodes if n.random)
    # the most the view leaves out (generator states, buffer copies): it always works
    full = rng_state_reserve(graph) + snapshot_reserve(graph)
    # the states, when cheap, are reserved from the first solve; the buffer copies, which most
    # schedules need none of, only when a schedule overflows by them
    states = rng_state_reserve(graph)
    reserves = [0, states] if 0 < states <= CHEAP_RESERVE * budget else [0]
    result = None
    failed: tuple[int, InfeasibleBudgetError] | None = None  # the highest budget that failed
    while True:
        try:
            if failed is not None and budget - reserves[-1] <= failed[0]:
                # the solvers failed at this budget or a higher one already: solving again
                # (H-ILP's proof of infeasibility is its slowest solve) would end the same way
                raise failed[1]
            walk.solves += 1
            result = solve(view, budget - reserves[-1], cfg, cache)
        except InfeasibleBudgetError as exc:
            if failed is None or budget - reserves[-1] > failed[0]:
                failed = (budget - reserves[-1], exc)
            low = exc.min_budget
            if reserves[-1] and low is not None and (
                    budget - reserves[-1] < low < budget - reserves[-2]):
                reserves.append(budget - low)  # the lowest the solvers meet: it may still fit
                continue
            if not full:
                raise
            raise InfeasibleBudgetError(
                f"{exc}; with what a schedule may keep for reruns (the random-generator "
                f"states of {randoms} random ops, copies of buffers written in the forward), "
                f"the step needs at most "
                f"{fmt_bytes(low + full) if low else 'more'}",
                min_budget=low + full if low else None) from exc
        peak = whole_step_report(graph, result, budget, loss_bytes)
        if peak <= budget:
            return result
        walk.keep(fitting_other(graph, result, budget, loss_bytes))
        # an exact solver's fastest schedule stays the fastest at every budget down to the peak
        # it sees, so the next budget goes below that peak (not a walk down by the overflow)
        seen = simulate(view, result.schedule).peak
        reserve = min(full, max(reserves[-1] + peak - budget, reserves[-1] + per_state,
                                budget - seen + 1))
        reserve = max(reserve, _hastened(reserves, full, budget))
        log.info("whole step %s over %s with %s reserved; next reserve %s", *map(
            fmt_bytes, (peak - budget, budget, reserves[-1], reserve)))
        if reserve >= budget or reserve <= reserves[-1]:
            walk.solves += 1
            kept = without_random_reruns(graph, view, budget, cfg, solve, loss_bytes)
            if kept is not None:
                return kept
            raise InfeasibleBudgetError(
                f"the schedule found needs {fmt_bytes(peak)} with the loss's memory and the "
                f"random-generator states and buffer copies it keeps, above the budget "
                f"{fmt_bytes(budget)}; "
                f"raise the budget to {fmt_bytes(budget - reserves[-1] + full)}, which always "
                "leaves room for them",
                min_budget=budget - reserves[-1] + full)
        reserves.append(reserve)
