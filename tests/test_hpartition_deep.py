"""H-Partition on deep hierarchies: size bounds at every level, convexity, leaves, links,
identical classes, the prologue pre-pass, and determinism.

Small ``max_sub`` and ``max_top`` on graphs of 30-200 nodes force three levels or more, where
the per-level code paths (isolated nodes, the interval fallback, the prologue's own levels)
meet. The checker is independent of the partitioner: reachability from networkx on edges
rebuilt from the Graph, and class identity from the nodes' own signatures.
"""

from __future__ import annotations

import os
import subprocess
import sys

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiremate.ir.graph import Graph
from hiremate.partition import HPartition, Hierarchy, forward_dag
from hiremate.partition.constants import prologue
from hiremate.partition.dag import order_random
from hiremate.partition.hierarchy import hierarchy_from_levels
from hiremate.testing.fuzzgraphs import random_fuzz_graph
from hiremate.testing.synthetic import DagOp, graph_from_dag, random_graph
from test_memory_pins import fuzz_graph  # module level: its @given must not nest


def fwd_edges(graph: Graph) -> nx.DiGraph:
    """Forward compute nodes with an edge per memory or soft dependency between them."""
    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in graph.fwd_nodes)
    for n in graph.fwd_nodes:
        for d in n.inputs + n.soft_inputs:
            p = graph.data[d].producer
            if p is not None and graph.nodes[p].is_fwd:
                g.add_edge(p, n.id)
    return g


def check_deep(h: Hierarchy, graph: Graph, max_sub: int, max_top: int) -> None:
    """Every property the solvers rely on, at every level (raises AssertionError)."""
    g = fwd_edges(graph)
    desc = {u: nx.descendants(g, u) for u in g}
    anc = {u: nx.ancestors(g, u) for u in g}
    fwd = sorted(g)
    # every forward node is the direct child of exactly one subgraph (one leaf)
    direct = sorted(c.id for s in h.subgraphs for c in s.children if c.is_node)
    assert direct == fwd, "a forward node is in no leaf or in several"
    seen_child: set[int] = set()
    for s in h.subgraphs:
        members = set(s.fwd_nodes)
        between = set().union(*(desc[m] for m in members)) & set().union(
            *(anc[m] for m in members))
        assert between <= members, f"subgraph {s.id} is not convex"
        if s.id == h.root:
            assert s.parent is None and s.size <= max_top, f"top has {s.size} > {max_top}"
            assert s.level == h.depth
        else:
            assert 2 <= s.size <= max_sub, f"subgraph {s.id} has {s.size} children > {max_sub}"
            parent = h.subgraphs[s.parent]
            assert sum(c == ("subgraph", s.id) for c in
                       ((c.kind, c.id) for c in parent.children)) == 1
            assert s.level < parent.level and s.id < parent.id
        leaves: list[int] = []
        for c in s.children:
            if c.is_node:
                leaves.append(c.id)
            else:
                assert c.id not in seen_child, f"subgraph {c.id} has two parents"
                seen_child.add(c.id)
                assert h.subgraphs[c.id].parent == s.id
                leaves.extend(h.subgraphs[c.id].fwd_nodes)
        assert sorted(leaves) == list(s.fwd_nodes), f"subgraph {s.id}: leaves != its children's"
    assert seen_child == {s.id for s in h.subgraphs} - {h.root}
    for level, parts in enumerate(h.levels):
        assert sorted(x for p in parts for x in h.leaves(p)) == fwd, f"level {level}"
    for cls in h.classes:
        rep = h.subgraphs[cls.representative]
        for sid in cls.members:
            s = h.subgraphs[sid]
            assert len(s.children) == len(rep.children) and len(s.fwd_nodes) == len(rep.fwd_nodes)
            for a, b in zip(rep.children, s.children):
                assert a.kind == b.kind
                if a.is_node:
                    na, nb = graph.nodes[a.id], graph.nodes[b.id]
                    assert (na.signature, na.kind) == (nb.signature, nb.kind)
                    assert [graph.data[d].size for d in na.outputs] == \
                        [graph.data[d].size for d in nb.outputs]
                else:
                    assert h.class_of[a.id] == h.class_of[b.id]


def pick_graph(kind: int, seed: int, n: int) -> Graph:
    if kind == 0:
        return random_graph(seed, n, 2, max_fanin=3, p_soft=0.5)
    return random_fuzz_graph(seed, n)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 1), st.integers(0, 10_000), st.integers(30, 200), st.integers(2, 4),
       st.integers(2, 5), st.booleans())
def test_deep_hierarchies_keep_every_bound(kind, seed, n, max_sub, max_top, hoist):
    graph = pick_graph(kind, seed, n)
    h = HPartition(max_top=max_top, max_sub=max_sub, prologue=hoist).partition(graph)
    assert h.depth >= 3
    check_deep(h, graph, max_sub, max_top)


def test_the_checker_fails_on_broken_hierarchies():
    """The property test can fail: a block over the bound, a top over the bound, a block that
    is not convex, and a class over different code are each caught."""
    graph = random_graph(1, 40, 2, max_fanin=2, p_soft=0.0)
    dag, node_ids, _ = forward_dag(graph)
    good = HPartition(max_top=4, max_sub=3).partition(graph)
    check_deep(good, graph, 3, 4)
    with pytest.raises(AssertionError, match="children"):
        check_deep(good, graph, 2, 4)  # its blocks of 3 break a bound of 2
    with pytest.raises(AssertionError, match="top"):
        check_deep(good, graph, 3, len(good.top) - 1)
    # a chain 0 -> 1 -> 2: the block {0, 2} is not convex
    chain = graph_from_dag([DagOp([-1], 8, 1.0), DagOp([0], 8, 1.0), DagOp([1], 8, 1.0)], [8])
    cdag, cids, _ = forward_dag(chain)
    bad = hierarchy_from_levels(cdag, [[(0, 2), (1,)]], "bad", graph=chain, node_ids=cids)
    with pytest.raises(AssertionError, match="convex"):
        check_deep(bad, chain, 3, 3)


def test_broken_bound_in_the_partitioner_is_caught(monkeypatch):
    """A deliberately broken level (no greedy group, and the interval fallback cutting
    max_sub + 1 nodes) fails the property test's checker."""
    import hiremate.partition.hpartition as hp

    graph = random_graph(3, 60, 2, max_fanin=2, p_soft=0.0)
    check_deep(HPartition(max_top=4, max_sub=3).partition(graph), graph, 3, 4)
    monkeypatch.setattr(hp, "greedy_groups", lambda *args: [])
    check_deep(HPartition(max_top=4, max_sub=3).partition(graph), graph, 3, 4)  # fallback
    monkeypatch.setattr(hp, "interval_groups", lambda n, m: [
        frozenset(range(s, min(s + m + 1, n))) for s in range(0, n, m + 1)])
    with pytest.raises(AssertionError, match="children"):
        check_deep(HPartition(max_top=4, max_sub=3).partition(graph), graph, 3, 4)


def masked_layers(layers: int) -> Graph:
    """Residual layers reading a mask computed from a user input that needs no gradient, and
    position ids computed from nothing: constant nodes read by every layer."""
    ops = [DagOp([-1], 400, 1.0, code="embed"),
           DagOp([-2], 10, 1.0, code="ones", has_param=False),
           DagOp([1], 10, 1.0, code="tril", has_param=False),
           DagOp([2], 10, 1.0, code="where", has_param=False)]
    x = 0
    for _ in range(layers):
        base = len(ops)
        ops.append(DagOp([x], 300, 1.0, code="ln"))
        ops.append(DagOp([base, 3], 300, 1.0, code="attn"))
        ops.append(DagOp([base + 1], 300, 1.0, code="proj"))
        ops.append(DagOp([base + 2, x], 400, 1.0, code="res"))
        ops.append(DagOp([base + 3], 300, 1.0, code="mlp"))
        ops.append(DagOp([base + 4, base + 3], 400, 1.0, code="res2"))
        x = base + 5
    return graph_from_dag(ops, [100, 100], input_requires_grad=[True, False])


def test_prologue_is_the_first_top_level_part():
    graph = masked_layers(12)
    dag, node_ids, _ = forward_dag(graph)
    hoisted = [node_ids[u] for u in prologue(dag)]
    assert hoisted == [1, 2, 3]
    h = HPartition(max_top=6, max_sub=4, prologue=True).partition(graph)
    check_deep(h, graph, 4, 6)
    assert sorted(h.leaves(h.top[0])) == hoisted
    plain = HPartition(max_top=6, max_sub=4).partition(graph)
    check_deep(plain, graph, 4, 6)
    assert all(sorted(plain.leaves(p)) != hoisted for p in plain.top)
    assert "prologue=True" in h.partitioner and "prologue" not in plain.partitioner


def test_prologue_larger_than_max_sub_is_partitioned_too():
    """A prologue of more than max_sub nodes becomes its own sub-hierarchy, still one part."""
    ops = [DagOp([-1], 400, 1.0, code="embed")]
    prev = -2
    for _ in range(9):  # a chain of 9 constant nodes
        ops.append(DagOp([prev], 4, 1.0, code="c", has_param=False))
        prev = len(ops) - 1
    x = 0
    for _ in range(10):
        ops.append(DagOp([x, prev], 300, 1.0, code="layer"))
        x = len(ops) - 1
    graph = graph_from_dag(ops, [100, 100], input_requires_grad=[True, False])
    h = HPartition(max_top=5, max_sub=3, prologue=True).partition(graph)
    check_deep(h, graph, 3, 5)
    assert sorted(h.leaves(h.top[0])) == list(range(1, 10))


def _json_in_subprocess(hash_seed: str) -> str:
    code = ("from hiremate.testing.fuzzgraphs import random_fuzz_graph\n"
            "from hiremate.partition import HPartition\n"
            "g = random_fuzz_graph(7, 120)\n"
            "print(HPartition(max_top=4, max_sub=3, prologue=True).partition(g).to_json())\n")
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout


def test_hierarchy_is_deterministic():
    """Equal across runs in one process, across hash seeds (string hashing changes set and
    dict orders of labels), and when the Graph's data are listed in another order."""
    graph = random_fuzz_graph(7, 120)
    part = HPartition(max_top=4, max_sub=3, prologue=True)
    first = part.partition(graph).to_json()
    assert all(part.partition(graph).to_json() == first for _ in range(3))
    assert _json_in_subprocess("1") == _json_in_subprocess("2") == first + "\n"
    dag, _, _ = forward_dag(graph)
    order = list(reversed(range(len(dag.value_size))))
    permuted = type(dag)(
        dag.preds, [dag.value_size[v] for v in order], [dag.value_producer[v] for v in order],
        [dag.value_users[v] for v in order], [dag.value_is_output[v] for v in order],
        dag.weight, dag.labels, dag.constant)
    a, b = part.partition_dag(dag), part.partition_dag(permuted)
    assert [s.children for s in a.subgraphs] == [s.children for s in b.subgraphs]
    assert a.class_of == b.class_of


@pytest.mark.slow
def test_gpt2_six_layers_give_a_class_of_six():
    """Issue acceptance: a captured GPT-2 with 6 layers has a class with one member per layer
    (the attention block), each a real block of the layer, with the default settings."""
    import hiremate
    from hiremate import zoo

    model, sample = zoo.get("gpt2", layers=6)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    h = HPartition().partition(graph)
    check_deep(h, graph, 15, 30)
    sixes = [c for c in h.classes if len(c.members) == 6
             and min(len(h.subgraphs[s].fwd_nodes) for s in c.members) >= 8]
    assert sixes, [len(c.members) for c in h.classes]
    starts = sorted(h.subgraphs[s].fwd_nodes[0] for s in sixes[0].members)
    gaps = {b - a for a, b in zip(starts, starts[1:])}
    assert len(gaps) == 1  # one per layer, at the same offset in each


# -- random nodes ------------------------------------------------------------------------------
def random_in_order(h: Hierarchy, graph: Graph) -> None:
    """In every subgraph at every level (the top included), its children taken in the
    hierarchy's order draw random numbers in the graph's order: the random nodes below child
    ``i`` all come before those below child ``i + 1``. Together over all subgraphs: running the
    hierarchy's leaves depth first draws them as the model does (the simulator's rule)."""
    for s in h.subgraphs:
        drawn = [n for c in s.children for n in h.leaves(c) if graph.nodes[n].random]
        where = "the top" if s.id == h.root else f"subgraph {s.id} (level {s.level})"
        assert drawn == sorted(drawn), f"{where} draws random nodes in the order {drawn}"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 100_000), n=st.integers(8, 80), p_random=st.floats(0.05, 0.9),
       max_top=st.integers(2, 6), max_sub=st.integers(2, 6), hoist=st.booleans())
def test_parts_draw_random_nodes_in_the_graph_order(seed, n, p_random, max_top, max_sub, hoist):
    """Property: on fuzz graphs with random ops, H-Partition's parts keep random nodes in the
    graph's order in every subgraph at every level, and the hierarchy stays deep-valid."""
    graph = fuzz_graph(seed, n, p_random=p_random)
    h = HPartition(max_top=max_top, max_sub=max_sub, prologue=hoist).partition(graph)
    check_deep(h, graph, max_sub, max_top)
    random_in_order(h, graph)


def test_random_order_check_fires_without_the_ordering_edges(monkeypatch):
    """Without the ordering edges, this fuzz graph's top-level parts hold the random nodes
    [0, 5], [4, 6], ...: the check fires; with them it passes."""
    import hiremate.partition.hpartition as hp

    graph = fuzz_graph(107, 25)
    part = HPartition(max_top=5, max_sub=5)
    random_in_order(part.partition(graph), graph)
    monkeypatch.setattr(hp, "order_random", lambda dag: dag)
    with pytest.raises(AssertionError, match="random nodes in the order"):
        random_in_order(part.partition(graph), graph)


def test_order_random_adds_an_edge_only_where_no_path_is():
    """Random nodes already chained by data get no edge (the DAG is returned as is); a random
    node unreachable from the previous one gets one edge from it; the topological numbering
    holds and every random node then reaches the next."""
    chain = fuzz_graph(3, 20, chain=True, p_random=0.5)
    dag, _, _ = forward_dag(chain)
    assert sum(dag.random) >= 2 and order_random(dag) is dag
    graph = fuzz_graph(107, 25)
    dag, _, _ = forward_dag(graph)
    ordered = order_random(dag)
    ordered.validate()
    added = [(p, u) for u in range(dag.n) for p in ordered.preds[u] if p not in dag.preds[u]]
    assert added and all(dag.random[p] and dag.random[u] for p, u in added)
    g = nx.DiGraph([(p, u) for u, ps in enumerate(ordered.preds) for p in ps])
    plain = nx.DiGraph([(p, u) for u, ps in enumerate(dag.preds) for p in ps])
    plain.add_nodes_from(range(dag.n))
    rand = [u for u in range(dag.n) if dag.random[u]]
    assert all(nx.has_path(g, a, b) for a, b in zip(rand, rand[1:]))
    assert all(not nx.has_path(plain, p, u) for p, u in added)
    assert ordered.value_users == dag.value_users  # no value crosses an ordering edge
