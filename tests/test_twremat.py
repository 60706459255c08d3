"""TW-Remat and the shared sequence -> schedule conversion, checked against the simulator."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiremate
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.schedule import Compute
from hiremate.solvers.menu import option_from_schedule
from hiremate.ir.sequence import sequence_to_schedule
from hiremate.solvers.twremat import TWREMAT_SOLVERS, TWRemat, build_hierarchy, forward_graph
from hiremate.testing.synthetic import chain_graph, random_graph


def autodiff_peak(g):
    return hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak


def test_sequence_of_graph_order_reproduces_autodiff():
    # independent truth: the simulator's own autodiff schedule frees after the last use too
    for seed in range(5):
        g = random_graph(seed, 25)
        ours = hiremate.simulate(g, sequence_to_schedule(g, list(range(len(g)))))
        auto = hiremate.simulate(g, hiremate.autodiff_schedule(g))
        assert ours.valid and ours.peak == auto.peak and ours.time == pytest.approx(auto.time)


def test_sequence_with_recomputation_frees_old_copy():
    # chain x->0->1->2: recomputing node 0 before bwd of op 1 must free the first copy of a0
    g = chain_graph([10, 10, 10], [1.0, 1.0, 1.0])
    seq = list(range(len(g)))
    sched = sequence_to_schedule(g, seq)
    assert hiremate.simulate(g, sched).valid


def test_hierarchy_separates_chain_in_balanced_halves():
    g = chain_graph([1] * 15, [1.0] * 15)
    h = build_hierarchy(g, leaf=1)
    depths = sorted(h.depth(v) for v in range(15))
    # a path of 15 split by single-vertex separators: depth log2(16) - 1 = 3 at most
    assert max(depths) <= 3 and depths.count(0) <= 2
    assert forward_graph(g).number_of_edges() == 14


def test_family_spans_autodiff_to_lower_memory_on_chain():
    g = chain_graph([10] * 32, [1.0] * 32)
    cands = TWRemat().candidates(g)
    peaks = [c.peak for c in cands]
    assert max(peaks) == autodiff_peak(g)
    # O(log n) stored values instead of n: well below half the autodiff peak
    assert min(peaks) < autodiff_peak(g) / 2


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.7, 1.0])
def test_schedule_meets_budget_or_raises(frac):
    g = random_graph(3, 40)
    budget = int(frac * autodiff_peak(g))
    solver = TWRemat()
    try:
        sched = solver.schedule(g, budget)
    except InfeasibleBudgetError as exc:
        assert exc.min_budget > budget
        # the reported minimum really is reachable
        assert hiremate.simulate(g, solver.schedule(g, exc.min_budget)).peak <= exc.min_budget
        return
    res = hiremate.simulate(g, sched)
    assert res.valid and res.peak <= budget
    loss_runs = sum(1 for s in sched if isinstance(s, Compute) and s.node == g.loss)
    bwd_runs = [s.node for s in sched if isinstance(s, Compute) and g.nodes[s.node].is_bwd]
    assert loss_runs == 1 and len(bwd_runs) == len(set(bwd_runs)) == len(g.bwd_nodes)


def test_full_budget_gives_autodiff_time():
    g = random_graph(4, 30)
    res = hiremate.simulate(g, TWRemat().schedule(g, autodiff_peak(g)))
    assert res.time == pytest.approx(g.total_time())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25), n_inputs=st.integers(1, 2),
       frac=st.sampled_from([0.4, 0.6, 0.8]))
def test_property_random_dags(seed, n, n_inputs, frac):
    g = random_graph(seed, n, n_inputs)
    budget = int(frac * autodiff_peak(g))
    solver = TWRemat(leaves=(2,), decompositions=("min_degree",), keep_ratios=(0.0,))
    for c in solver.candidates(g):  # every member of the family is a valid schedule
        assert hiremate.simulate(g, c.schedule).valid
    try:
        sched = solver.schedule(g, budget)
    except InfeasibleBudgetError as exc:
        assert exc.min_budget > budget
        return
    res = hiremate.simulate(g, sched)
    assert res.valid and res.peak <= budget


def test_menu_options_are_consistent_with_the_simulator():
    g = random_graph(5, 30)
    peak = autodiff_peak(g)
    solver = TWRemat()
    menu = solver.menu(g, [int(f * peak) for f in (0.6, 0.8, 1.0)])
    assert menu
    for opt in menu:
        # the two parts around the loss replay to the same time as a whole schedule
        whole = tuple(opt.fwd) + (Compute(g.loss),) + tuple(opt.bwd)
        res = hiremate.simulate(g, whole)
        assert res.valid
        assert opt.time == pytest.approx(res.time - g.nodes[g.loss].time)
        assert opt.phantom <= opt.fwd_peak
        assert opt.solver == "twremat"
    # Pareto: no option dominates another
    for a, b in itertools.permutations(menu, 2):
        assert not a.dominates(b)


def test_option_split_matches_hand_count():
    # chain of two ops, sizes 10 and 20, graph output a1 (interface) and grads
    g = chain_graph([10, 20], [1.0, 2.0])
    opt = option_from_schedule(g, hiremate.autodiff_schedule(g))
    # forward keeps a0 (10 bytes) for the backward; a1 is the output (interface)
    assert opt.phantom == 10
    assert opt.fwd_time == pytest.approx(3.0) and opt.bwd_time == pytest.approx(6.0)


def test_registry_and_applicable():
    assert TWREMAT_SOLVERS["twremat"] is TWRemat
    assert TWRemat().applicable(random_graph(0, 5))
    assert not TWRemat(max_nodes=3).applicable(random_graph(0, 5))
