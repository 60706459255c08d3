"""Solving a captured graph for the wrapper, and calibrating the result against the executor.

:func:`solve_graph` is the API's solve (the whole step, with the user's loss, fits the budget);
:func:`calibrate` measures the executor of a solved schedule and solves again while it measures
above the budget. Both live apart from :mod:`hiremate.api`, which builds the wrapper on them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from hiremate.composer.step_view import step_view
from hiremate.composer.whole_step import solve_whole_step, step_budget, whole_step_report
from hiremate.config import Config, load_config
from hiremate.errors import ConfigError, InfeasibleBudgetError
from hiremate.graphbuilder.capture import normalise_sample
from hiremate.ir.graph import DataKind, Graph, same_structure
from hiremate.ir.schedule import Schedule
from hiremate.ir.simulator import autodiff_schedule
from hiremate.solvers.hilp.moment_bound import moment_time_bound

log = logging.getLogger(__name__)

#: A schedule carried over to other inputs is kept when its predicted time relative to
#: autodiff's is at most this much above what it was on the inputs it was solved for.
TRANSFER_SLACK = 0.03


def solve_graph(graph: Graph, budget: int | float | str, config: Any = "hiremate",
                loss_bytes: int = 0, **overrides: Any):
    """Solve an already captured graph: a :class:`~hiremate.composer.solve.SolveResult` whose
    whole step, with the random-generator states the executor keeps and ``loss_bytes`` that the
    user's loss allocates beyond the output gradients (:func:`hiremate.ir.simulator.step_peak`),
    fits the budget."""
    from hiremate.composer.solve import solve
    from hiremate.composer.menu_cache import CallCache, MenuCache

    cfg = load_config(config, **overrides)
    if isinstance(loss_bytes, bool) or not isinstance(loss_bytes, int) or loss_bytes < 0:
        raise ConfigError(f"loss_bytes must be a byte count >= 0, got {loss_bytes!r}")
    nbytes = step_budget(budget, graph, loss_bytes)
    cache = MenuCache(cfg.cache_dir) if cfg.cache else CallCache()
    result = solve_whole_step(graph, nbytes, cfg, cache, solve, loss_bytes)
    result.report["cache_hits"] = cache.hits
    result.report["cache_misses"] = cache.misses
    return result


def transfer_schedule(graph: Graph, budget: int, loss_bytes: int,
                      sources: list[tuple[Graph, Schedule, dict[str, Any]]], cfg: Config):
    """A solve result for ``graph`` taken from an earlier solve of the same program structure
    (:func:`~hiremate.ir.graph.same_structure`: the model on inputs of other sizes), or None.

    Why: on a new sequence length or batch size a solve costs many times the capture, and
    with lengths that change from batch to batch it would run at most steps, while the
    schedule solved for other sizes is usually about as good. Autodiff's schedule is taken
    when it fits. Else each source ``(graph, schedule, report)`` is simulated on ``graph`` for
    the whole step, and kept when it fits ``budget`` with a time relative to autodiff's at most
    the source's (within :data:`TRANSFER_SLACK`): the overhead accepted for the sample. The
    fastest wins; when it is further from ``graph``'s lower bound than its source was from
    its own (the budget leaves more room here), ``cfg.polish``'s annealing starts from it."""
    from hiremate.composer.solve import SolveResult

    start = time.perf_counter()
    keep_all = SolveResult(autodiff_schedule(graph), None, {"solver": "autodiff"})
    best = None
    if whole_step_report(graph, keep_all, budget, loss_bytes) <= budget:
        best = (keep_all, {"solver": "autodiff"}, None)
    for src_graph, schedule, report in ([] if best else sources):
        if not report.get("relative_time") or not same_structure(src_graph, graph):
            continue
        result = SolveResult(tuple(schedule), None, {})
        peak = whole_step_report(graph, result, budget, loss_bytes)
        if not result.sim.valid or peak > budget:
            log.info("the schedule solved for inputs of other sizes does not fit these inputs' "
                     "budget (%.1f%% over)", 100 * (peak / budget - 1))
            continue
        if result.report["relative_time"] > report["relative_time"] * (1 + TRANSFER_SLACK):
            log.info("the schedule solved for inputs of other sizes fits, but at %.3fx "
                     "autodiff's time against %.3fx there", result.report["relative_time"],
                     report["relative_time"])
            continue
        if best is None or result.sim.time < best[0].sim.time:
            best = (result, report, src_graph)
    if best is None:
        return None
    result, report, src_graph = best
    # autodiff's schedule runs each node once: no schedule is faster, so it is its own bound
    bound = (result.sim.time if src_graph is None else
             moment_time_bound(step_view(graph, loss_bytes, rng_states=False).graph, budget))
    gap, source_gap = result.sim.time / bound, report.get("relative_time_bound")
    if src_graph is not None and source_gap and gap > (1 + TRANSFER_SLACK) * (
            report["relative_time"] / source_gap):
        result = _polished(graph, budget, loss_bytes, result, cfg)
    autodiff = result.report["autodiff_time"]
    result.report.update(
        solver="autodiff" if src_graph is None else "transferred:" + "+".join(
            filter(None, (report.get("solver"), result.report.get("polished_by")))),
        compute_nodes=len(graph.nodes),
        data_nodes=len(graph.data), transferred_from=None if src_graph is None else [
            list(d.shape) for d in src_graph.data if d.kind is DataKind.INPUT],
        time_bound=bound, relative_time_bound=bound / autodiff if autodiff else None,
        whole_step_solves=0, cache_hits=0, cache_misses=0,
        solve_time=time.perf_counter() - start)
    return result


def _polished(graph: Graph, budget: int, loss_bytes: int, result: Any, cfg: Config):
    """``result`` or a faster schedule that ``cfg.polish``'s solvers anneal from it on the
    step as the solvers see it (:func:`~hiremate.composer.step_view.step_view`, generator
    states counted), whose whole step still fits ``budget``."""
    from hiremate.composer.solve import SolveResult
    from hiremate.registry import make_solver

    view = step_view(graph, loss_bytes, rng_states=True)
    for name in cfg.polish:
        solver = make_solver(name, cfg.solver_params.get(name, {}))
        schedule = solver.polish(view.graph, budget, result.schedule)
        if schedule is None:
            continue
        polished = SolveResult(view.schedule_of(schedule), None, {})
        if (whole_step_report(graph, polished, budget, loss_bytes) <= budget
                and polished.sim.valid and polished.sim.time < result.sim.time):
            polished.report["polished_by"] = name
            result = polished
    return result


@dataclass
class Built:
    """What one capture-and-solve produced for one input signature."""

    graph: Graph
    schedule: Schedule
    report: dict[str, Any]
    executor: Any  # a RematModule, or None when the executor is not installed


def calibrate(first: Built, sample: Any, budget: int, cfg: Config, solve_time: float,
              make_executor: Callable[[Schedule], Any], loss_fn: Callable | None,
              tolerance: float = 0.02) -> Built:
    """Measure the executor once; while its peak is above the budget (by more than
    ``tolerance``: the cost model missed some memory, e.g. temporaries or allocator
    rounding), solve again with the budget lowered by the excess (or, when that is out of
    the solvers' reach, at the lowest budget they are known to meet), at most
    ``cfg.calibrate`` times. The schedule kept is the fastest (predicted) one whose measured
    peak fits, else the one that measured lowest. The report keeps the user's budget.
    ``make_executor`` makes the executor of a schedule of ``first``'s graph; ``loss_fn``
    is the loss the measured step applies to the outputs (None: their sum)."""
    from hiremate.runtime.measurement import measure

    args, kwargs = normalise_sample(sample)
    graph = first.graph
    start = time.perf_counter()
    limit = budget * (1 + tolerance)
    target = budget
    tried = [(first, measure(first.executor, *args, loss_fn=loss_fn, repeats=1, warmup=0,
                             **kwargs).peak)]
    for _ in range(cfg.calibrate):
        measured = tried[-1][1]
        if measured <= limit:
            break
        target = target - (measured - budget)
        if target < 1:  # the excess is the allocator's rounding of a near-empty step
            break
        try:
            result = solve_graph(graph, target, cfg, loss_bytes=first.report["loss_bytes"])
        except InfeasibleBudgetError as exc:
            # the lowered budget is out of reach; the lowest budget the solvers are known
            # to meet still lowers the peak, when it is below the last one tried
            low = exc.min_budget
            if low is None or low >= tried[-1][0].report["budget"]:
                break
            target = int(low)
            try:
                result = solve_graph(graph, target, cfg,
                                     loss_bytes=first.report["loss_bytes"])
            except InfeasibleBudgetError:
                break
        solve_time += result.report["solve_time"]
        schedule = tuple(result.schedule)
        if any(schedule == t[0].schedule for t in tried):
            break
        built = Built(graph, schedule, dict(result.report), make_executor(schedule))
        tried.append((built, measure(built.executor, *args, loss_fn=loss_fn, repeats=1,
                                     warmup=0, **kwargs).peak))
    fits = [t for t in tried if t[1] <= limit]
    best, peak = (min(fits, key=lambda t: t[0].report["predicted_time"]) if fits
                  else min(tried, key=lambda t: t[1]))
    best.report.update(
        budget=budget, solve_time=solve_time, measured_peak=peak,
        calibration=[(t[0].report["budget"], t[0].report["predicted_peak"], t[1])
                     for t in tried],
        calibration_time=time.perf_counter() - start)
    return best


def loss_bytes(model, graph: Graph, sample: Any, loss_fn: Callable | None,
               loss_captured: bool) -> int:
    """What the loss allocates between the forward and the backward beyond the output
    gradients the graph counts: nothing when the loss is in the graph (its gradient is a
    scalar); measured by running ``loss_fn`` on the model's outputs when one was given; else
    twice the size of the outputs the graph differentiates: at the start of its backward,
    cross-entropy holds its log-softmax and that tensor's gradient, a squared error its
    residual and the residual's scaled copy, each the output's size."""
    grads = graph.tangent_bytes
    if loss_captured:
        return 0
    if loss_fn is None or sample is None:
        return 2 * int(grads)
    from hiremate.runtime.measurement import loss_memory

    return int(loss_memory(model, sample, loss_fn, grads))
