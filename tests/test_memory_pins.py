"""The memory models that stay outside the simulator, pinned to it on random graphs.

:func:`hiremate.simulate` (the :class:`~hiremate.ir.tracker.MemoryTracker`) is the one memory
model. Some solvers keep an incremental or abstract copy for speed: FastSA's slot state and its
numba twin, the chain models of Rotor, rk-Rotor and the join DP. Each is checked against the
simulator on hostile random graphs (:mod:`hiremate.testing.fuzzgraphs`, with random ops) and
the synthetic DAGs (:mod:`hiremate.testing.synthetic`): same memory profile, same peak, or, for
the models that bound memory on purpose (rk-Rotor), never below it. The Python slot state is
pinned under random mutations in ``test_fastsa.py`` and rk-Rotor's block model in
``test_hrockmate.py`` (both with :func:`fuzz_graph` here); the rest is here.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiremate
from hiremate.ir.schedule import Compute
from hiremate.ir.sequence import sequence_to_schedule
from hiremate.ir.simulator import trace
from hiremate.solvers.fastsa.solver import FastSA, primitive_table
from hiremate.solvers.fastsa.state import NOP
from hiremate.testing.fuzzgraphs import FuzzOp, FuzzSpec, graph_from_spec, random_spec
from hiremate.testing.synthetic import random_graph

PROPERTY = dict(deadline=None, suppress_health_check=list(HealthCheck))


def fuzz_graph(seed: int, n_ops: int, chain: bool = False, p_random: float = 0.3,
               max_size: int = 1000) -> hiremate.Graph:
    """A hostile fuzz graph whose ops draw random numbers with probability ``p_random``."""
    spec = random_spec(seed, n_ops, chain=chain, max_size=max_size)
    rng = random.Random(seed + 1)
    for op in spec.ops:
        op.random = rng.random() < p_random
    return graph_from_spec(spec)


def any_graph(seed: int, n: int, kind: str) -> hiremate.Graph:
    return random_graph(seed, n) if kind == "synthetic" else fuzz_graph(seed, n)


# -- FastSA's slot state and its numba twin ---------------------------------------------------
def simulated_slots(graph: hiremate.Graph, state) -> list[int]:
    """The memory the simulator gives each slot of ``state``: at a slot holding a node, the
    memory while that node runs; at an empty slot, the memory after the frees that follow the
    node before it (0 before the first node)."""
    steps = sequence_to_schedule(graph, [state.table.members[x][0] for x in state.order()])
    tr = trace(graph, steps)
    computes = [i for i, s in enumerate(steps) if isinstance(s, Compute)]
    ends = [nxt - 1 for nxt in computes[1:]] + [len(steps) - 1]
    out, k, held = [], 0, 0
    for t in range(state.T):
        if state.seq[t] != NOP:
            out.append(tr.during[computes[k]])
            held = tr.after[ends[k]]
            k += 1
        else:
            out.append(held)
    return out


def fresh_state(graph: hiremate.Graph):
    solver = FastSA()
    table = primitive_table(graph)
    return solver, solver._state(graph, table, list(range(len(graph))))


@pytest.mark.parametrize("seed", range(6))
def test_numba_kernel_state_is_the_simulators(seed):
    """The numba kernel's annealing leaves the state the Python annealing leaves (same path on
    graphs with random ops), and that state's profile is the simulator's."""
    pytest.importorskip("numba")
    g = fuzz_graph(seed, 10, p_random=0.4)
    peak = hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak
    ends = []
    for accelerate in ("numba", "python"):
        solver, state = fresh_state(g)
        solver.accelerate = accelerate
        rng = random.Random(seed)
        solver.anneal(state, int(0.5 * peak), 3000, 1.0, 1e-3, rng, False, math.inf)
        assert state.mem.tolist() == simulated_slots(g, state)
        res = hiremate.simulate(g, sequence_to_schedule(g, state.order()))
        assert res.valid, res.error
        assert state.peak == res.peak
        ends.append((list(state.seq), state.mem.tolist(), rng.random()))
    assert ends[0] == ends[1]


# -- chain models --------------------------------------------------------------------------------
@settings(max_examples=30, **PROPERTY)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 7), frac=st.floats(0, 1),
       weak=st.booleans())
def test_chain_model_peak_and_time_are_the_simulators(seed, n, frac, weak):
    """Rotor's chain model (``simulate_chain``) on the chain of a graph: the graph's simulated
    peak is the chain's, or the tail's (input-gradient sums, which the chain leaves out); the
    time is the chain's makespan plus the tail's."""
    from hiremate.solvers.chain.model import (
        graph_chain, ops_to_schedule, simulate_chain, store_all_ops,
    )
    from hiremate.solvers.chain.rotor import persistent_min_budget, solve_persistent, solve_weak

    g = fuzz_graph(seed, n, chain=True)
    gc, why = graph_chain(g)
    assert gc is not None, why
    lo = persistent_min_budget(gc.chain)
    hi = simulate_chain(gc.chain, store_all_ops(gc.chain)).peak
    sequences = [store_all_ops(gc.chain)]
    solve = solve_weak if weak else solve_persistent
    sequences.append(solve(gc.chain, lo + frac * max(hi - lo, 0), 50).ops)
    tail_time = math.fsum(g.nodes[k].time for k in gc.tail)
    for ops in sequences:
        chain = simulate_chain(gc.chain, ops)
        sim = hiremate.simulate(g, ops_to_schedule(gc, ops))
        assert chain.valid and sim.valid, sim.error
        assert sim.peak == max(chain.peak, gc.tail_need)
        assert sim.time == pytest.approx(chain.makespan + tail_time)


def join_spec(seed: int) -> FuzzSpec:
    """Two or three chains from their own inputs to their own model outputs, random ops."""
    rng = random.Random(seed)
    lengths = [rng.randint(1, 4) for _ in range(rng.randint(2, 3))]
    ops: list[FuzzOp] = []
    outs = []
    for j, length in enumerate(lengths):
        for i in range(length):
            inp = (-1 - j, 0) if i == 0 else (len(ops) - 1, 0)
            ops.append(FuzzOp([inp], [rng.randint(1, 9)], rng.randint(1, 5), rng.randint(1, 5),
                              saved_outputs=[0], overhead=rng.choice([0, 0, rng.randint(1, 5)]),
                              random=rng.random() < 0.4))
        outs.append((len(ops) - 1, 0))
    return FuzzSpec([rng.randint(1, 5) for _ in lengths], [False] * len(lengths), ops, outs)


@settings(max_examples=30, **PROPERTY)
@given(seed=st.integers(0, 10**6), frac=st.floats(0, 1))
def test_join_model_is_the_simulators(seed, frac):
    """The join DP's exact minimum is the simulated peak of its minimum-memory schedule; at any
    budget its schedule is valid (random order included), within the budget, and takes the time
    the DP predicts."""
    from hiremate.solvers.chain.join import JoinDP, _emit_min, _Emitter, graph_join, mm_start

    g = graph_from_spec(join_spec(seed))
    jg, why = graph_join(g)
    assert jg is not None, why
    solver = JoinDP()
    need, mm = solver._min(jg)
    em = _Emitter(jg)
    _emit_min(em, mm, *mm_start(jg))
    em.tail()
    sim = hiremate.simulate(g, tuple(em.steps))
    assert sim.valid, sim.error
    assert sim.peak == need
    top = hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak
    budget = int(need + frac * max(top - need, 0))
    sim = hiremate.simulate(g, solver.schedule(g, budget))
    assert sim.valid, sim.error
    assert sim.peak <= budget
    if solver.last_makespan is not None:
        assert sim.time == pytest.approx(solver.last_makespan)


# -- the tracker is the simulator ----------------------------------------------------------------
@settings(max_examples=30, **PROPERTY)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12),
       kind=st.sampled_from(["fuzz", "synthetic"]), cut=st.floats(0, 1))
def test_trace_tracker_and_simulate_agree(seed, n, kind, cut):
    """``simulate(trace=True)``, ``trace`` and a tracker fed step by step give the same
    memory during and after every step and the same peak, also for a prefix of a schedule
    (which ``trace`` replays without judging it)."""
    from hiremate.ir.tracker import MemoryTracker

    g = any_graph(seed, n, kind)
    sched = hiremate.autodiff_schedule(g)
    sim = hiremate.simulate(g, sched, trace=True)
    assert sim.valid, sim.error
    tr = trace(g, sched)
    assert tr == sim.trace and tr.after == sim.profile and tr.peak == sim.peak
    prefix = sched[: int(cut * len(sched))]
    tracker = MemoryTracker(g)
    during = [tracker.step(s) for s in prefix]
    assert tuple(during) == tr.during[: len(prefix)]
    assert tracker.peak == max([0, *during])
    assert np.all(np.asarray(tr.during) >= np.asarray(tr.after))
