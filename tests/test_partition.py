"""Tests of the partitioners (H-Partition, sequence, flat) and identical-subgraph recognition.

Independent truths: convexity and acyclicity checked with networkx reachability on edges rebuilt
from the Graph itself, dominators from networkx, separators by brute force, scores by hand, and
class translations checked node by node against the graph.
"""

from __future__ import annotations

import random

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiremate.errors import ConfigError
from hiremate.ir.graph import DataKind, Graph
from hiremate.registry import make_partitioner
from hiremate.partition import HPartition, Hierarchy, forward_dag
from hiremate.testing.gptlike import gpt_like_dag, gpt_like_dag_ops
from hiremate.partition.hpartition import (
    _Cuts, _Scorer, ancestor_suffix, candidates, immediate_dominators, is_closed, linked_nodes,
)
from hiremate.testing.synthetic import DagOp, chain_graph, graph_from_dag, random_dag, random_graph


# -- independent checks ------------------------------------------------------------------------
def fwd_digraph(graph: Graph) -> nx.DiGraph:
    """Forward nodes, with an edge for every memory or soft dependency between them."""
    g = nx.DiGraph()
    fwd = [n.id for n in graph.nodes if n.is_fwd]
    g.add_nodes_from(fwd)
    for n in graph.nodes:
        if not n.is_fwd:
            continue
        for d in n.inputs + n.soft_inputs:
            p = graph.data[d].producer
            if p is not None and graph.nodes[p].is_fwd:
                g.add_edge(p, n.id)
    return g


def is_convex(g: nx.DiGraph, members: set[int]) -> bool:
    reach_from = set().union(*(nx.descendants(g, m) for m in members))
    reach_to = set().union(*(nx.ancestors(g, m) for m in members))
    return not ((reach_from & reach_to) - members)


def check_hierarchy(h: Hierarchy, graph: Graph, max_sub: int | None, max_top: int | None) -> None:
    g = fwd_digraph(graph)
    fwd = sorted(g.nodes)
    assert h.depth == len(h.levels)
    for level, parts in enumerate(h.levels):
        leaves = sorted(leaf for p in parts for leaf in h.leaves(p))
        assert leaves == fwd, f"level {level} does not partition the forward nodes"
        owner = {leaf: p for p in parts for leaf in h.leaves(p)}
        quotient = nx.DiGraph()
        quotient.add_nodes_from(parts)
        quotient.add_edges_from((owner[a], owner[b]) for a, b in g.edges if owner[a] != owner[b])
        assert nx.is_directed_acyclic_graph(quotient), f"level {level} contracts to a cycle"
    assert h.top == h.levels[-1]
    for s in h.subgraphs:
        members = set(s.fwd_nodes)
        assert is_convex(g, members), f"subgraph {s.id} is not convex"
        if s.id != h.root:
            assert s.parent is not None and any(c.id == s.id and not c.is_node
                                                for c in h.subgraphs[s.parent].children)
            assert s.size >= 2
            if max_sub is not None:
                assert s.size <= max_sub
        else:
            assert s.parent is None
            if max_top is not None:
                assert s.size <= max_top
        assert sorted(s.bwd_nodes) == sorted(graph.nodes[f].partner for f in s.fwd_nodes
                                             if graph.nodes[f].partner is not None)
        inside = members | set(s.bwd_nodes)
        produced = {d for f in s.fwd_nodes for d in graph.nodes[f].outputs}
        leaving = {d for d in produced
                   if d in graph.outputs or any(u not in inside for u in graph.users(d))}
        assert set(s.outputs) == leaving
        entering = {d for f in s.fwd_nodes for d in graph.nodes[f].inputs} - produced
        assert set(s.inputs) == entering
        for d in s.grad_inputs:
            assert graph.data[d].producer not in inside
        for c in s.children:
            if not c.is_node:
                assert h.subgraphs[c.id].parent == s.id and c.id < s.id


def check_translations(h: Hierarchy, graph: Graph) -> None:
    """A class translation maps every node of the representative onto an identical node."""
    for cls in h.classes:
        rep = h.subgraphs[cls.representative]
        for sid in cls.members:
            t = h.translation(sid)
            member = h.subgraphs[sid]
            assert sorted(t.nodes[c] for c in rep.fwd_nodes) == list(member.fwd_nodes)
            for c in rep.fwd_nodes + rep.bwd_nodes:
                a, b = graph.nodes[c], graph.nodes[t.nodes[c]]
                assert a.signature == b.signature and a.kind == b.kind
                for ins_a, ins_b in ((a.inputs, b.inputs), (a.outputs, b.outputs)):
                    assert [t.data[d] for d in ins_a] == list(ins_b)
                    for da, db in zip(ins_a, ins_b):
                        assert graph.data[da].size == graph.data[db].size
            assert [t.data[d] for d in rep.outputs] == list(member.outputs)


# -- H-Partition properties --------------------------------------------------------------------
graph_params = st.tuples(
    st.integers(0, 10_000),           # seed
    st.integers(2, 45),               # forward nodes
    st.integers(1, 3),                # model inputs
    st.integers(1, 3),                # max fan-in
    st.sampled_from([0.0, 0.5, 2.0]),  # soft-dependency rate
)


def make_graph(params) -> Graph:
    seed, n, n_inputs, fanin, p_soft = params
    return random_graph(seed, n, n_inputs, max_fanin=fanin, p_soft=p_soft)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_params, st.integers(2, 8), st.integers(1, 12), st.sampled_from([0.0, 0.5, 1.0]))
def test_hpartition_properties(params, max_sub, max_top, alpha):
    graph = make_graph(params)
    part = HPartition(max_top=max_top, max_sub=max_sub, alpha=alpha)
    h = part.partition(graph)
    check_hierarchy(h, graph, max_sub, max_top)
    assert h.to_json() == part.partition(graph).to_json()  # deterministic
    check_translations(h, graph)


def with_isolated_nodes(seed: int, n: int, n_isolated: int, p_soft: float) -> Graph:
    """A random graph with ``n_isolated`` nodes that read only a user input and feed nothing
    (like BatchNorm's ``num_batches_tracked`` updates), inserted at random positions."""
    rng = random.Random(seed)
    ops = random_dag(rng, n, 2, p_soft=p_soft)
    slots = sorted(rng.sample(range(n + n_isolated), n_isolated))
    new_index: list[int] = []
    out: list[DagOp] = []
    k = 0
    for pos in range(n + n_isolated):
        if slots and pos == slots[0]:
            slots.pop(0)
            out.append(DagOp([-1], 8, 0.1, code="counter"))
        else:
            new_index.append(pos)
            out.append(ops[k])
            k += 1
    for op in out:
        op.inputs = [new_index[i] if i >= 0 else i for i in op.inputs]
        op.soft_inputs = [new_index[i] for i in op.soft_inputs]
    return graph_from_dag(out, [64, 64])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(2, 40), st.integers(1, 8), st.integers(2, 8),
       st.integers(1, 10), st.sampled_from([0.0, 2.0]))
def test_hpartition_with_isolated_nodes(seed, n, n_isolated, max_sub, max_top, p_soft):
    graph = with_isolated_nodes(seed, n, n_isolated, p_soft)
    h = HPartition(max_top=max_top, max_sub=max_sub).partition(graph)
    check_hierarchy(h, graph, max_sub, max_top)
    check_translations(h, graph)


def test_isolated_nodes_join_a_neighbour():
    """Nodes without any edge would never be grouped by the paper's candidates (their interval
    is themselves); they join a topological neighbour instead of staying alone."""
    ops: list[DagOp] = []
    prev = -1
    for _ in range(12):
        ops.append(DagOp([-1], 8, 0.1, code="counter"))
        ops.append(DagOp([prev], 100, 1.0, code="conv"))
        prev = len(ops) - 1
    graph = graph_from_dag(ops, [100])
    dag, _, _ = forward_dag(graph)
    assert sum(not x for x in linked_nodes(dag.preds)) == 12
    for max_sub, max_top in ((4, 6), (6, 6), (15, 3)):
        h = HPartition(max_top=max_top, max_sub=max_sub).partition(graph)
        check_hierarchy(h, graph, max_sub, max_top)
        assert h.depth <= 3
        first = h.owner(1)
        alone = [nid for nid in range(0, len(ops), 2) if first[nid].is_node]
        assert len(alone) <= 4, alone


def test_candidates_are_closed_and_convex():
    """Every initial candidate satisfies the closedness invariant, hence is convex (checked
    with networkx), on graphs with soft edges, several inputs and isolated nodes."""
    for seed in range(25):
        graph = with_isolated_nodes(seed, 30, 3, 2.0) if seed % 2 else make_graph(
            (seed, 35, 2, 3, 2.0))
        dag, node_ids, _ = forward_dag(graph)
        g = fwd_digraph(graph)
        linked = linked_nodes(dag.preds)
        for max_sub in (3, 6):
            for c in candidates(dag, max_sub):
                assert 2 <= len(c) <= max_sub
                assert is_closed(c, dag.preds, linked)
                assert is_convex(g, {node_ids[u] for u in c})


def test_ancestor_suffix_and_best_cut_by_brute_force():
    """The suffix is x's ancestors (networkx) from the top; the best cut is the prefix of
    smallest interface, recomputed from scratch with the eq. (1) scorer at alpha = 0."""
    for seed in range(20):
        graph = make_graph((seed, 40, 2, 3, 0.5))
        dag, node_ids, _ = forward_dag(graph)
        g = nx.DiGraph()
        g.add_nodes_from(range(dag.n))
        g.add_edges_from((p, i) for i, ps in enumerate(dag.preds) for p in ps)
        bytes_of = _Scorer(dag, 0.0)
        cuts = _Cuts(dag)
        for x in range(0, dag.n, 3):
            suffix = ancestor_suffix(x, dag.preds, 8)
            assert suffix == sorted(nx.ancestors(g, x) | {x}, reverse=True)[:8]
            k = cuts.best(suffix)
            if len(suffix) < 2:
                assert k == 0
                continue
            costs = [bytes_of(frozenset(suffix[:j])) for j in range(2, len(suffix) + 1)]
            assert k == 2 + costs.index(min(costs))


def layered_graph(layers: int, shared: bool) -> Graph:
    """Residual layers [a -> b -> c -> d, d + input]; with ``shared``, every b also reads a
    small value computed once at the start (an attention mask, say)."""
    ops = [DagOp([-1], 400, 1.0, code="embed"), DagOp([-1], 10, 1.0, code="mask")]
    x = 0
    for _ in range(layers):
        base = len(ops)
        ops.append(DagOp([x], 200, 1.0, code="a"))
        ops.append(DagOp([base] + ([1] if shared else []), 300, 1.0, code="b"))
        ops.append(DagOp([base + 1], 300, 1.0, code="c"))
        ops.append(DagOp([base + 2], 400, 1.0, code="d"))
        ops.append(DagOp([base + 3, x], 400, 1.0, code="res"))
        x = base + 4
    return graph_from_dag(ops, [100])


def test_a_value_shared_by_all_layers_does_not_flatten_the_hierarchy():
    """The shared value makes the virtual source the dominator of every layer; the partition
    must still find the per-layer blocks, with the same depth and classes as without it."""
    for layers in (8, 32):
        plain = HPartition(max_top=10, max_sub=6).partition(layered_graph(layers, False))
        graph = layered_graph(layers, True)
        h = HPartition(max_top=10, max_sub=6).partition(graph)
        check_hierarchy(h, graph, 6, 10)
        s, p = h.summary(), plain.summary()
        assert s["levels"] == p["levels"] <= 4
        assert abs(s["unique_subgraphs"] - p["unique_subgraphs"]) <= 1
        assert s["subgraphs"] > 2 * s["unique_subgraphs"]


def test_random_graphs_have_soft_dependencies_and_several_outputs():
    """Guard: the property test's graphs exercise what it claims to (soft edges, multi I/O)."""
    graph = random_graph(3, 40, 3, max_fanin=3, p_soft=2.0)
    assert sum(len(n.soft_inputs) for n in graph.nodes) > 0
    assert len(graph.outputs) > 1
    assert sum(d.kind is DataKind.INPUT for d in graph.data) == 3


def test_soft_dependency_is_respected():
    """Paper C.1.2: j -> k, soft k ~> k'. Without the soft edge, {j, k'} would be a fine group;
    with it, any group holding j and k' must hold k."""
    ops = [
        DagOp([-1], 100, 1.0, code="j"),
        DagOp([0], 1000, 1.0, code="k"),
        DagOp([0], 10, 1.0, code="k2", soft_inputs=[1]),
        DagOp([1], 10, 1.0, code="use_k"),
    ]
    graph = graph_from_dag(ops)
    for max_sub in (2, 3):
        h = HPartition(max_top=1, max_sub=max_sub).partition(graph)
        check_hierarchy(h, graph, max_sub, 1)
        for s in h.subgraphs:
            if 0 in s.fwd_nodes and 2 in s.fwd_nodes:
                assert 1 in s.fwd_nodes


def test_dominators_match_networkx():
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 40)
        preds = [tuple(sorted(rng.sample(range(i), rng.randint(0, min(i, 3))))) for i in range(n)]
        g = nx.DiGraph()
        g.add_node("src")
        for i, ps in enumerate(preds):
            g.add_node(i)
            if not ps:
                g.add_edge("src", i)
            for p in ps:
                g.add_edge(p, i)
        truth = nx.immediate_dominators(g, "src")
        ours = immediate_dominators(preds, cap=10 * n + 10)
        assert ours == [-1 if truth[i] == "src" else truth[i] for i in range(n)]


def test_dominator_cap_gives_a_true_dominator():
    """With a small cap the answer may be the virtual source but never a non-dominator."""
    rng = random.Random(1)
    for _ in range(30):
        n = rng.randint(5, 60)
        preds = [tuple(sorted(rng.sample(range(i), rng.randint(0, min(i, 3))))) for i in range(n)]
        exact = immediate_dominators(preds, cap=10 * n)
        capped = immediate_dominators(preds, cap=2)
        for x in range(n):
            d = exact[x]
            chain = set()
            while d != -1:
                chain.add(d)
                d = exact[d]
            assert capped[x] == -1 or capped[x] in chain


def test_score_by_hand():
    """Chain x -> 0 -> 1 -> 2 -> loss with sizes 10, 20, 30: s({1, 2}) = (10 + 30) * 2^0.5."""
    graph = chain_graph([10, 20, 30], [1.0, 1.0, 1.0])
    dag, _, _ = forward_dag(graph)
    score = _Scorer(dag, 0.5)
    assert score(frozenset({1, 2})) == pytest.approx(40 * 2 ** 0.5)
    assert score(frozenset({0, 1})) == pytest.approx(20 * 2 ** 0.5)  # x and a0 cost nothing
    assert _Scorer(dag, 1.0)(frozenset({0, 1, 2})) == pytest.approx(30 * 3)


def test_chain_is_cut_into_intervals_at_small_values():
    """On a chain, groups are intervals, and the greedy prefers cutting at the small values."""
    sizes = [100, 100, 1, 100, 100, 1, 100, 100, 1]
    graph = chain_graph(sizes, [1.0] * len(sizes))
    h = HPartition(max_top=3, max_sub=3).partition(graph)
    check_hierarchy(h, graph, 3, 3)
    blocks = [s.fwd_nodes for s in h.subgraphs if s.id != h.root]
    assert blocks == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]


def test_small_graph_is_left_flat():
    graph = random_graph(0, 5)
    h = HPartition(max_top=10, max_sub=4).partition(graph)
    assert h.depth == 1 and len(h.subgraphs) == 1 and len(h.top) == 5


def test_independent_nodes_fall_back_to_intervals():
    """No candidate exists when nothing depends on anything: intervals still make progress."""
    ops = [DagOp([-1], 10, 1.0, code=f"c{i % 2}") for i in range(20)]
    graph = graph_from_dag(ops)
    h = HPartition(max_top=4, max_sub=3).partition(graph)
    check_hierarchy(h, graph, 3, 4)


def test_bad_parameters_raise_config_errors():
    with pytest.raises(ConfigError, match="max_sub"):
        HPartition(max_sub=1)
    with pytest.raises(ConfigError, match="max_top"):
        HPartition(max_top=0)
    with pytest.raises(ConfigError, match="unknown partitioner 'nope'"):
        make_partitioner("nope")
    with pytest.raises(ConfigError, match="bad parameters"):
        make_partitioner("flat", {"max_sub": 3})


# -- identical subgraphs -----------------------------------------------------------------------
def gpt_graph(layers: int, perturb: int | None = None) -> Graph:
    ops = gpt_like_dag_ops(layers, batch=1, seq=8, dim=16, heads=2)
    if perturb is not None:
        ops[perturb].size += 4
    return graph_from_dag(ops, [8])


def test_unique_classes_do_not_grow_with_repeated_blocks():
    counts = {}
    for k in (12, 24, 48):
        graph = gpt_graph(k)
        h = HPartition(max_top=30, max_sub=15).partition(graph)
        counts[k] = h.summary()["unique_subgraphs"]
        assert h.summary()["subgraphs"] > 3 * counts[k]  # most subgraphs are repeats
        if k == 12:
            check_hierarchy(h, graph, 15, 30)
            check_translations(h, graph)
    assert max(counts.values()) - min(counts.values()) <= 2, counts


def test_zoo_gpt2_unique_subgraphs_do_not_grow():
    """On a captured GPT-2 (its causal mask is read by every layer, its layer norms have three
    outputs, its reshapes are folded in) the unique classes stay put from 2 to 4 layers, and the
    hierarchy stays shallow."""
    import hiremate
    from hiremate import zoo

    counts = {}
    for layers in (2, 4):
        model, sample = zoo.get("gpt2", layers=layers)
        graph = hiremate.build_graph(model, sample, cost_model="flops")
        h = HPartition(max_top=30, max_sub=15).partition(graph)
        check_hierarchy(h, graph, 15, 30)
        s = h.summary()
        counts[layers] = s["unique_subgraphs"]
        assert s["levels"] <= 3
        # each layer's attention block and MLP block are subgraphs of 8 nodes or more
        assert sum(sub.size >= 8 for sub in h.subgraphs if sub.id != h.root) >= 2 * layers
    assert counts[4] <= counts[2] + 1, counts


def test_a_different_node_breaks_identity():
    """A node whose output size differs from its twins makes its subgraphs unique."""
    graph = gpt_graph(12)
    perturbed = 4 + 37 * 5 + 10  # a node in the middle of layer 5
    g2 = gpt_graph(12, perturb=perturbed)
    h = HPartition(max_top=30, max_sub=15).partition(g2)
    check_translations(h, g2)
    holders = [s.id for s in h.subgraphs if perturbed in s.fwd_nodes]
    assert holders
    for sid in holders:
        assert len(h.classes[h.class_of[sid]].members) == 1
    base = HPartition(max_top=30, max_sub=15).partition(graph)
    assert h.summary()["unique_subgraphs"] > base.summary()["unique_subgraphs"]


def test_schedule_translation():
    """Translating a schedule over the representative gives the member's own steps."""
    from hiremate.ir.schedule import Compute, Delete

    graph = gpt_graph(12)
    h = HPartition(max_top=30, max_sub=15).partition(graph)
    cls = max(h.classes, key=lambda c: len(c.members))
    rep = h.subgraphs[cls.representative]
    sched = tuple(Compute(c) for c in rep.fwd_nodes) + tuple(Delete(d) for d in rep.outputs)
    for sid in cls.members:
        out = h.translation(sid).schedule(sched)
        member = h.subgraphs[sid]
        assert [s.node for s in out if isinstance(s, Compute)] == list(member.fwd_nodes)
        assert [s.data for s in out if isinstance(s, Delete)] == list(member.outputs)


def test_dag_only_classes():
    """Without a Graph, classes come from labels, value sizes and predecessor positions."""
    h = HPartition(max_top=30, max_sub=15).partition_dag(gpt_like_dag(24))
    s = h.summary()
    assert s["unique_subgraphs"] < s["subgraphs"] / 3
