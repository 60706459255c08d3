"""Peeling a block's sink for the hierarchical solve (``partition/peel.py``).

Truths used: brute-force reachability (convexity, topological order of the blocks), the flat
H-ILP's proven optimum on a small U-shaped graph (no hierarchy can beat it; with the sink
peeled the hierarchical H-ILP reaches it, without it does not), the simulator, and the
top-level contraction's own acyclicity check (``top_graph``).
"""

from __future__ import annotations

import pytest
import torch

import hiremate
from hiremate.errors import ConfigError, SolverError
from hiremate.ir.blocks import TopProblem, make_blocks
from hiremate.ir.graph import Graph
from hiremate.registry import make_partitioner
from hiremate.partition import PeelPartition, SequencePartition, forward_dag
from hiremate.partition.hierarchy import hierarchy_from_levels
from hiremate.partition.peel import peel_sinks
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.solvers.hilp.flat import CheckmateSolver
from hiremate.solvers.hilp.hier import top_graph
from hiremate.solvers.hilp.top import HilpTop
from hiremate.testing.synthetic import DagOp, graph_from_dag, random_dag, random_graph
from test_hilp_hier import problem_of


def u_shaped(post: int = 3) -> hiremate.Graph:
    """A one-level U-Net: the skip from op 1 enters the concatenation (op 6, the sink of the
    block 2..6) whose output is twice as large as the values around it; ``post`` conv+relu
    pairs after it (their backward runs while the concatenation's output is not needed)."""
    def act(i, size):
        return DagOp([i], size, 1.0, has_param=False, saves_inputs=False, saves_output=True)

    ops = [DagOp([-1], 64, 2.0), act(0, 64), DagOp([1], 64, 1.0, has_param=False),
           DagOp([2], 64, 2.0), act(3, 64), DagOp([4], 64, 2.0),
           DagOp([1, 5], 128, 0.5, has_param=False, saves_inputs=False)]
    for _ in range(post):
        ops.append(DagOp([len(ops) - 1], 64, 2.0))
        ops.append(act(len(ops) - 1, 64))
    return graph_from_dag(ops, [64])


def staged_graph(seed: int, stages: int = 3, n: int = 7) -> hiremate.Graph:
    """Random DAG segments, each closed by a join that reads the segment's dead ends: the
    sequence partition's blocks then each have a single sink (the join, or a separator)."""
    import random

    rng = random.Random(seed)
    ops: list[DagOp] = []
    prev = -1
    for _ in range(stages):
        base = len(ops)
        seg = random_dag(rng, n)
        for op in seg:
            op.inputs = [base + j if j >= 0 else prev for j in op.inputs]
            op.soft_inputs = [base + j for j in op.soft_inputs]
            ops.append(op)
        used = {j for op in ops[base:] for j in op.inputs}
        ends = [i for i in range(base, len(ops)) if i not in used]
        ops.append(DagOp(ends, rng.randint(1, 1000), 1.0, has_param=False, saves_inputs=False))
        prev = len(ops) - 1
    return graph_from_dag(ops, [100])


def reach(succs: list[list[int]]) -> list[set[int]]:
    out: list[set[int]] = [set() for _ in succs]
    for u in range(len(succs) - 1, -1, -1):
        for v in succs[u]:
            out[u] |= {v} | out[v]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_peel_keeps_blocks_convex_and_in_topological_order(seed):
    """Every block is convex and no edge goes to an earlier block (brute-force reachability);
    each peeled single node was the only sink of its block, the rest of which follows the
    same order; blocks too small, or with several sinks, are unchanged."""
    g = staged_graph(seed) if seed % 2 == 0 else random_graph(seed, 24)
    dag, node_ids, _ = forward_dag(g)
    base = SequencePartition().partition_dag(dag)
    before = [tuple(sorted(base.leaves(p))) for p in base.top]
    h = PeelPartition("sequence", peel_min=3).partition_dag(dag)
    after = [tuple(sorted(h.leaves(p))) for p in h.top]
    succs = dag.succs()
    r = reach(succs)
    assert sorted(u for b in after for u in b) == list(range(dag.n))
    where = {u: k for k, b in enumerate(after) for u in b}
    for k, b in enumerate(after):
        inside = set(b)
        for u in b:
            for v in r[u]:
                assert where[v] >= k  # topological order of the blocks
                if v not in inside:   # convex: nothing reached from outside comes back in
                    assert not (r[v] & inside)
    peeled = 0
    k = 0
    for b in before:
        sinks = [u for u in b if not set(succs[u]) & set(b)]
        if len(b) >= 3 and len(sinks) == 1:
            assert after[k] == tuple(u for u in b if u != sinks[0])
            assert after[k + 1] == (sinks[0],)
            k += 2
            peeled += 1
        else:
            assert after[k] == b
            k += 1
    assert k == len(after)
    if seed % 2 == 0:  # staged graphs: one sink per block, so every large block is peeled
        assert peeled == sum(1 for b in before if len(b) >= 3) > 0


def test_peeled_hierarchy_reaches_the_flat_optimum_on_a_u_net_level():
    """The flat H-ILP's proven optimum bounds every hierarchical schedule from below. Without
    peeling, the hierarchy cannot free the concatenation's output during the late backward and
    get it back cheaply (only by running the whole block again): it is slower. With the sink
    peeled, the hierarchical H-ILP finds a schedule as fast as the flat optimum."""
    g = u_shaped(3)
    ad = simulate(g, autodiff_schedule(g))
    budget = int(0.7 * ad.peak)
    flat = CheckmateSolver(time_limit=30).solve(g, budget)
    assert flat.status == "optimal"
    times = {}
    for name, part in (("seq", SequencePartition()), ("peel", PeelPartition("sequence", 5))):
        problem = problem_of(g, part, "hilp")
        found, _ = HilpTop(time_limit=10).compose(problem, budget)
        best = min(found, key=lambda c: c.sim.time)
        assert best.sim.valid and best.sim.peak <= budget
        assert simulate(g, best.schedule).time == pytest.approx(best.sim.time)
        assert best.sim.time >= flat.simulation.time - 1e-9
        times[name] = best.sim.time
    assert [b.fwd for b in problem.blocks][2:4] == [(2, 3, 4, 5), (6,)]
    assert times["peel"] == pytest.approx(flat.simulation.time)
    assert times["seq"] > times["peel"] + 1.0


class _Residual(torch.nn.Module):
    """A block whose sink is a residual add (no backward node) fed by a value made inside."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        z = self.a(x)
        h = self.b(torch.relu(z))
        return self.d((h + self.c(torch.relu(h))) + z).sum()


def _paired_as_autograd_tags(graph):
    """``graph`` with its gradient sums paired with its last forward node, whose backward op
    autograd runs first and whose sequence number it gives the sums it inserts (the graph
    builder leaves them unpaired)."""
    last = graph.fwd_nodes[-1].id
    payload = graph.to_dict()
    for node in graph.bwd_nodes:
        made_by_backward = [graph.data[d].producer for d in node.inputs
                            if graph.data[d].producer is not None
                            and graph.nodes[graph.data[d].producer].is_bwd]
        if node.partner is None and len(made_by_backward) >= 2:
            payload["nodes"][node.id]["partner"] = last
            if payload["nodes"][last]["partner"] is None:
                payload["nodes"][last]["partner"] = node.id
    return Graph.from_dict(payload)


def test_peel_is_vetoed_where_the_contracted_backward_would_have_a_cycle():
    """The gradient of ``h`` sums what flows back through the two adds (from the next block's
    backward) and through ``c`` (from the block's own). Paired with the model's last forward
    node, as autograd tags it, that sum would sit in the last block's backward: with the sink
    peeled, the blocks' backward parts depend on each other in a cycle, which the hierarchical
    H-ILP's contraction rejects, and the partitioner leaves the block whole. The graph builder
    leaves the sum unpaired, so it goes with its readers and the peel stands."""
    built = hiremate.build_graph(_Residual(), torch.randn(4, 8), cost_model="flops")
    for g, vetoed in ((_paired_as_autograd_tags(built), True), (built, False)):
        dag, node_ids, _ = forward_dag(g)
        whole = SequencePartition().partition(g)
        h = PeelPartition("sequence", peel_min=2).partition(g)
        same = [h.leaves(p) for p in h.top] == [whole.leaves(p) for p in whole.top]
        assert same is vetoed
        index = {n: i for i, n in enumerate(node_ids)}
        blocks = [tuple(sorted(index[n] for n in whole.leaves(p))) for p in whole.top]
        forced = peel_sinks(dag, blocks, 2)
        assert len(forced) == len(blocks) + 1
        blocks_f, tail = make_blocks(g, hierarchy_from_levels(dag, [forced], "forced", graph=g,
                                                              node_ids=node_ids))
        if vetoed:
            with pytest.raises(SolverError, match="cycle"):
                top_graph(TopProblem(g, blocks_f, tail))
        else:
            top_graph(TopProblem(g, blocks_f, tail))


def test_peel_partitioner_registry_and_errors():
    g = u_shaped(1)
    p = make_partitioner("peel", {"base": "sequence", "peel_min": 5})
    assert repr(p) == "PeelPartition(SequencePartition(), peel_min=5)"
    assert p.partition(g).partitioner == repr(p)
    with pytest.raises(ConfigError, match="peel_min"):
        PeelPartition("sequence", peel_min=0)
    with pytest.raises(ConfigError, match="another partitioner"):
        PeelPartition("peel")
    with pytest.raises(ConfigError, match="unknown base partitioner"):
        PeelPartition("nonesuch")
