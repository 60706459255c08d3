"""Solving a captured graph for the wrapper, and calibrating the result against the executor.

:func:`solve_graph` is the API's solve (the whole step, with the user's loss, fits the budget);
:func:`calibrate` measures the executor of a solved schedule and solves again while it measures
above the budget. Both live apart from :mod:`hiremate.api`, which builds the wrapper on them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from hiremate.composer.whole_step import solve_whole_step, step_budget
from hiremate.config import Config, load_config
from hiremate.errors import ConfigError, InfeasibleBudgetError
from hiremate.graphbuilder.capture import normalise_sample
from hiremate.ir.graph import Graph
from hiremate.ir.schedule import Schedule


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
