"""The step's view (:func:`hiremate.composer.step_view.step_view`) pinned to the simulator's
whole-step rule (:func:`hiremate.ir.simulator.step_peak`), on random graphs with random ops.

The solvers plan a whole training step on the view; what the executor holds is the rule's. So
on every schedule:

- without generator states (or without random ops) the view's peak *is* the step's peak:
  output gradients held to the end, the loss's memory on the loss step;
- with them it is never below the step's peak from the loss on (where the solvers place
  reruns, and where such schedules peak), on schedules that rerun a random op only before
  the last node that needs it; before the loss it may be below by the states;
- a schedule of the view runs on the graph.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hiremate.composer.step_view import last_needed, rng_state_reserve, step_view
from hiremate.ir.graph import Graph
from hiremate.ir.schedule import Compute
from hiremate.ir.simulator import autodiff_schedule, simulate, step_peak
from hiremate.testing.fuzzgraphs import graph_from_spec, random_spec
from test_executor_schedules import keep_schedule


def _graph(seed: int, n_ops: int, random_ops: list[bool], per_state: int) -> Graph:
    spec = random_spec(seed, n_ops, max_size=1000)
    for op, drawn in zip(spec.ops, random_ops):
        op.random = drawn
    payload = graph_from_spec(spec).to_dict()
    payload["meta"]["rng_state_bytes"] = per_state
    return Graph.from_dict(payload)


def _schedules(view: Graph, keep_seed: int):
    """Store-everything and three recomputing schedules of the view (reruns in the backward),
    and each of them with one random op rerun once more, at every place where it may run
    (reruns in the forward, between reruns, after the last)."""
    acts = [d.id for d in view.data if d.producer is not None and view.nodes[d.producer].is_fwd]
    bases = [autodiff_schedule(view), keep_schedule(view, ()),
             keep_schedule(view, acts[keep_seed % 2::2]),
             keep_schedule(view, acts[keep_seed % 3::3])]
    randoms = [n.id for n in view.nodes if n.random]
    for base in bases:
        yield base
        for node in randoms[keep_seed % 2::2]:
            first = base.index(Compute(node))
            for at in range(first + 1, len(base) + 1):
                rerun = base[:at] + (Compute(node),) + base[at:]
                if simulate(view, rerun).valid:
                    yield rerun


@settings(max_examples=60, deadline=None)
@example(seed=257, n_ops=6, random_ops=[False] * 4 + [True] + [False] * 4, per_state=1,
         loss_bytes=0, keep_seed=0)  # a peak in the forward, with a state kept there
@given(seed=st.integers(0, 10**6), n_ops=st.integers(2, 9),
       random_ops=st.lists(st.booleans(), min_size=9, max_size=9),
       per_state=st.sampled_from([0, 1, 500, 5056]), loss_bytes=st.integers(0, 3000),
       keep_seed=st.integers(0, 5))
def test_the_view_is_the_step(seed, n_ops, random_ops, per_state, loss_bytes, keep_seed):
    graph = _graph(seed, n_ops, random_ops, per_state)
    exact = step_view(graph, loss_bytes, rng_states=False)
    assert len(exact.graph.nodes) == len(graph.nodes) and len(exact.graph.data) == len(graph.data)
    for schedule in _schedules(exact.graph, keep_seed):
        seen = simulate(exact.graph, schedule)
        assert seen.valid, seen.error
        assert exact.schedule_of(schedule) == schedule
        assert simulate(graph, schedule).valid  # ids are the graph's
        assert seen.peak == step_peak(graph, schedule, loss_bytes, rng_states=False)
        if not rng_state_reserve(graph):
            assert seen.peak == step_peak(graph, schedule, loss_bytes)
    counted = step_view(graph, loss_bytes, rng_states=True)
    full = rng_state_reserve(graph)
    needed = last_needed(graph) if full else {}
    assert len(counted.graph.data) == len(graph.data) + len(needed)
    for schedule in _schedules(counted.graph, keep_seed):
        seen = simulate(counted.graph, schedule, trace=True)
        assert seen.valid, seen.error
        mapped = counted.schedule_of(schedule)
        assert simulate(graph, mapped).valid
        if any(_reruns_after(schedule, n.id, needed.get(n.id, -1))
               for n in graph.nodes if n.random):
            continue  # a rerun that no later node needs: not the view's to bound
        # from the loss on the view holds every state that a rerun may need; before it, none
        loss_at = schedule.index(Compute(graph.loss))
        forward = max(seen.trace.during[:loss_at], default=0)
        assert step_peak(graph, mapped, loss_bytes) <= max(seen.peak, forward + full)


def _reruns_after(schedule, op: int, reader: int) -> bool:
    """Whether ``op`` runs again after the last run of ``reader`` (-1: after its first run)."""
    runs = [i for i, s in enumerate(schedule) if isinstance(s, Compute)]
    last_reader = max((i for i in runs if schedule[i].node == reader), default=-1)
    return any(i > last_reader for i in [i for i in runs if schedule[i].node == op][1:])


def test_a_schedule_that_frees_an_output_gradient_is_refused_by_the_view():
    """The view's output gradients cannot be freed: a solver that frees one (which frees
    nothing while autograd holds it) is told so by the simulator."""
    graph = _graph(3, 6, [False] * 9, 0)
    schedule = keep_schedule(graph, ())  # made on the graph: it frees the output gradients
    assert simulate(graph, schedule).valid
    view = step_view(graph, 0, rng_states=False).graph
    assert not simulate(view, schedule).valid
