"""The schedule pool: schedules found at one budget are offered at every other budget."""

from __future__ import annotations

import pytest

import hiremate
from hiremate.ir.simulator import step_peak
from hiremate.api import solve_graph
from hiremate.config import load_config
from hiremate.errors import InfeasibleBudgetError
from hiremate.composer.menu_cache import MenuCache
from hiremate.ir.graph import graph_key
from hiremate.composer.pool import SchedulePool, peak_time_front, pool_key
from hiremate.composer.step_view import step_view
from hiremate.ir.simulator import SimulationResult, autodiff_schedule
from hiremate.testing.synthetic import chain_graph, random_graph
from test_registry import residual_chain

# H-ILP stopped by its work limit, never by the wall-clock cap (a safety net far above the
# usual solve): under load a 2 s cap left only one budget feasible in CI
FAST = {"progress": False, "n_jobs": 1,
        "solver_params": {"hilp": {"work_limit": 500, "time_limit": 60.0},
                          "rk-rotor": {"slots": 100}}}


def _sim(peak: int, time: float) -> SimulationResult:
    return SimulationResult(valid=True, peak=peak, time=time)


def test_front_keeps_only_undominated_schedules():
    a, b, c, d = ((i,) for i in range(4))  # stand-ins: the front only compares figures
    entries = [(a, _sim(10, 1.0), "x"), (b, _sim(5, 2.0), "y"), (c, _sim(8, 3.0), "z"),
               (d, _sim(5, 2.5), "w"), (a, _sim(10, 1.0), "x")]
    front = peak_time_front(entries)
    assert [e[0] for e in front] == [b, a]  # by increasing peak; c and d are dominated


# seed 1: every budget below is feasible there; with seed 3, 0.75 and 0.65 were not, and each
# infeasible budget cost a whole-step walk of 40-50 s (HiGHS proving infeasibility). The random
# graph's case takes 20 s: the full run's
@pytest.mark.parametrize("make", [pytest.param(lambda: random_graph(1, 14), marks=pytest.mark.slow),
                                  lambda: residual_chain(8)], ids=["random", "residual"])
def test_second_pass_is_monotone_and_never_slower(tmp_path, make):
    """Solving every budget once fills the pool; solving them again then returns, at each
    budget, the fastest known schedule that fits: never slower than the first pass, and with
    a peak that only goes down with the budget."""
    g = make()
    cfg = load_config("hiremate", cache=True, cache_dir=str(tmp_path), **FAST)
    budgets = [0.95, 0.85, 0.75]
    first = {}
    for b in budgets:
        try:
            first[b] = solve_graph(g, b, cfg)
        except InfeasibleBudgetError:  # the time-limited solvers may miss a tight budget
            pass
    budgets = [b for b in budgets if b in first]
    assert len(budgets) >= 2
    second = {b: solve_graph(g, b, cfg) for b in budgets}
    for b in budgets:
        sim = hiremate.simulate(g, second[b].schedule)
        assert sim.valid and sim.peak <= second[b].report["budget"]
        assert sim.time <= hiremate.simulate(g, first[b].schedule).time * (1 + 1e-12)
        assert second[b].report["predicted_peak"] == step_peak(g, second[b].schedule,
                                                               second[b].report["loss_bytes"])
    peaks = [hiremate.simulate(g, second[b].schedule).peak for b in budgets]
    assert peaks == sorted(peaks, reverse=True)


def test_a_recorded_faster_schedule_is_returned(tmp_path):
    """A schedule recorded earlier (here autodiff's, recorded by hand) wins over what the
    configured solver finds (checkpoint_sequential, which always recomputes) when it fits and
    is faster."""
    g = chain_graph([100] * 8, [1.0] * 8)
    cfg = load_config("twremat", flat=["checkpoint-sequential"], cache=True,
                      cache_dir=str(tmp_path), **FAST)
    cache = MenuCache(tmp_path)
    from hiremate.composer.menus import _runtime_free

    config = _runtime_free(cfg)
    config.pop("reuse_schedules")
    view = step_view(g, 0, rng_states=False).graph  # what the solvers (and the pool) see of a step
    pool = SchedulePool(view, cache, pool_key(graph_key(view), config))
    ad = autodiff_schedule(view)
    ad_sim = hiremate.simulate(view, ad)
    assert pool.record([(ad, ad_sim, "autodiff")]) == 1
    res = solve_graph(g, ad_sim.peak, cfg)
    assert res.report["solver"] == "pool:autodiff"
    assert res.schedule == ad
    assert res.report["pool"]["fitting"] == 1
    # below autodiff's peak the recorded schedule does not fit and is not offered
    low = solve_graph(g, int(ad_sim.peak * 0.8), cfg)
    assert low.report["solver"] == "checkpoint-sequential"
    assert hiremate.simulate(g, low.schedule).peak <= int(ad_sim.peak * 0.8)
    # switched off, nothing is offered
    off = solve_graph(g, ad_sim.peak, cfg.replace(reuse_schedules=False))
    assert "pool" not in off.report and off.report["solver"] != "pool:autodiff"


def test_unusable_entries_are_skipped(tmp_path):
    """An entry whose schedule is invalid on this graph is never offered."""
    g = residual_chain(4)
    cache = MenuCache(tmp_path)
    key = pool_key(graph_key(g), {"x": 1})
    cache.put(key, [{"schedule": [["C", 10_000, None]], "source": "bad"},
                    {"schedule": "garbage"}])
    pool = SchedulePool(g, cache, key)
    assert pool.fitting(10**12) == []
