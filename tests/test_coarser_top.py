"""A hierarchy whose top level finds nothing within the budget is partitioned again with a
smaller top (``coarser_tops``, :func:`hiremate.composer.solve._hierarchical_path`).

Why it exists: on the FNO3d of the paper's Table 3 (captured with two threads) the top of 8
parts cuts each Fourier layer into its two branches, and no choice of the parts' options fits
the budget; a top of 4 keeps whole layers in one part, whose inner H-ILP chooses across the
branches (docs/results-history.md, "Stop 39")."""

from __future__ import annotations

import pytest

import hiremate
import hiremate.composer.solve as composer_solve
from hiremate.composer.menu_cache import CallCache
from hiremate.config import load_config
from hiremate.errors import ConfigError
from hiremate.partition import HPartition
from hiremate.testing.synthetic import random_graph


REAL_COMPOSE = composer_solve._compose  # the spies below each wrap this one, never another spy


def _graph_and_budget():
    graph = random_graph(2, 30)  # tops of 8, 4 and 2 parts all fit at 0.85
    ad = hiremate.simulate(graph, hiremate.autodiff_schedule(graph))
    return graph, int(0.85 * ad.peak)


def _solve_with_failing_top(monkeypatch, graph, budget, fail_prefixes, calls=None,
                            **overrides):
    """Solve with the real composers, except that the candidates of the top levels whose
    prefix is in ``fail_prefixes`` are dropped, as if they had found nothing; returns the
    result and the (prefix, top size) of every top level composed (also appended to
    ``calls``, which a caller expecting an error passes)."""
    calls = [] if calls is None else calls
    real = REAL_COMPOSE

    def spy(graph, budget, cfg, cache, found, hierarchy, recursive, top, prefix, *rest):
        before = len(found.candidates)
        facts = real(graph, budget, cfg, cache, found, hierarchy, recursive, top, prefix, *rest)
        calls.append((prefix, len(hierarchy.top)))
        if prefix in fail_prefixes:
            del found.candidates[before:]
        return facts

    monkeypatch.setattr(composer_solve, "_compose", spy)
    cfg = load_config("hiremate", flat=[], sequence_top=[], polish=[], n_jobs=1,
                      partitioner_params={"max_top": 8, "max_sub": 4}, **overrides)
    result = composer_solve.solve(graph, budget, cfg, CallCache())
    return result, calls


def test_a_top_that_finds_nothing_is_tried_again_coarser(monkeypatch):
    graph, budget = _graph_and_budget()
    result, calls = _solve_with_failing_top(monkeypatch, graph, budget, {""})
    assert [p for p, _ in calls] == ["", "coarse1:"]
    assert calls[1][1] <= calls[0][1] // 2  # the top at most halved
    assert result.report["solver"].startswith("coarse1:")
    assert result.report["coarser_tops"][0]["candidates"] >= 1
    sim = hiremate.simulate(graph, result.schedule)
    assert sim.valid and sim.peak <= budget


def test_coarser_tops_stop_when_the_top_cannot_shrink(monkeypatch):
    graph, budget = _graph_and_budget()
    with pytest.raises(hiremate.InfeasibleBudgetError):
        _solve_with_failing_top(monkeypatch, graph, budget, {"", "coarse1:", "coarse2:"})
    _, calls = _solve_with_failing_top(monkeypatch, graph, budget, {"", "coarse1:"})
    sizes = [s for _, s in calls]
    assert all(b <= a // 2 for a, b in zip(sizes, sizes[1:])) and sizes[-1] >= 2
    assert len(calls) <= 3  # coarser_tops = 2 by default


def test_no_coarser_top_when_the_top_finds_a_schedule_or_when_off(monkeypatch):
    graph, budget = _graph_and_budget()
    result, calls = _solve_with_failing_top(monkeypatch, graph, budget, set())
    assert [p for p, _ in calls] == [""] and "coarser_tops" not in result.report
    with pytest.raises(hiremate.InfeasibleBudgetError):
        _solve_with_failing_top(monkeypatch, graph, budget, {""}, coarser_tops=0)


def test_no_coarser_top_below_the_memory_floor(monkeypatch):
    """Below the memory floor no in-order schedule fits, so a coarser top is not tried (an
    infeasible budget's error comes as fast as before)."""
    from hiremate.ir.tracker import memory_floor

    graph, _ = _graph_and_budget()
    calls = []
    with pytest.raises(hiremate.InfeasibleBudgetError):
        _solve_with_failing_top(monkeypatch, graph, memory_floor(graph) - 1, {""}, calls)
    assert [p for p, _ in calls] == [""]


def test_hpartition_coarser_halves_the_top_it_had():
    part = HPartition(max_top=8, max_sub=4, alpha=0.3)
    smaller = part.coarser(8)
    assert (smaller.max_top, smaller.max_sub, smaller.alpha) == (4, 4, 0.3)
    assert part.coarser(5).max_top == 2  # half of the top the partition had, not of max_top
    assert part.coarser(3) is None
    with pytest.raises(ConfigError):
        load_config("hiremate", coarser_tops=-1)
    with pytest.raises(ConfigError):
        load_config("hiremate", coarser_tops=True)
