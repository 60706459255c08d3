"""Blocks: the IR between a partition and the composers.

A block is one top-level part of the partition as a CD-graph of its own (:func:`extract`): its
forward nodes, a loss node standing for the rest of the model (it reads the block's outputs and
produces the gradients that flow in), and its backward nodes. Backward nodes without a forward
partner join the block whose data they read, or stay at the top level (the *tail*), run as soon
as their inputs exist (:func:`assign_backward`). Blocks with equal canonical graphs share a key
(:func:`hiremate.ir.graph.graph_key`), so their menus are solved once.

A :class:`TopProblem` (the full graph, its blocks with option menus, the tail) is what a top-level
composer sees; a :class:`Candidate` is what it returns: a full-graph schedule with its
simulation. :func:`flatten` turns the compute pieces a composer chose into a full-graph
schedule whose frees follow from the sequence (:func:`hiremate.ir.sequence.sequence_to_schedule`),
so its memory is whatever :func:`hiremate.ir.simulator.simulate` says.

Values read beyond a chain of blocks (a constant such as an attention mask that every layer's
block reads; a gradient that a tail node sums at the end) stay alive across the blocks in
between; :func:`long_lived` lists them for chain composers, whose model otherwise would not
count them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from hiremate.errors import SolverError
from hiremate.ir.graph import (
    FINAL_KINDS, ComputeNode, DataKind, DataNode, Graph, NodeKind,
    graph_key,
)
from hiremate.ir.option import Option
from hiremate.ir.schedule import Compute, Schedule
from hiremate.ir.simulator import SimulationResult

@dataclass
class Block:
    """One top-level part as a CD-graph of its own, with the renaming to full-graph ids."""

    index: int
    fwd: tuple[int, ...]
    bwd: tuple[int, ...]
    graph: Graph
    node_map: tuple[int, ...]   # local compute id -> full id (-1 for the local loss node)
    data_map: tuple[int, ...]   # local data id -> full id
    key: str = ""
    options: list[Option] = field(default_factory=list)

    def sequence(self, part: Schedule) -> list[int]:
        """Full-graph compute ids of the compute steps of ``part`` (local loss left out)."""
        out = []
        for step in part:
            if isinstance(step, Compute):
                full = self.node_map[step.node]
                if full >= 0:
                    out.append(full)
        return out


def assign_backward(graph: Graph, fwd_block: dict[int, int]) -> tuple[dict[int, int], list[int]]:
    """Block of every backward node. A forward node's partner goes with it. Another backward
    node (e.g. the sum of the partial gradients of a value read by two blocks) goes, when every
    node reading its outputs is in one block, to that block: the gradient flows there, so the
    blocks' backward parts keep the reverse order of their forward parts, whatever the shape of
    the partition; when one block both produces what it reads and reads its result, to that
    block (the node sits inside that block's backward). Otherwise it joins the block of the
    data it reads when those come from one block or two neighbours (the lower one, whose
    backward reads the gradient anyway); the rest stays at the top level (``tail``), run as
    soon as its inputs exist. Should the blocks'
    backward parts still depend on each other in a cycle, the nodes placed by the second rule
    move to the tail, then all of them (a tail node can always run).

    Values of constant forward nodes (:func:`hiremate.ir.constants.constant_nodes`: masks,
    position ids) count like inputs here: the top level keeps them alive for any block that
    reads them, so they decide the block only when the node reads nothing else."""
    from hiremate.ir.constants import constant_nodes

    partnered: dict[int, int] = {}
    for n in graph.fwd_nodes:
        if n.partner is not None:
            partnered[n.partner] = fwd_block[n.id]
    loss = graph.loss
    const = constant_nodes(graph)
    by_readers: dict[int, int] = {}
    by_inputs: dict[int, int] = {}
    bwd_block = dict(partnered)
    for n in sorted(graph.bwd_nodes, key=lambda n: -n.id):  # readers come later: placed first
        if n.id in partnered:
            continue
        readers = {u for d in n.outputs for u in graph.users(d)}
        homes = {bwd_block.get(u) for u in readers}
        if readers and len(homes) == 1 and None not in homes:
            bwd_block[n.id] = by_readers[n.id] = homes.pop()
            continue
        # a node inside one block's backward (it reads that block's gradients and that block
        # reads its result) while others read the result too: it stays inside that block
        sources = {bwd_block.get(p) for p in (graph.data[d].producer for d in n.inputs)
                   if p is not None and p > loss}
        shared = (homes & sources) - {None}
        if len(shared) == 1:
            bwd_block[n.id] = by_readers[n.id] = shared.pop()
    for n in graph.bwd_nodes:
        if n.id in bwd_block:
            continue
        blocks: set[int] = set()
        const_blocks: set[int] = set()
        orphan = False
        for d in n.inputs:
            p = graph.data[d].producer
            if p is None or p == loss:
                continue
            b = fwd_block.get(p) if p < loss else bwd_block.get(p)
            if b is None:
                orphan = True
            elif p in const:
                const_blocks.add(b)
            else:
                blocks.add(b)
        blocks = blocks or const_blocks
        if blocks and not orphan and max(blocks) - min(blocks) <= 1:
            bwd_block[n.id] = by_inputs[n.id] = min(blocks)
    for moved in (by_inputs, by_readers):
        if not _backward_cycle(graph, bwd_block):
            break
        for nid in moved:
            del bwd_block[nid]
    tail = [n.id for n in graph.bwd_nodes if n.id not in bwd_block]
    return bwd_block, tail


def _backward_cycle(graph: Graph, bwd_block: dict[int, int]) -> bool:
    """Whether the blocks' backward parts, contracted, depend on each other in a cycle
    (through each other's values or through tail nodes)."""
    import networkx as nx

    def home(nid: int) -> Any:
        return ("B", bwd_block[nid]) if nid in bwd_block else ("t", nid)

    deps = nx.DiGraph()
    for n in graph.bwd_nodes:
        for d in n.inputs:
            p = graph.data[d].producer
            if p is not None and p > graph.loss and home(p) != home(n.id):
                deps.add_edge(home(p), home(n.id))
    return not nx.is_directed_acyclic_graph(deps)


def against_the_chain(problem: "TopProblem") -> list[tuple[int, int]]:
    """``(producer, reader)`` pairs of backward nodes where a block's backward reads a value that
    an *earlier* block's backward makes. A chain of blocks runs the backward parts last block
    first, so no chain schedule can serve such a read (a node of the later block's backward
    placed in the earlier block: a gradient sum paired with the wrong forward node did, before
    the graph builder left such sums unpaired)."""
    graph = problem.graph
    home = {n: b.index for b in problem.blocks for n in b.bwd}
    return [(p, n) for b in problem.blocks for n in b.bwd for d in graph.nodes[n].inputs
            if (p := graph.data[d].producer) is not None
            and home.get(p, b.index) < b.index]


def extract(graph: Graph, fwd: Sequence[int], bwd: Sequence[int]
            ) -> tuple[Graph, list[int], list[int]]:
    """The CD-graph of a block: ``fwd`` nodes, a loss node, ``bwd`` nodes (see module doc).

    Data produced outside become sources (forward values) or outputs of the local loss
    (gradients flowing in); gradients leaving the block, or required at the end, become final.
    """
    fwd, bwd = sorted(fwd), sorted(bwd)
    fset, bset = set(fwd), set(bwd)
    inside = fset | bset
    gdata = graph.data
    order: dict[int, int] = {}
    for nid in fwd + bwd:
        nd = graph.nodes[nid]
        for d in nd.inputs + nd.soft_inputs + nd.outputs:
            order.setdefault(d, len(order))
    data_map = list(order)
    node_map = fwd + [-1] + bwd
    local_node = {nid: i for i, nid in enumerate(node_map) if nid >= 0}
    loss_id = len(fwd)
    protected = set(graph.outputs)
    kinds: list[DataKind] = []
    producers: list[int | None] = []
    outputs: list[int] = []
    grads_in: list[int] = []
    for local, d in enumerate(data_map):
        dn = gdata[d]
        p = dn.producer
        if p in inside:
            if p in fset:
                kind = dn.kind if dn.kind is DataKind.ACTIVATION else DataKind.ACTIVATION
                leaves = d in protected or any(u not in inside for u in graph.users(d)) \
                    or any(u not in inside for u in graph.soft_users(d))
                if leaves:
                    outputs.append(local)
            else:
                leaves = dn.kind in FINAL_KINDS or d in protected \
                    or any(u not in inside for u in graph.users(d))
                if dn.kind is DataKind.PARAM_GRAD:
                    kind = DataKind.PARAM_GRAD
                elif leaves:
                    kind = DataKind.INPUT_GRAD if dn.counted else DataKind.PARAM_GRAD
                else:
                    kind = DataKind.GRAD if dn.counted else dn.kind
            producers.append(local_node[p])
        elif p is None:
            kind = dn.kind
            producers.append(None)
        elif p < graph.loss:
            kind = DataKind.INPUT
            producers.append(None)
        else:
            kind = DataKind.TANGENT if dn.counted else DataKind.PARAM_GRAD
            if kind is DataKind.PARAM_GRAD:  # an uncounted gradient flowing in: keep as source
                kind = DataKind.INPUT
                producers.append(None)
            else:
                producers.append(loss_id)
                grads_in.append(local)
        kinds.append(kind)
    local_data = {d: i for i, d in enumerate(data_map)}
    data = [DataNode(i, gdata[d].name, kinds[i], gdata[d].shape, gdata[d].dtype, gdata[d].size,
                     producers[i]) for i, d in enumerate(data_map)]

    def loc(ds) -> tuple[int, ...]:
        return tuple(local_data[d] for d in ds)

    nodes: list[ComputeNode] = []
    for i, nid in enumerate(node_map):
        if nid < 0:
            nodes.append(ComputeNode(i, "block_loss", NodeKind.LOSS, tuple(outputs),
                                     tuple(grads_in)))
            continue
        nd = graph.nodes[nid]
        partner = local_node.get(nd.partner) if nd.partner is not None else None
        nodes.append(ComputeNode(
            i, nd.name, nd.kind, loc(nd.inputs), loc(nd.outputs), nd.time, nd.overhead,
            loc(nd.soft_inputs), partner, nd.signature, (), nd.mutates, nd.random, nd.flops))
    return Graph(nodes, data, outputs), node_map, data_map


def make_blocks(graph: Graph, hierarchy: Any) -> tuple[list[Block], list[int]]:
    """Blocks of the hierarchy's top level, in order, and the top-level (tail) backward nodes."""
    return blocks_of(graph, [tuple(sorted(hierarchy.leaves(p))) for p in hierarchy.top])


def blocks_of(graph: Graph, parts: Sequence[Sequence[int]]) -> tuple[list[Block], list[int]]:
    """One block per part (forward compute ids of ``graph``, the parts covering every forward
    node), in order, and the backward nodes left to the level of ``graph`` itself (the tail).
    ``graph`` may be the full graph or a block's own graph one level up (a subgraph whose
    children become blocks in turn)."""
    fwd_block: dict[int, int] = {}
    parts = [tuple(sorted(p)) for p in parts]
    for i, leaves in enumerate(parts):
        for f in leaves:
            fwd_block[f] = i
    missing = [n.id for n in graph.fwd_nodes if n.id not in fwd_block]
    if missing:
        raise SolverError(f"the partition leaves forward nodes {missing[:5]} out of every block; "
                          "this is a partitioner bug")
    bwd_block, tail = assign_backward(graph, fwd_block)
    bwd_of: list[list[int]] = [[] for _ in parts]
    for b, i in bwd_block.items():
        bwd_of[i].append(b)
    blocks = []
    for i, leaves in enumerate(parts):
        sub, node_map, data_map = extract(graph, leaves, bwd_of[i])
        blocks.append(Block(i, leaves, tuple(sorted(bwd_of[i])), sub, tuple(node_map),
                            tuple(data_map), graph_key(sub, times=True)))
    return blocks, tail


@dataclass
class TopProblem:
    """What a top-level composer sees: the full graph, its blocks (with menus) and the tail."""

    graph: Graph
    blocks: list[Block]
    tail: list[int]


def long_lived(problem: TopProblem) -> tuple[dict[int, int], dict[int, tuple[int, int, int]]]:
    """Values that a chain of blocks does not account for, with their counted sizes.

    A chain composer (rk-Rotor) assumes that block ``i``'s forward values are read by blocks
    ``i`` and ``i + 1`` only (by the loss when ``i`` is the last block), that only the last
    block returns model outputs, that the loss's gradients are read by the last block only and
    that block ``i``'s backward gradients are read by blocks ``i`` and ``i - 1`` only. A value
    read elsewhere lives on past its place in the chain: a hoisted constant read by every layer,
    a value read by a top-level tail node (e.g. the partial gradient of a weight shared by the
    first and the last block, summed at the end), the gradient of a model output returned by an
    earlier block. Translated schedules keep such a value until its last read before it is
    produced again (:func:`flatten`).

    Returns the forward values (data id -> size), which the chain then counts as alive
    throughout, and the backward-phase values (data id -> size, ``lo``, ``hi``): alive from the
    step that produces the chain's gradient ``δ^hi`` (the loss for ``hi = L``, block ``hi``'s
    backward otherwise, 0-based) to the step that consumes ``δ^lo`` (the end for ``lo = 0``),
    which the chain counts as part of ``δ^lo .. δ^hi``. Both bound the real memory from above
    (:meth:`RkRotorTop.block_chain`)."""
    graph = problem.graph
    L = len(problem.blocks)
    loss = graph.loss
    pos: dict[int, int] = {loss: L}
    for i, blk in enumerate(problem.blocks):
        pos.update({n: i for n in blk.fwd})
        pos.update({n: i for n in blk.bwd})
    outputs = set(graph.outputs)
    fwd_held: dict[int, int] = {}
    bwd_held: dict[int, tuple[int, int, int]] = {}
    for d in graph.data:
        if not d.counted or d.producer is None:
            continue
        p = pos.get(d.producer)
        if p is None:
            continue
        readers = {pos.get(u) for u in graph.users(d.id)}
        if graph.nodes[d.producer].is_fwd:
            if (d.id in outputs and p != L - 1) or not readers <= {p, p + 1}:
                fwd_held[d.id] = d.size
        elif not readers <= ({L - 1} if p == L else {p, p - 1}):
            last = -1 if None in readers else min(readers)  # None: a tail node, at the end
            bwd_held[d.id] = (d.size, min(last + 1, p), p)
    return fwd_held, bwd_held


def flatten(problem: TopProblem, pieces: Sequence[Sequence[int]]) -> Schedule:
    """Join compute-id pieces, run each tail node as soon as its inputs exist (after the loss),
    and derive the frees."""
    from hiremate.ir.sequence import sequence_to_schedule

    graph = problem.graph
    produced = [d.producer is None for d in graph.data]
    pending = list(problem.tail)
    seq: list[int] = []
    loss_done = False

    def emit(nid: int) -> None:
        seq.append(nid)
        for d in graph.nodes[nid].outputs:
            produced[d] = True

    def drain() -> None:
        changed = True
        while changed and pending:
            changed = False
            for t in list(pending):
                if all(produced[d] for d in graph.nodes[t].inputs):
                    pending.remove(t)
                    emit(t)
                    changed = True

    for piece in pieces:
        for nid in piece:
            emit(nid)
            if nid == graph.loss:
                loss_done = True
            if loss_done and pending:
                drain()
    for t in pending:
        emit(t)
    return sequence_to_schedule(graph, seq)


@dataclass
class Candidate:
    schedule: Schedule
    sim: SimulationResult
    source: str
    detail: dict = field(default_factory=dict)
