"""Menus solved in parts (one joblib task per peak of the budget grid) are the menus solved
whole: the same MILPs, so the same Pareto fronts, and a part with no feasible budget is no
error when another part has options."""

from __future__ import annotations

import pytest

from hiremate.composer.levels import FLAT_PART, inner_parts, solve_inner_task, solve_levels
from hiremate.composer.menu_cache import MenuCache
from hiremate.composer.menus import (menu_parts, merge_parts, solve_menu_task,
                                     store_all_option)
from hiremate.ir.blocks import TopProblem
from hiremate.ir.option import pareto_front
from hiremate.registry import make_solver, solver_class
from hiremate.solvers.menu import budget_grid
from hiremate.testing.synthetic import random_graph
from test_levels import deep_config, units_of


def _figures(options):
    return sorted((o.fwd_peak, o.bwd_peak, o.phantom, round(o.fwd_time + o.bwd_time, 12))
                  for o in pareto_front(options))


@pytest.mark.parametrize("seed", [3, 11])
def test_an_inner_menu_in_parts_is_the_menu_solved_whole(seed):
    graph = random_graph(seed, 24)
    cfg = deep_config()
    units, _, _ = units_of(graph, cfg)
    solve_levels(units, cfg, MenuCache(enabled=False))  # the children's menus
    inner = [u for t in units for u in t.walk() if u.children]
    assert inner
    hilp_top = [("hilp-top", solver_class("hilp-top"), {"time_limit": 30.0, "refine_rounds": 0})]
    for u in inner[:3]:
        blocks = [c.block for c in u.children]
        g = u.block.graph
        parts = inner_parts(g, hilp_top, [], cfg.menu_peaks, cfg.menu_saves)
        assert parts[-1] == FLAT_PART and len(parts) >= 2
        pieces = [solve_inner_task(g, blocks, u.tail, hilp_top, [], cfg.menu_peaks,
                                   cfg.menu_saves, part) for part in parts]
        assert all(not errors for _, _, errors in pieces)
        whole = hilp_top[0][1](**hilp_top[0][2]).compose_menu(
            TopProblem(g, blocks, u.tail), budget_grid(g, cfg.menu_peaks, cfg.menu_saves))
        in_parts = [o for opts, _, _ in pieces[:-1] for o in opts]
        assert _figures(in_parts) == _figures(whole)


def test_a_leaf_menu_in_parts_is_the_menu_solved_whole():
    graph = random_graph(0, 9)  # six options, its MILPs a few seconds in all (seed 7, 10: 30 s)
    # a work limit decides where each MILP stops (a wall clock could differ between the two)
    params = {"time_limit": 60.0, "work_limit": 50}
    solver = make_solver("hilp", params)
    parts = menu_parts(solver, graph, 3, 2)
    assert parts == list(range(len(parts))) and len(parts) >= 2
    cls = solver_class("hilp")
    whole, _, err = solve_menu_task(graph, "hilp", cls, params, 3, 2)
    assert err == ""
    merged, _, err = merge_parts([solve_menu_task(graph, "hilp", cls, params, 3, 2, part)
                                  for part in parts])
    assert err == ""
    assert _figures(merged) == _figures(whole)
    assert menu_parts(make_solver("twremat", {}), graph, 5, 2) == [None]  # one task


def test_an_infeasible_part_is_no_error_when_another_has_options():
    option = store_all_option(random_graph(2, 6))
    none = ([], 0.5, "InfeasibleBudgetError: hilp: none of the 2 menu budgets is feasible")
    assert merge_parts([none, ([option], 1.0, ""), none]) == ([option], 2.0, "")
    assert merge_parts([none, none]) == ([], 1.0, none[2])  # no option anywhere: the error
    assert merge_parts([([], 0.1, "not applicable")] * 3)[2] == "not applicable"
    failed = ([option], 1.0, "SolverError: a bug")
    assert merge_parts([none, failed])[2] == failed[2]  # other errors are kept


def test_a_part_falls_back_to_the_whole_grids_loose_budget():
    """A part of a grid falls back (MILP infeasible at its peak) to the loose budget of the
    whole grid, twice its top peak, not to twice the part's own peak."""
    from hiremate.errors import InfeasibleBudgetError
    from hiremate.ir.simulator import autodiff_schedule, trace
    from hiremate.partition import SequencePartition
    from hiremate.solvers.hilp.top import HilpTop
    from test_hilp_hier import problem_of
    from test_registry import residual_chain

    problem = problem_of(residual_chain(3), SequencePartition())
    top = trace(problem.graph, autodiff_schedule(problem.graph)).peak
    solver = HilpTop(time_limit=5, refine_rounds=0)
    with pytest.raises(InfeasibleBudgetError):  # alone, the part's loose budget is 4 bytes
        solver.compose_menu(problem, [(2, None)])
    assert solver.compose_menu(problem, [(2, None)], ceiling=top)
