"""Tests of the sequence and flat partitioners, the registry's partitioners, and the
hierarchy's reports and drawing (the structural checks live in tests/test_partition.py)."""

from __future__ import annotations

import random

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiremate.errors import ConfigError
from hiremate.ir.graph import Graph
from hiremate.registry import make_partitioner
from hiremate.partition import (
    PARTITIONERS, FlatPartition, HPartition, Part, Partitioner, SequencePartition,
    draw_hierarchy, forward_dag,
)
from hiremate.testing.gptlike import gpt_like_dag, layers_for
from hiremate.partition.sequence import separators
from hiremate.testing.synthetic import DagOp, graph_from_dag, random_dag, random_graph


from test_partition import check_hierarchy, fwd_digraph, gpt_graph, graph_params, make_graph


# -- sequence and flat -------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(graph_params)
def test_sequence_partition_is_a_chain_of_blocks(params):
    graph = make_graph(params)
    h = SequencePartition().partition(graph)
    check_hierarchy(h, graph, None, None)
    g = fwd_digraph(graph)
    n = g.number_of_nodes()
    brute = [s for s in range(n) if not any(u < s < v for u, v in g.edges)]
    dag, _, _ = forward_dag(graph)
    assert separators(dag) == brute
    owner = h.owner(h.depth - 1)
    order = {p: k for k, p in enumerate(h.top)}
    for u, v in g.edges:
        assert order[owner[v]] - order[owner[u]] in (0, 1)  # edges only to the next block


def test_sequence_on_gpt_cuts_every_layer():
    counts = []
    for layers in (6, 10):
        h = SequencePartition().partition(gpt_graph(layers))
        # each layer: a residual separator after attention and one after the MLP
        blocks = [h.subgraphs[p.id].size for p in h.top if not p.is_node]
        assert h.depth == 2 and blocks.count(26) == layers and blocks.count(11) == layers
        counts.append(h.summary()["unique_subgraphs"])
    # identical layers share classes (only the last layer and the ends differ)
    assert counts[0] == counts[1] <= 6


def with_constants(seed: int, n: int, n_const: int, p_read: float, p_soft: float
                   ) -> tuple[Graph, list[DagOp]]:
    """A random graph whose first ``n_const`` ops compute from a user input that needs no
    gradient, without parameters (like an attention mask or position ids), read by later ops at
    random (like every layer's attention); also the same random ops without those reads."""
    rng = random.Random(seed)
    plain = random_dag(rng, n, 1, p_soft=p_soft)
    consts: list[DagOp] = []
    for i in range(n_const):
        pool = [-2] + list(range(i))
        ins = rng.sample(pool, rng.randint(1, min(2, len(pool))))
        consts.append(DagOp(sorted(ins, key=lambda j: (j < 0, j)), rng.randint(1, 60), 0.1,
                            has_param=False, code=f"const{i}"))
    ops = []
    for op in plain:
        ins = [j + n_const if j >= 0 else j for j in op.inputs]
        if n_const and rng.random() < p_read:
            ins.append(rng.randrange(n_const))
        ops.append(DagOp(list(dict.fromkeys(ins)), op.size, op.time, op.bwd_time, op.has_param,
                         op.saves_inputs, op.saves_output, op.overhead, op.code,
                         [j + n_const for j in op.soft_inputs]))
    graph = graph_from_dag(consts + ops, [64, 8], input_requires_grad=[True, False])
    return graph, plain


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(2, 40), st.integers(0, 4),
       st.sampled_from([0.3, 1.0]), st.sampled_from([0.0, 2.0]))
def test_sequence_hoists_constant_values(seed, n, n_const, p_read, p_soft):
    """Constant values leave the chain: the prologue holds only constant nodes, closed under
    predecessors, within the size bound; every other edge goes to the same or the next block;
    and when every constant is hoisted, the other blocks are those of the graph without them."""
    from hiremate.partition.constants import DEFAULT_FRACTION, prologue

    graph, plain = with_constants(seed, n, n_const, p_read, p_soft)
    dag, node_ids, _ = forward_dag(graph)
    # truth: the first n_const forward nodes are the constant ones (the others all read the
    # input that needs a gradient, or a parameter, through their ancestry)
    assert [node_ids[i] for i, c in enumerate(dag.constant) if c] == list(range(n_const))
    h = SequencePartition().partition(graph)
    check_hierarchy(h, graph, None, None)
    g = fwd_digraph(graph)
    owner = h.owner(h.depth - 1)
    order = {p: k for k, p in enumerate(h.top)}
    hoisted = {node_ids[i] for i in prologue(dag)}
    if hoisted:  # first, even when every node is a block of its own
        assert set(h.leaves(h.top[0])) == hoisted
    for u in hoisted:
        assert nx.ancestors(g, u) <= hoisted
    held = sum(graph.data[d].size for u in hoisted for d in graph.nodes[u].outputs
               if d in graph.outputs or any(w not in hoisted for w in graph.users(d)))
    total = sum(dag.value_size)
    assert held <= DEFAULT_FRACTION * total
    for u, v in g.edges:
        if u not in hoisted:
            assert order[owner[v]] - order[owner[u]] in (0, 1)
    brute = [s for s in range(len(node_ids)) if not any(a < s < b for a, b in g.edges)]
    ends = {max(h.leaves(p)) for p in h.top}
    assert all(s in ends for s in brute if s not in hoisted)
    if n_const and len(hoisted) == n_const and len(h.top) > 1:
        ref = SequencePartition().partition(graph_from_dag(plain, [64]))
        expect = [[u + n_const for u in ref.leaves(p)] for p in ref.top]
        assert [sorted(h.leaves(p)) for p in h.top[1:]] == expect
    if n_const and held and held <= DEFAULT_FRACTION * total / 2:
        assert hoisted, "small constant values are hoisted"


def masked_layers(layers: int, mask_size: int) -> Graph:
    """Residual layers [a -> b -> c -> d, d + x]; every b reads a mask computed from an input
    that needs no gradient, without parameters (a constant value)."""
    ops = [DagOp([-2], mask_size, 0.1, has_param=False, code="mask"),
           DagOp([-1], 400, 1.0, code="embed")]
    x = 1
    for _ in range(layers):
        base = len(ops)
        ops.append(DagOp([x], 200, 1.0, code="a"))
        ops.append(DagOp([base, 0], 300, 1.0, code="b"))
        ops.append(DagOp([base + 1], 300, 1.0, code="c"))
        ops.append(DagOp([base + 2], 400, 1.0, code="d"))
        ops.append(DagOp([base + 3, x], 400, 1.0, code="res"))
        x = base + 4
    return graph_from_dag(ops, [100, 8], input_requires_grad=[True, False])


def test_sequence_hoisting_bound_and_switch():
    """The mask is hoisted while it holds at most 5% of the forward values' bytes (here 340 of
    6,800), leaving one block per layer; above the bound, or with ``const_fraction=0``, the
    layers stay in one block. A fraction outside [0, 1] is refused."""
    one_each = 2 + 4
    for mask, frac, blocks in ((300, None, one_each), (400, None, 2), (300, 0.0, 2),
                               (400, 0.1, one_each)):
        part = SequencePartition() if frac is None else SequencePartition(const_fraction=frac)
        graph = masked_layers(4, mask)
        h = part.partition(graph)
        check_hierarchy(h, graph, None, None)
        assert len(h.top) == blocks, (mask, frac)
        assert h.top[0] == Part("node", 0)  # the mask: hoisted, or first in the order anyway
    with pytest.raises(ConfigError):
        make_partitioner("sequence", {"const_fraction": 1.5})
    with pytest.raises(ConfigError):
        make_partitioner("sequence", {"max_blocks": -1})


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 30), st.integers(1, 12))
def test_merge_chain_bounds_the_chain_and_keeps_repeats(layers, max_blocks):
    """At most ``max_blocks`` blocks after the prologue, each a union of consecutive chain
    blocks (so the hierarchy stays convex and a chain); identical layers give at most a few
    distinct unions (plus the ends)."""
    graph = masked_layers(layers, 40)
    h = SequencePartition(max_blocks=max_blocks).partition(graph)
    check_hierarchy(h, graph, None, None)
    ref = SequencePartition(max_blocks=0).partition(graph)
    chain = [tuple(sorted(ref.leaves(p))) for p in ref.top[1:]]
    merged = [tuple(sorted(h.leaves(p))) for p in h.top[1:]]
    assert h.top[0] == ref.top[0] == Part("node", 0)  # the hoisted mask
    assert len(merged) <= max(max_blocks, 1) and len(merged) <= len(chain)
    if len(chain) <= max_blocks:
        assert merged == chain
    flat = [u for b in merged for u in b]
    assert flat == [u for b in chain for u in b]  # unions of consecutive blocks, in order
    starts = {b[0] for b in chain}
    assert all(b[0] in starts for b in merged)
    g = fwd_digraph(graph)
    owner = h.owner(h.depth - 1)
    order = {p: k for k, p in enumerate(h.top)}
    for u, v in g.edges:
        if u != 0:
            assert order[owner[v]] - order[owner[u]] in (0, 1)
    sizes = [len(b) for b in merged[1:-1]]
    assert len(set(sizes)) <= 2  # repeating unions of repeating layers


def test_zoo_gpt2_sequence_cuts_every_layer():
    """A captured GPT-2's causal mask and position ids are read by every layer; hoisted, the
    chain is cut at every residual add: a prologue of constant nodes, the embeddings, then per
    layer an attention block and an MLP block (each residual add is a 1-separator), then the
    final layer norm and head."""
    import hiremate
    from hiremate import zoo
    from hiremate.ir.blocks import make_blocks

    model, sample = zoo.get("gpt2", layers=4, width=64)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    h = SequencePartition().partition(graph)
    check_hierarchy(h, graph, None, None)
    blocks, tail = make_blocks(graph, h)
    names = [[graph.nodes[n].name for n in b.fwd] for b in blocks]
    softmax = [k for k, ns in enumerate(names) if any("softmax" in x for x in ns)]
    assert len(softmax) == 4 and all(sum("softmax" in x for x in names[k]) == 1 for k in softmax)
    assert all(any(x.startswith("fwd:where") for x in ns) is (k == 0) for k, ns in enumerate(names))
    assert len(blocks) == 3 + 2 * 4 + 2
    largest = max(len(b.graph.nodes) for b in blocks)
    assert largest <= len(graph.nodes) / 8
    # the first attention block differs only in how its last backward node sums the residual
    # gradient (a capture detail); the other layers' blocks repeat
    layer_keys = [b.key for b in blocks[3:3 + 8]]
    assert len(set(layer_keys[2::2])) == 1 and len(set(layer_keys[1::2])) == 1
    off = SequencePartition(const_fraction=0).partition(graph)
    assert len(off.top) < 6  # without hoisting, the mask keeps the layers in one block


def test_flat_partition():
    graph = random_graph(2, 30, 2)
    h = FlatPartition().partition(graph)
    check_hierarchy(h, graph, None, None)
    assert h.depth == 1 and [p.id for p in h.top] == [n.id for n in graph.nodes if n.is_fwd]


def test_registry_and_protocol():
    assert set(PARTITIONERS) == {"hpartition", "sequence", "flat", "peel"}
    graph = random_graph(4, 20, 2)
    for name in PARTITIONERS:
        p = make_partitioner(name)
        assert isinstance(p, Partitioner)
        check_hierarchy(p.partition(graph), graph, None, None)


# -- reports and drawing -----------------------------------------------------------------------
def test_summary_networkx_dot_and_smoke_drawing(tmp_path):
    graph = gpt_graph(4)
    h = HPartition(max_top=8, max_sub=6).partition(graph)
    s = h.summary()
    assert s["levels"] == h.depth >= 2
    assert sum(s["subgraphs_per_level"]) == s["subgraphs"] == len(h.subgraphs) - 1
    assert s["largest_subgraph"] <= 6 and s["top_size"] <= 8
    tree = h.to_networkx()
    assert tree.number_of_edges() == sum(sub.size for sub in h.subgraphs)
    assert nx.is_tree(tree)
    dot = h.to_dot()
    assert dot.count("subgraph cluster_") == len(h.subgraphs) - 1  # all but the root
    path = draw_hierarchy(h, tmp_path / "h.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_speed_10k_nodes():
    import time

    dag = gpt_like_dag(layers_for(10_000))
    start = time.perf_counter()
    h = HPartition().partition_dag(dag)
    assert time.perf_counter() - start < 10
    assert h.summary()["top_size"] <= 30
