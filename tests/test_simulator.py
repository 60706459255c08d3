"""The simulator against hand-computed figures and deliberately broken schedules."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hiremate
from hiremate import Compute, Delete, DataKind, InvalidScheduleError, autodiff_schedule, simulate
from hiremate.ir.simulator import gradients_once_floor, step_memory_floor, step_peak
from hiremate.testing.synthetic import chain_graph, random_graph


def test_chain_peak_and_time_by_hand():
    # x -> a0 (10 B) -> a1 (20 B) -> a2 (30 B) -> loss; backward keeps grads of 20, 10 bytes
    g = chain_graph([10, 20, 30], [1.0, 2.0, 3.0])
    sim = simulate(g, autodiff_schedule(g))
    assert sim.valid
    # after the loss: a0 + a1 + a2 + tangent(30); bwd2 then allocates the grad of a1 (20)
    assert sim.peak == 10 + 20 + 30 + 30 + 20
    assert sim.time == pytest.approx(1 + 2 + 3 + 2 * (1 + 2 + 3))


def test_overhead_counts_while_the_node_runs():
    from hiremate.testing.synthetic import DagOp, graph_from_dag

    g = graph_from_dag([DagOp([-1], 100, 1.0, overhead=1000)], [8])
    sim = simulate(g, autodiff_schedule(g))
    assert sim.peak >= 100 + 1000


def _first_fwd_consumer(graph):
    for node in graph.fwd_nodes:
        for d in node.inputs:
            if graph.data[d].kind is DataKind.ACTIVATION:
                return node, d
    raise AssertionError("no activation read by a forward node")


def test_rejects_use_of_deleted_data():
    g = random_graph(3, 12)
    steps = list(autodiff_schedule(g))
    node, d = _first_fwd_consumer(g)
    at = steps.index(Compute(node.id))
    steps.insert(at, Delete(d))
    sim = simulate(g, tuple(steps))
    assert not sim.valid
    assert sim.step == at + 1
    assert g.data[d].name in sim.error and "not in memory" in sim.error
    with pytest.raises(InvalidScheduleError) as info:
        sim.raise_if_invalid()
    assert info.value.step == at + 1


def test_rejects_backward_before_its_inputs():
    g = random_graph(4, 10)
    steps = list(autodiff_schedule(g))
    bwd = g.bwd_nodes[0]
    steps.remove(Compute(bwd.id))
    loss_at = steps.index(Compute(g.loss))
    steps.insert(loss_at, Compute(bwd.id))
    sim = simulate(g, tuple(steps))
    assert not sim.valid and sim.step == loss_at
    assert "backward" in sim.error


def test_rejects_missing_gradients_at_the_end():
    g = random_graph(5, 10)
    grad = next(d.id for d in g.data if d.kind is DataKind.PARAM_GRAD)
    steps = tuple(autodiff_schedule(g)) + (Delete(grad),)
    sim = simulate(g, steps)
    assert not sim.valid and sim.step == len(steps)
    assert "gradients missing" in sim.error and g.data[grad].name in sim.error
    # a schedule that stops before the backward never produces them either
    upto_loss = tuple(autodiff_schedule(g))[: list(autodiff_schedule(g)).index(Compute(g.loss)) + 1]
    assert "gradients missing" in simulate(g, upto_loss).error


def test_rejects_deleting_sources_and_outputs_and_double_loss():
    g = chain_graph([10, 20], [1.0, 1.0])
    base = list(autodiff_schedule(g))
    param = next(d.id for d in g.data if d.kind is DataKind.PARAM)
    assert "cannot be deleted" in simulate(g, (Delete(param), *base)).error
    out = g.outputs[0]
    sched = base[: base.index(Compute(g.loss)) + 1] + [Delete(out)]
    assert "model output" in simulate(g, tuple(sched)).error
    twice = base[: base.index(Compute(g.loss)) + 1] + [Compute(g.loss)]
    assert "loss node runs twice" in simulate(g, tuple(twice)).error
    assert "no compute node" in simulate(g, (Compute(999),)).error


def test_recomputation_costs_time_and_counts_duplicates():
    g = chain_graph([10, 20, 30], [1.0, 2.0, 3.0])
    base = autodiff_schedule(g)
    extra = tuple(base) + (Compute(0),)
    sim = simulate(g, extra)
    assert sim.valid
    assert sim.time == pytest.approx(simulate(g, base).time + 1.0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25), inputs=st.integers(1, 3))
def test_autodiff_is_valid_and_profile_consistent(seed, n, inputs):
    g = random_graph(seed, n, n_inputs=inputs)
    sim = simulate(g, autodiff_schedule(g))
    assert sim.valid, sim.error
    assert sim.peak >= max(sim.profile)
    # every counted datum that is not kept at the end is freed
    kept = sum(g.data[d].size for d in set(g.outputs) | set(g.final_data) if g.data[d].counted)
    assert sim.profile[-1] == kept


# -- the executor's rules, held by the simulator ---------------------------------------------------
def _two_random_branches(mutates_b: bool = False, effect_only: bool = False):
    """x -> a (random), x -> b (random; instead, writes a buffer when ``mutates_b``), both
    outputs; with ``effect_only``, a forward node with no output that only writes a buffer."""
    from dataclasses import replace

    from hiremate.ir.graph import ComputeNode, DataNode, Graph, NodeKind
    from hiremate.testing.fuzzgraphs import FuzzOp, FuzzSpec, graph_from_spec

    g = graph_from_spec(FuzzSpec([8], [False], [
        FuzzOp([(-1, 0)], [16], random=True),
        FuzzOp([(-1, 0)], [16], random=not mutates_b, mutates=mutates_b)], [(0, 0), (1, 0)]))
    if not effect_only:
        return g
    # a node that only bumps a counter buffer, before the loss
    nodes, data = list(g.nodes), list(g.data)
    buf = DataNode(len(data), "counter", DataKind.BUFFER, (), "int64", 8)
    loss = g.loss
    shifted = [replace(n, id=n.id + 1) if n.id >= loss else n for n in nodes]
    remap = {n.id: n.id + 1 for n in nodes if n.id >= loss}
    data = [replace(d, producer=remap.get(d.producer, d.producer)) for d in data] + [buf]
    shifted = [replace(n, partner=remap.get(n.partner, n.partner)) for n in shifted]
    bump = ComputeNode(loss, "bump", NodeKind.FWD, (buf.id,), (), mutates=("counter",))
    return Graph(shifted[:loss] + [bump] + shifted[loss:], data, g.outputs, g.meta)


def test_random_nodes_must_first_run_in_graph_order():
    g = _two_random_branches()
    ok = autodiff_schedule(g)
    assert simulate(g, ok).valid
    a, b = (n.id for n in g.nodes if n.random)
    swapped = list(ok)
    i, j = swapped.index(Compute(a)), swapped.index(Compute(b))
    swapped[i], swapped[j] = swapped[j], swapped[i]
    sim = simulate(g, tuple(swapped))
    assert not sim.valid and sim.step == j and "random node" in sim.error
    # a recomputation of the earlier one later is a replay, not a first run: fine
    again = tuple(ok[: ok.index(Compute(g.loss))]) + (Compute(a),) + tuple(
        ok[ok.index(Compute(g.loss)):])
    assert simulate(g, again).valid


def _unread(g, node: int):
    """``g`` with the outputs of ``node`` neither returned nor read: a schedule may skip it."""
    from dataclasses import replace

    from hiremate.ir.graph import Graph

    gone = set(g.nodes[node].outputs)
    nodes = [replace(n, inputs=tuple(d for d in n.inputs if d not in gone)) if n.is_loss else n
             for n in g.nodes]
    return Graph(nodes, g.data, [d for d in g.outputs if d not in gone], g.meta)


def _skip(g, node: int):
    gone = set(g.nodes[node].outputs)
    return tuple(s for s in autodiff_schedule(g) if s != Compute(node)
                 and not (isinstance(s, Delete) and s.data in gone))


def test_every_random_forward_node_must_run():
    g = _two_random_branches()
    b = max(n.id for n in g.nodes if n.random)
    g = _unread(g, b)
    assert simulate(g, autodiff_schedule(g)).valid
    sim = simulate(g, _skip(g, b))
    assert not sim.valid and "never computes the random node" in sim.error


def test_buffer_writes_must_run_unless_the_executor_adds_them():
    g = _two_random_branches(mutates_b=True)
    b = next(n.id for n in g.nodes if n.mutates)
    g = _unread(g, b)
    assert simulate(g, autodiff_schedule(g)).valid
    sim = simulate(g, _skip(g, b))
    assert not sim.valid and "writes the buffers" in sim.error
    g = _two_random_branches(effect_only=True)
    bump = next(n.id for n in g.nodes if n.mutates)
    assert simulate(g, autodiff_schedule(g)).valid
    assert simulate(g, _skip(g, bump)).valid  # the executor runs it before the loss itself


def test_trace_is_cheap_unless_asked():
    g = random_graph(5, 12)
    sched = autodiff_schedule(g)
    plain, traced = simulate(g, sched), simulate(g, sched, trace=True)
    assert plain.trace is None and traced.trace is not None
    assert plain.peak == traced.peak == traced.trace.peak
    assert traced.trace.after == plain.profile
    deletes = [i for i, s in enumerate(sched) if isinstance(s, Delete)]
    assert all(traced.trace.freed[i] == (sched[i].data,) for i in deletes)
    assert max(traced.trace.during) == plain.peak


class _Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(64, 64)
        self.branch = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                          torch.nn.Linear(64, 64))
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        h = self.stem(x)
        return self.head(self.branch(h) + h)


def test_gradients_once_floor_holds_the_skip_gradient():
    """While the residual branch's backward runs, the skip connection's gradient waits for the
    sum at the branch's input: a schedule that makes each gradient once holds it, so the floor
    of such schedules is above the plain floor and still below the store-all step peak."""
    torch.manual_seed(0)
    graph = hiremate.build_graph(_Residual(), (torch.randn(32, 64),), cost_model="flops")
    plain, once = step_memory_floor(graph), gradients_once_floor(graph)
    assert plain < once <= step_peak(graph, autodiff_schedule(graph))
    assert once - plain == 32 * 64 * 4  # one float32 gradient of the skip connection
