"""A menu budget an exact MILP proved infeasible settles the tighter budgets of its peak: they
are not solved, and the menu is the one every budget solved gives (same options, in order)."""

from __future__ import annotations

import pytest

from hiremate.ir.simulator import autodiff_schedule, trace
from hiremate.ir.tracker import memory_floor
from hiremate.registry import make_solver
from hiremate.solvers import menu as menu_mod
from hiremate.solvers.menu import InfeasibleBudgets, loosest_first
from hiremate.testing.synthetic import random_graph


def _figures(options):
    return [(o.fwd_peak, o.bwd_peak, o.phantom, round(o.fwd_time + o.bwd_time, 12), o.fwd,
             o.bwd) for o in options]


def test_saves_of_a_peak_are_solved_loosest_first_and_peaks_in_their_order():
    budgets = [(10, 1), (10, 5), (20, 1), (20, None), (20, 5)]
    assert loosest_first(budgets) == [1, 0, 3, 4, 2]
    assert loosest_first([5, 3]) == [0, 1]  # peaks alone keep their order


def test_a_proof_settles_the_budgets_it_dominates_only():
    proved = InfeasibleBudgets()
    proved.add(10, 5)
    assert proved.settles(10, 5) and proved.settles(9, 5) and proved.settles(10, 1)
    assert not proved.settles(11, 1) and not proved.settles(10, 6)
    assert not proved.settles(10, None)  # no save bound is looser than any
    proved.add(8, None)
    assert proved.settles(8, None) and proved.settles(7, 10**9) and proved.settles(8, 0)
    assert not proved.settles(9, 6)


def _counting(monkeypatch, cls, method):
    calls: list[tuple] = []
    real = getattr(cls, method)

    def counted(self, *args, **kwargs):
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, counted)
    return calls


def _never_settled(monkeypatch):
    monkeypatch.setattr(InfeasibleBudgets, "settles", lambda self, peak, save: False)


@pytest.mark.parametrize("seed", [2, 5])
def test_a_leaf_menu_skips_what_a_proof_settles_and_keeps_its_options(seed, monkeypatch):
    from hiremate.solvers.hilp.flat import HilpSolver

    graph = random_graph(seed, 6)
    ad = autodiff_schedule(graph)
    tr = trace(graph, ad)
    floor, top = memory_floor(graph), tr.peak
    # peaks from the floor (a MILP proves most of them infeasible) to autodiff's, three saves
    peaks = [floor + (top - floor) * k // 4 for k in range(5)]
    budgets = [(p, s) for p in peaks for s in (0, tr.peak // 4, tr.peak // 2)]
    solver = make_solver("hilp", {"work_limit": 50, "time_limit": 60.0})
    calls = _counting(monkeypatch, HilpSolver, "solve")
    skipping = menu_mod.solve_menu(solver, graph, budgets, exact=True)
    solved_with_proofs = len(calls)
    calls.clear()
    _never_settled(monkeypatch)
    every = menu_mod.solve_menu(solver, graph, budgets, exact=True)
    assert len(calls) == len(budgets)
    assert solved_with_proofs < len(budgets)  # some budget was settled by a proof
    assert _figures(skipping) == _figures(every)


def test_an_inner_menu_skips_what_a_proof_settles_and_keeps_its_options(monkeypatch):
    from hiremate.partition import SequencePartition
    from hiremate.solvers.hilp.top import HilpTop
    from test_hilp_hier import problem_of
    from test_registry import residual_chain

    problem = problem_of(residual_chain(3), SequencePartition())
    tr = trace(problem.graph, autodiff_schedule(problem.graph))
    peaks = [tr.peak * k // 10 for k in (3, 5, 7, 10)]
    budgets = [(p, s) for p in peaks for s in (tr.peak // 8, tr.peak // 2)]
    solver = HilpTop(work_limit=50, time_limit=60.0, refine_rounds=0)
    calls = _counting(monkeypatch, HilpTop, "solve_at")
    skipping = solver.compose_menu(problem, budgets)
    solved_with_proofs = len(calls)
    calls.clear()
    _never_settled(monkeypatch)
    every = solver.compose_menu(problem, budgets)
    assert solved_with_proofs < len(calls)
    assert _figures(skipping) == _figures(every)


def test_an_inner_menu_budget_without_a_schedule_in_its_work_limit_settles_tighter_ones(
        monkeypatch):
    """``hilp-top``'s menus: a MILP that stops at its work limit with no schedule settles the
    tighter saves of its peak as a proof does (their MILPs, with the same limit, would spend
    as much again); its looser fallbacks are still tried, and other peaks are untouched."""
    import math

    from hiremate.partition import SequencePartition
    from hiremate.solvers.hilp.top import HilpTop, TopSolution
    from test_hilp_hier import problem_of
    from test_registry import residual_chain

    problem = problem_of(residual_chain(3), SequencePartition())
    tr = trace(problem.graph, autodiff_schedule(problem.graph))
    low, high = tr.peak * 7 // 10, tr.peak
    tight, loose = tr.peak // 8, tr.peak // 2
    budgets = [(p, s) for p in (low, high) for s in (tight, loose)]
    real = HilpTop.solve_at
    calls: list[tuple[int, int | None]] = []

    def stopped_at_low(self, problem, top, abstract, *args, save_budget=None, **kwargs):
        calls.append((abstract, save_budget))
        if abstract == low:  # as if the work limit ran out before any schedule
            return TopSolution(abstract, "time_limit", math.inf, -math.inf, 0.0, [], [], None)
        return real(self, problem, top, abstract, *args, save_budget=save_budget, **kwargs)

    monkeypatch.setattr(HilpTop, "solve_at", stopped_at_low)
    HilpTop(work_limit=50, time_limit=60.0, refine_rounds=0).compose_menu(problem, budgets)
    assert (low, loose) in calls and (low, tight) not in calls  # settled, not solved
    assert (2 * high, loose) in calls and (2 * high, tight) in calls  # the loose fallbacks
    assert (high, loose) in calls and (high, tight) in calls


def test_menu_work_is_the_limit_of_menu_milps_only(monkeypatch):
    """``menu_work`` reaches every menu MILP (the warm-start completions, which fix a plan's
    columns, keep ``work_limit``); the top-level solve keeps ``work_limit``; a limit that is
    not positive is a ConfigError."""
    from hiremate.errors import ConfigError
    from hiremate.partition import SequencePartition
    from hiremate.solvers.hilp.top import HilpTop
    from test_hilp_hier import problem_of
    from test_registry import residual_chain

    problem = problem_of(residual_chain(3), SequencePartition())
    peak = trace(problem.graph, autodiff_schedule(problem.graph)).peak
    limits: list[float | None] = []

    def spy(self, problem, top, abstract, *args, work_limit=None, **kwargs):
        limits.append(work_limit)
        return real(self, problem, top, abstract, *args, work_limit=work_limit, **kwargs)

    real = HilpTop.solve_at
    monkeypatch.setattr(HilpTop, "solve_at", spy)
    solver = HilpTop(work_limit=50, time_limit=60.0, refine_rounds=0, menu_work=3)
    solver.compose_menu(problem, [(peak, peak // 2), (peak * 7 // 10, peak // 2)])
    assert limits and set(limits) == {3.0}
    limits.clear()
    solver.compose(problem, peak)
    assert limits and set(limits) == {None}  # None: the solver's own work_limit
    with pytest.raises(ConfigError, match="menu_work"):
        HilpTop(menu_work=0)
    from hiremate.registry import make_solver

    with pytest.raises(ConfigError, match="bad parameters for solver 'hilp-top'"):
        make_solver("hilp-top", {"menu_work": "root"})  # float('root'): not a bare ValueError
