"""The whole-step walk: how many solves it takes when the first schedule overflows the budget.

Each retry is a whole solve (minutes on GPT-96), so the walk must not creep down by the last
overflow alone. These tests drive :func:`solve_whole_step` with a stand-in solver whose
schedules overflow by a set amount, so that the walk's choices are what is checked.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hiremate.composer import whole_step
from hiremate.config import load_config
from hiremate.errors import InfeasibleBudgetError
from hiremate.testing.synthetic import random_graph


def _walk(monkeypatch, loss_bytes: int, budget: int, held: list[int]):
    """Run the walk at ``budget`` with a stand-in solver whose k-th schedule peaks at the
    budget it was asked for, where ``held[k]`` bytes that the solvers do not see are held
    (nothing after the list); return what the walk reserved in each solve and the full
    reserve (the loss's memory and the graph's output gradients)."""
    graph = random_graph(5, 12)
    asked: list[int] = []

    def solve(g, nbytes, cfg, cache):
        asked.append(nbytes)
        return SimpleNamespace(schedule=(), report={})

    def report(g, result, nbytes, loss):
        k = len(asked) - 1
        return asked[-1] + (held[k] if k < len(held) else 0)

    monkeypatch.setattr(whole_step, "whole_step_report", report)
    monkeypatch.setattr(whole_step, "simulate", lambda g, s: SimpleNamespace(peak=asked[-1]))
    whole_step.solve_whole_step(graph, budget, load_config("hiremate"), None, solve, loss_bytes)
    return [budget - a for a in asked], loss_bytes + graph.tangent_bytes


def test_a_cheap_full_reserve_is_taken_from_the_first_solve(monkeypatch):
    """When reserving everything the solvers miss costs at most 2 % of the budget, the first
    solve reserves it, and the walk ends there (on the paper's FNO3d the second solve had
    doubled the time for an overflow of the output gradient alone)."""
    loss, budget = 600_000, 48_000_000
    reserves, full = _walk(monkeypatch, loss, budget, [200_000, 220_000, 250_000])
    assert full <= whole_step.CHEAP_RESERVE * budget
    assert reserves == [full]


def test_a_dear_reserve_is_approached_by_halves(monkeypatch):
    """When everything would cost much of the budget, the first retry moves by the overflow
    and the later ones at least halfway to the full reserve, so small overflows cannot make
    the walk creep."""
    loss, budget = 400_000, 1_000_000
    held = [1_000 * k for k in range(1, 400)]  # each schedule holds a little more than the last
    reserves, full = _walk(monkeypatch, loss, budget, held)
    assert full > whole_step.CHEAP_RESERVE * budget
    assert reserves[1] == held[0]  # the first retry is not hastened
    for before, after in zip(reserves[1:], reserves[2:]):
        assert after >= (before + full) // 2
    assert len(reserves) <= 3 + (full - reserves[1]).bit_length()


def test_an_overflow_past_the_full_reserve_is_an_error(monkeypatch):
    """A schedule that overflows even with everything reserved ends the walk with an error
    that names the budget that always works."""
    with pytest.raises(InfeasibleBudgetError, match="raise the budget"):
        _walk(monkeypatch, 0, 1_000_000, [10**9] * 64)


def test_a_budget_below_one_that_failed_is_not_solved_again(monkeypatch):
    """Once the solvers fail at some budget, the walk never solves at that budget or a lower
    one again (an exact solver's proof of infeasibility is its slowest solve, and a lower
    budget only fails the same way); it ends with the error naming what always works."""
    graph = random_graph(5, 12)
    floor, held = 900_000, 30_000  # the solvers' lowest; what each schedule holds unseen
    asked: list[int] = []
    failed: list[int] = []

    def solve(g, nbytes, cfg, cache):
        assert not any(nbytes <= f for f in failed), (nbytes, failed)
        asked.append(nbytes)
        if nbytes < floor:
            failed.append(nbytes)
            raise InfeasibleBudgetError("below the floor", min_budget=floor)
        return SimpleNamespace(schedule=(), report={})

    monkeypatch.setattr(whole_step, "whole_step_report", lambda g, r, n, loss: asked[-1] + held)
    monkeypatch.setattr(whole_step, "simulate", lambda g, s: SimpleNamespace(peak=asked[-1]))
    budget, loss = floor + 20_000, 50_000
    with pytest.raises(InfeasibleBudgetError) as info:
        whole_step.solve_whole_step(graph, budget, load_config("hiremate"), None, solve, loss)
    assert failed, "the walk never reached the floor"
    assert info.value.min_budget == floor + loss + graph.tangent_bytes
    # at the budget, below it (fails), at the floor (overflows); the next try is skipped
    assert len(asked) == 3, asked


def test_the_report_times_the_whole_walk(monkeypatch):
    """``solve_time`` is the walk's, not its last solve's (each solve's own report times only
    itself), and ``whole_step_solves`` counts the solves: the tables users read take it."""
    import time

    graph = random_graph(5, 12)
    asked: list[int] = []

    def solve(g, nbytes, cfg, cache):
        asked.append(nbytes)
        time.sleep(0.05)
        return SimpleNamespace(schedule=(), report={"solve_time": 0.05})

    monkeypatch.setattr(whole_step, "whole_step_report",
                        lambda g, r, n, loss: asked[-1] + (5_000 if len(asked) == 1 else 0))
    monkeypatch.setattr(whole_step, "simulate", lambda g, s: SimpleNamespace(peak=asked[-1]))
    result = whole_step.solve_whole_step(graph, 1_000_000, load_config("hiremate"), None, solve,
                                         100_000)  # a dear reserve: not taken up front
    assert len(asked) == 2 and result.report["whole_step_solves"] == 2
    assert result.report["solve_time"] >= 0.1
