"""FastSA: segment tree, incremental state vs the simulator, grouping, solver protocol."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiremate
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.schedule import Compute
from hiremate.solvers.fastsa import solver as fastsa
from hiremate.solvers.fastsa.solver import FASTSA_SOLVERS, FastSA, group_nodes, primitive_table
from hiremate.testing.segtree import AddMaxSegmentTree
from hiremate.solvers.fastsa.state import NOP, SlotState, needed_nodes
from hiremate.ir.sequence import sequence_to_schedule
from hiremate.testing.synthetic import chain_graph, graph_from_dag, random_dag, random_graph
from test_memory_pins import fuzz_graph, simulated_slots  # module level: its @given must not nest


def autodiff_peak(g):
    return hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak


@settings(max_examples=30, deadline=None)
@given(size=st.integers(1, 70), ops=st.lists(
    st.tuples(st.integers(0, 69), st.integers(0, 70), st.integers(-9, 9)), max_size=60))
def test_segment_tree_matches_a_plain_list(size, ops):
    tree = AddMaxSegmentTree(size)
    plain = [0] * size
    for lo, hi, x in ops:
        lo, hi = min(lo, size), min(hi, size)
        tree.add(lo, hi, x)
        for i in range(lo, hi):
            plain[i] += x
        assert tree.max() == max(plain)
    assert [tree.value(i) for i in range(size)] == plain


def _state(g, table, order, gap=3):
    sizes = [d.size if d.counted else 0 for d in g.data]
    keep = set(g.outputs) | set(g.final_data)
    kept = [d.id in keep for d in g.data]
    loss = next(i for i in order if table.members[i] == (g.loss,))
    state = SlotState(table, order, len(g.data), sizes, kept, loss, gap)
    state.pin_first_copies(x for x in order if any(g.nodes[m].random for m in table.members[x]))
    return state


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 15),
       kind=st.sampled_from(["synthetic", "fuzz"]))
def test_incremental_peak_equals_simulator_under_random_mutations(seed, n, kind):
    """After every valid add/remove/move the whole slot profile is the simulator's (and so its
    peak), the deltas predicted before each mutation give that peak exactly (and a bound below
    it), and the sequence stays valid (random ops of the fuzz graphs: their first copies are
    pinned)."""

    g = random_graph(seed, n) if kind == "synthetic" else fuzz_graph(seed, min(n, 12))
    table = primitive_table(g)
    state = _state(g, table, list(range(len(g))))
    rng = random.Random(seed)
    pool = [x for x in range(len(table)) if not table.movable_only[x]]
    needed = needed_nodes(table)
    for _ in range(60):
        kind = rng.random()
        if kind < 0.4 and pool:
            x, t = rng.choice(pool), rng.randrange(state.T)
            if state.seq[t] == NOP and state.can_add(x, t):
                deltas = state.add_deltas(x, t)
                predicted, bound = state.peak_with(deltas), state.peak_bound(deltas)
                if t <= state.peak_at:  # the annealer's cost-only bound for adds
                    assert predicted >= state.peak
                else:
                    assert predicted >= state.peak - state.out_bytes[x]
                state.add(x, t)
                assert state.peak == predicted and bound <= predicted
        elif kind < 0.7:
            t = rng.randrange(state.T)
            x = state.seq[t]
            if (x != NOP and not table.movable_only[x] and t != state.pin[x]
                    and state.can_remove(x, t)):
                deltas = state.remove_deltas(x, t)
                predicted, bound = state.peak_with(deltas), state.peak_bound(deltas)
                assert predicted <= state.peak_bounds(deltas)[1]
                state.remove(x, t)
                assert state.peak == predicted and bound <= predicted
        else:
            t1, t2 = rng.randrange(state.T), rng.randrange(state.T)
            x = state.seq[t1]
            if (x != NOP and t1 != state.loss_slot and t1 != state.pin[x]
                    and state.seq[t2] == NOP and state.can_add(x, t2)
                    and state.can_remove(x, t1, t2)):
                deltas = state.move_deltas(x, t1, t2)
                predicted, bound = state.peak_with(deltas), state.peak_bound(deltas)
                lower, upper = state.peak_bounds(deltas, disjoint=True)
                assert lower == bound <= predicted <= upper
                before = state.mem.copy()
                state.add(x, t2)
                state.remove(x, t1)
                after = state.mem.copy()
                state.mem[:] = before
                state.commit_move(x, t2, t1, [])  # undo the lists, keep mem
                state.commit_move(x, t1, t2, deltas)
                assert state.mem.tolist() == after.tolist()
                assert state.peak == predicted and bound <= predicted
        res = hiremate.simulate(g, sequence_to_schedule(g, state.order()))
        assert res.valid, res.error
        assert state.peak == res.peak
        assert state.mem.tolist() == simulated_slots(g, state)
        assert state.mem[state.peak_at] == state.peak
        y = rng.randrange(len(table))  # the cached first valid slot of a node is current
        first = state.first_slot(y)
        assert all(state.can_add(y, t) == (t >= first) for t in range(state.T))
        # the annealer never proposes removing the only copy of a needed node: always invalid
        for t in range(state.T):
            x = state.seq[t]
            if x != NOP and needed[x] and state.seq.count(x) == 1:
                assert not state.can_remove(x, t) and state.remove_deltas(x, t) is None
        assert state.cost == pytest.approx(res.time)


def test_add_then_remove_restores_the_profile():
    g = random_graph(7, 20)
    table = primitive_table(g)
    state = _state(g, table, list(range(len(g))))
    before = state.mem.tolist()
    x = next(i for i in range(len(table)) if not table.movable_only[i])
    t = next(t for t in range(state.T) if state.seq[t] == NOP and state.can_add(x, t)
             and t > state.seq.index(x))
    state.add(x, t)
    assert state.mem.tolist() != before  # the recomputation holds memory somewhere
    state.remove(x, t)
    assert state.mem.tolist() == before


def test_grouping_keeps_a_valid_sequence_and_recomputes_cheap_nodes():
    # equal sizes: every op fuses into its consumers (inputs <= outputs), paper C.1
    g = chain_graph([10] * 12, [1.0] * 12)
    table, order = group_nodes(g, primitive_table(g))
    assert len(order) < len(g)
    flat = [m for x in order for m in table.members[x]]
    res = hiremate.simulate(g, sequence_to_schedule(g, flat))
    assert res.valid
    assert res.peak < autodiff_peak(g)


@pytest.mark.parametrize("frac", [0.4, 0.6, 0.8])
def test_schedule_meets_budget_or_raises(frac):
    g = random_graph(11, 40)
    budget = int(frac * autodiff_peak(g))
    solver = FastSA(seed=1, iters_grouped=20_000, iters_fine=10_000)
    try:
        sched = solver.schedule(g, budget)
    except InfeasibleBudgetError as exc:
        assert exc.min_budget > budget
        return
    res = hiremate.simulate(g, sched)
    assert res.valid and res.peak <= budget
    runs = [s.node for s in sched if isinstance(s, Compute) and not g.nodes[s.node].is_fwd]
    assert len(runs) == len(set(runs)) == len(g.bwd_nodes) + 1  # loss and bwd exactly once


@pytest.mark.parametrize("seed", [199, 219])
def test_the_budget_an_infeasible_solve_names_is_met(seed):
    """On these DAGs the lowest peak a failed solve reaches is not met by a solve at it (the
    search weighs memory against time by the budget), so the error must name one that is."""
    g = graph_from_dag(random_dag(random.Random(seed), 12), [100])
    solver = FastSA(seed=0, iters_grouped=20_000, iters_fine=10_000)
    for frac in (0.3, 0.5):
        with pytest.raises(InfeasibleBudgetError) as caught:
            solver.schedule(g, int(frac * autodiff_peak(g)))
        low = caught.value.min_budget
        res = hiremate.simulate(g, solver.schedule(g, low))
        assert res.valid and res.peak <= low


def test_chain_reaches_well_below_autodiff():
    g = chain_graph([10] * 20, [1.0] * 20)
    budget = autodiff_peak(g) // 2
    res = hiremate.simulate(g, FastSA(seed=0, iters_grouped=20_000,
                                      iters_fine=10_000).schedule(g, budget))
    assert res.valid and res.peak <= budget
    assert res.time < 2 * g.total_time()


def test_deterministic_for_a_seed():
    g = random_graph(2, 30)
    budget = int(0.7 * autodiff_peak(g))
    a = FastSA(seed=5, iters_grouped=5_000, iters_fine=5_000, time_limit=1e9).solve(g, budget)
    b = FastSA(seed=5, iters_grouped=5_000, iters_fine=5_000, time_limit=1e9).solve(g, budget)
    assert a == b


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 20), n_inputs=st.integers(1, 2),
       frac=st.sampled_from([0.5, 0.8]))
def test_property_random_dags(seed, n, n_inputs, frac):
    g = random_graph(seed, n, n_inputs)
    budget = int(frac * autodiff_peak(g))
    solver = FastSA(seed=seed, iters_grouped=3_000, iters_fine=2_000)
    seq, peak, _ = solver.solve(g, budget)
    res = hiremate.simulate(g, sequence_to_schedule(g, seq))
    assert res.valid and res.peak == peak
    try:
        sched = solver.schedule(g, budget)
    except InfeasibleBudgetError as exc:
        assert exc.min_budget > budget
        return
    res = hiremate.simulate(g, sched)
    assert res.valid and res.peak <= budget


def test_menu_options_replay():
    g = random_graph(6, 25)
    peak = autodiff_peak(g)
    menu = FastSA(seed=0, iters_grouped=5_000, iters_fine=3_000).menu(
        g, [int(0.7 * peak), peak])
    assert menu
    for opt in menu:
        whole = tuple(opt.fwd) + (Compute(g.loss),) + tuple(opt.bwd)
        res = hiremate.simulate(g, whole)
        assert res.valid
        assert opt.solver == "fastsa"


def test_registry_and_applicable():
    assert FASTSA_SOLVERS["fastsa"] is FastSA
    assert FastSA().applicable(random_graph(0, 5))
    assert not FastSA(max_nodes=3).applicable(random_graph(0, 5))


class _NoBoundState(SlotState):
    """A state whose bounds never decide: every decision comes from the exact peak."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.out_bytes = [1 << 60] * len(self.out_bytes)

    def peak_bounds(self, deltas, disjoint=False):
        return -(1 << 60), 1 << 60


@pytest.mark.parametrize("frac", [0.05, 0.6])
def test_early_rejection_changes_no_decision(monkeypatch, frac):
    """The bounds only skip work: with them disabled, FastSA takes the same path."""
    g = random_graph(4, 40)
    budget = int(frac * autodiff_peak(g))
    kw = dict(seed=3, iters_grouped=8_000, iters_fine=8_000, time_limit=1e9)
    fast = FastSA(**kw)
    a = fast.solve(g, budget)
    monkeypatch.setattr(fastsa, "SlotState", _NoBoundState)
    slow = FastSA(**kw)
    b = slow.solve(g, budget)
    assert a == b
    assert [(s.attempts, s.evaluated, s.accepted) for s in fast.last_stats] == \
        [(s.attempts, s.evaluated, s.accepted) for s in slow.last_stats]
    assert sum(s.bounded for s in fast.last_stats) > sum(s.bounded for s in slow.last_stats)


def test_best_visited_state_is_within_budget():
    g = chain_graph([10] * 20, [1.0] * 20)
    budget = autodiff_peak(g) // 2
    solver = FastSA(seed=2, iters_grouped=20_000, iters_fine=20_000, time_limit=1e9)
    solver.solve(g, budget)
    grouped, fine = solver.last_stats
    assert fine.best is not None  # the fine annealing starts within the budget here
    table, _ = group_nodes(g, primitive_table(g))
    seqs = [fine.best] + ([[m for x in grouped.best for m in table.members[x]]]
                          if grouped.best is not None else [])
    for seq in seqs:
        res = hiremate.simulate(g, sequence_to_schedule(g, seq))
        assert res.valid and res.peak <= budget
