"""H-ILP menus (options over a budget grid) and option selection (N_o and the spread rule)."""

from __future__ import annotations

import pytest

from hiremate.ir.option import Option
from hiremate.ir.schedule import Compute
from hiremate.ir.simulator import simulate
from hiremate.solvers.hilp.flat import HilpSolver
from hiremate.solvers.menu import (
    allocate, budget_grid, option_from_schedule, select_options, spread, step_memory,
)
from hiremate.testing.synthetic import random_graph


def test_menu_options_replay_within_their_budgets():
    g = random_graph(3, 4, max_fanin=2)
    grid = budget_grid(g, n_peak=3, n_save=3)
    solver = HilpSolver()
    menu = solver.menu(g, grid)
    assert menu
    outs = sum(g.data[d].size for d in set(g.outputs))
    fastest = min(o.time for o in menu)
    assert fastest == pytest.approx(g.total_time() - g.nodes[g.loss].time)
    for o in menu:
        sched = o.fwd + (Compute(g.loss),) + o.bwd
        sim = simulate(g, sched)
        assert sim.valid, sim.error
        assert o.time == pytest.approx(sim.time - g.nodes[g.loss].time)
        # the option fits one of the grid budgets, peak and kept memory both
        assert any(sim.peak <= p and o.phantom + outs <= s for p, s in grid)
        assert o.fwd_peak >= 0 and o.bwd_peak >= 0
    # Pareto: no option dominates another; smaller phantom costs time
    for a in menu:
        assert not any(b.dominates(a) for b in menu)
    by_phantom = sorted(menu, key=lambda o: o.phantom)
    assert len(menu) >= 2
    assert by_phantom[0].time >= by_phantom[-1].time


def test_option_figures_from_simulator():
    g = random_graph(1, 4, max_fanin=2)
    sched = HilpSolver().schedule(g, budget_grid(g, 2, 1)[-1][0])
    o = option_from_schedule(g, sched)
    during, after = step_memory(g, sched)
    assert max(during + after) == simulate(g, sched).peak
    cut = sched.index(Compute(g.loss))
    outs = sum(g.data[d].size for d in set(g.outputs))
    assert o.phantom == after[cut - 1] - outs
    assert o.fwd_peak == max(during[:cut] + after[:cut]) - outs


def _opt(peak: int, time: float = 1.0) -> Option:
    return Option((), (), time, 0.0, peak, 0, 0)


def test_spread_order_highest_lowest_middle():
    opts = [_opt(p) for p in (10, 20, 30, 45, 50, 90, 100)]
    chosen = spread(opts, 3)
    assert [o.fwd_peak for o in chosen] == [100, 10, 50]
    assert [o.fwd_peak for o in spread(opts, 4)][:3] == [100, 10, 50]
    assert spread(opts, 10) == opts and spread(opts, 0) == []


def test_allocate_proportional_at_least_one():
    assert allocate([10, 10, 20], 8) == [2, 2, 4]
    assert allocate([1, 100], 4) == [1, 3]
    assert sum(allocate([3, 5, 7], 10)) == 10


def test_select_options_respects_limit():
    menus = [[_opt(p) for p in range(0, 100, 10)], [_opt(p) for p in range(5)]]
    picked = select_options(menus, [30, 10], 8)
    assert [len(m) for m in picked] == [6, 2]
    assert picked[0][0].fwd_peak == 90 and picked[0][1].fwd_peak == 0
