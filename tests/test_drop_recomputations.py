"""Recomputations that nothing needs are dropped from a schedule (a subgraph's forward rerun
for one of its values reruns its other nodes too): property tests on random graphs, against
the simulator."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiremate.ir.schedule import Compute
from hiremate.ir.sequence import drop_unused_recomputations, sequence_to_schedule
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.testing.synthetic import random_graph


def _with_reruns(graph, seed: int, reruns: int) -> tuple:
    """Autodiff's node order with ``reruns`` forward nodes run again at random later places
    (each after its first run), freed as :func:`sequence_to_schedule` frees."""
    rng = random.Random(seed)
    order = [s.node for s in autodiff_schedule(graph) if isinstance(s, Compute)]
    fwd = [n.id for n in graph.fwd_nodes]
    for _ in range(reruns):
        node = rng.choice(fwd)
        first = order.index(node)
        order.insert(rng.randint(first + 1, len(order)), node)
    return sequence_to_schedule(graph, order)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(3, 18), reruns=st.integers(0, 6))
def test_dropping_unneeded_recomputations_keeps_the_schedule_valid_and_never_worse(
        seed, n, reruns):
    """Property: the result is valid whenever the schedule was, its peak and time are at most
    the schedule's, only recomputations go (every node still runs at least once), and what is
    left is stable (a second pass drops nothing)."""
    graph = random_graph(seed, n)
    schedule = _with_reruns(graph, seed, reruns)
    before = simulate(graph, schedule)
    if not before.valid:
        return
    after_schedule = drop_unused_recomputations(graph, schedule)
    after = simulate(graph, after_schedule)
    assert after.valid, after.error
    assert after.peak <= before.peak
    assert after.time <= before.time + 1e-12
    runs = {s.node for s in after_schedule if isinstance(s, Compute)}
    assert runs == {s.node for s in schedule if isinstance(s, Compute)}
    assert drop_unused_recomputations(graph, after_schedule) is after_schedule


def test_a_rerun_whose_outputs_nothing_reads_is_dropped_with_its_free():
    """A forward node run again at the very end of the backward, where nothing reads it: the
    step and the Delete that frees its copy both go, and the time falls by the node's time;
    autodiff's schedule, which recomputes nothing, comes back as the same object."""
    graph = random_graph(3, 10)
    autodiff = autodiff_schedule(graph)
    assert drop_unused_recomputations(graph, autodiff) is autodiff
    order = [s.node for s in autodiff if isinstance(s, Compute)]
    rerun = next(n.id for n in graph.fwd_nodes if n.outputs)
    schedule = sequence_to_schedule(graph, order + [rerun])
    before = simulate(graph, schedule)
    assert before.valid
    dropped = drop_unused_recomputations(graph, schedule)
    assert len(dropped) == len(schedule) - 1 - len(graph.nodes[rerun].outputs)
    after = simulate(graph, dropped)
    assert after.valid
    assert after.time == before.time - graph.nodes[rerun].time
