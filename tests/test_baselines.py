"""Sequential baselines on chain-shaped graphs, checked with the simulator."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.schedule import recomputations
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.testing.synthetic import chain_graph, random_graph
from hiremate.solvers.chain.baselines import (
    Autodiff, CheckpointSequential, default_segments, segment_bounds, sequential_ops,
)
from hiremate.solvers.chain.model import graph_chain, simulate_chain
from hiremate.solvers.chain.rotor import RotorPersistent


def test_segment_bounds():
    assert segment_bounds(10, 3) == [(1, 3), (4, 7), (8, 10)]
    assert segment_bounds(4, 9) == [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert segment_bounds(5, 1) == [(1, 5)]
    assert default_segments(16) == 4


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 400), min_size=1, max_size=14),
       segments=st.integers(1, 6), seed=st.integers(0, 1000))
def test_checkpoint_sequential_schedules(sizes, segments, seed):
    rng = random.Random(seed)
    g = chain_graph(sizes, [rng.uniform(0.5, 2) for _ in sizes])
    solver = CheckpointSequential(segments)
    need = solver.min_budget(g)
    sched = solver.schedule(g, need)
    res = simulate(g, sched)
    assert res.valid, res.error
    assert res.peak <= need
    # every forward node outside the last segment runs twice
    gc, _ = graph_chain(g)
    bounds = segment_bounds(gc.chain.n, segments)
    assert recomputations(sched) == bounds[-1][0] - 1
    fwd_time = sum(n.time for n in g.fwd_nodes[: bounds[-1][0] - 1])
    assert res.time == pytest.approx(g.total_time() + fwd_time)
    with pytest.raises(InfeasibleBudgetError) as info:
        solver.schedule(g, need - 1)
    assert info.value.min_budget == need
    # the optimal persistent DP is never slower at the same budget (with exact slots)
    rotor = simulate(g, RotorPersistent(slots=need).schedule(g, need))
    assert rotor.time <= res.time + 1e-9


def test_sequential_saves_memory_on_long_chains():
    g = chain_graph([1000] * 16, [1.0] * 16)
    seq = CheckpointSequential().min_budget(g)
    full = Autodiff().min_budget(g)
    assert seq <= full / 2


def test_autodiff_baseline():
    for g in (chain_graph([10, 20, 30], [1, 2, 3]), random_graph(5, 10)):
        solver = Autodiff()
        assert solver.applicable(g)
        peak = simulate(g, autodiff_schedule(g)).peak
        assert solver.min_budget(g) == peak
        res = simulate(g, solver.schedule(g, peak))
        assert res.valid and res.peak == peak and res.time == pytest.approx(g.total_time())
        with pytest.raises(InfeasibleBudgetError):
            solver.schedule(g, peak - 1)


def test_sequential_chain_ops_valid():
    g = chain_graph([5, 6, 7, 8, 9], [1] * 5)
    gc, _ = graph_chain(g)
    for s in range(1, 7):
        assert simulate_chain(gc.chain, sequential_ops(gc.chain, s)).valid
