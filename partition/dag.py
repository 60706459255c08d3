"""The forward DAG that partitioners work on: integer adjacency arrays, no Python objects per node.

Partitioning only looks at the forward part of a CD-graph (the backward node of each forward
node follows it through ``ComputeNode.partner``). Working on plain lists of integers keeps the
greedy algorithm fast enough for 10^5 nodes, and lets benchmarks build the structure directly
without a full :class:`hiremate.Graph`.

Edges are the union of memory dependencies and soft (shape-only) dependencies: soft edges
constrain the order, so they count for convexity ("HiRemate: Hierarchical Approach for
Efficient Re-materialization of Large Neural Networks", appendix C.1.2), but they carry no
bytes. Values that no forward node produces (parameters, buffers, user inputs) bring no edge
and no cost (same paper, appendix C.1.3): they stay alive throughout whatever the schedule
does. Nodes computed only
from values that need no gradient (masks, position ids) are marked ``constant``: a partitioner
may run them first and treat their values the same way (:mod:`.constants`).

Random nodes (dropout) are marked ``random``: the simulator requires them to be first computed
in the graph's order, since the executor replays the random generator's draws in that order.
:func:`order_random` adds ordering edges between consecutive random nodes, for partitioners
that group nodes other than by intervals of the topological order (see its docstring).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

from hiremate.errors import InvalidGraphError
from hiremate.ir.graph import Graph

from hiremate.ir.constants import constant_nodes


@dataclass(slots=True)
class ForwardDag:
    """A forward DAG in topological order: node ``i`` only depends on nodes ``< i``.

    ``preds[i]``: distinct predecessors of node ``i`` (memory and soft dependencies), sorted.
    ``values``: the activations that cross edges. ``value_users[v]`` are the nodes reading
    value ``v`` as a memory dependency; ``value_is_output[v]`` says the loss reads it.
    ``weight[i]``: how many original nodes node ``i`` stands for (1 at the bottom level).
    ``labels[i]``: a code label used to recognise identical subgraphs without a Graph.
    ``constant[i]``: node ``i`` computes only from values that need no gradient, so it may run
    before everything else (:mod:`.constants`); empty when unknown (every node then counts as
    non-constant).
    ``random``: node ``i`` draws random numbers (at the bottom level), or holds a node that
    does (above it); empty when unknown (no node is then random).
    """

    preds: list[tuple[int, ...]]
    value_size: list[int]
    value_producer: list[int]
    value_users: list[tuple[int, ...]]
    value_is_output: list[bool]
    weight: list[int]
    labels: list[str]
    constant: list[bool] = field(default_factory=list)
    random: list[bool] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.preds)

    def succs(self) -> list[list[int]]:
        """Successor lists, each sorted increasingly."""
        out: list[list[int]] = [[] for _ in self.preds]
        for i, ps in enumerate(self.preds):
            for p in ps:
                out[p].append(i)
        return out

    def node_values(self) -> tuple[list[list[int]], list[list[int]]]:
        """For each node, the values it reads and the values it produces."""
        reads: list[list[int]] = [[] for _ in self.preds]
        writes: list[list[int]] = [[] for _ in self.preds]
        for v, users in enumerate(self.value_users):
            writes[self.value_producer[v]].append(v)
            for u in users:
                reads[u].append(v)
        return reads, writes

    def validate(self) -> None:
        """Check the topological numbering (a bug guard for generators and contraction)."""
        for i, ps in enumerate(self.preds):
            if any(p >= i or p < 0 for p in ps):
                raise InvalidGraphError(f"node {i} has predecessors {ps}: not a topological "
                                        "order (a bug in the graph's builder)")
        for v, users in enumerate(self.value_users):
            p = self.value_producer[v]
            if any(u <= p for u in users):
                raise InvalidGraphError(f"value {v} produced by {p} is read by {users}, "
                                        "which come before it (a bug in the graph's builder)")

    @classmethod
    def build(
        cls,
        preds: list[list[int]] | list[tuple[int, ...]],
        values: list[tuple[int, int, list[int], bool]],
        labels: list[str] | None = None,
        soft_preds: list[list[int]] | None = None,
        constant: list[bool] | None = None,
        random: list[bool] | None = None,
    ) -> "ForwardDag":
        """Build from per-node predecessors and ``(producer, size, users, is_output)`` values.

        Every memory edge must also appear as a predecessor; soft predecessors are added.
        """
        n = len(preds)
        full = []
        for i in range(n):
            s = set(preds[i])
            if soft_preds is not None:
                s.update(soft_preds[i])
            full.append(tuple(sorted(s)))
        return cls(
            preds=full,
            value_size=[v[1] for v in values],
            value_producer=[v[0] for v in values],
            value_users=[tuple(sorted(set(v[2]))) for v in values],
            value_is_output=[bool(v[3]) for v in values],
            weight=[1] * n,
            labels=list(labels) if labels is not None else ["op"] * n,
            constant=list(constant) if constant is not None else [],
            random=list(random) if random is not None else [],
        )


def forward_dag(graph: Graph) -> tuple[ForwardDag, list[int], list[int]]:
    """The forward DAG of ``graph``, with ``node_ids[i]`` (compute id of DAG node ``i``) and
    ``value_ids[v]`` (data id of DAG value ``v``).

    Forward compute nodes are numbered first in a CD-graph (they precede the loss node), so
    DAG node ``i`` is compute node ``i``; the mapping is returned all the same.
    """
    node_ids = [nd.id for nd in graph.nodes if nd.is_fwd]
    index = {nid: i for i, nid in enumerate(node_ids)}
    outputs = set(graph.outputs)
    loss = graph.loss
    preds: list[set[int]] = [set() for _ in node_ids]
    value_ids: list[int] = []
    values: list[tuple[int, int, list[int], bool]] = []
    for d in graph.data:
        if d.producer is None or d.producer not in index:
            continue
        users = [index[u] for u in graph.users(d.id) if u in index]
        is_out = d.id in outputs or loss in graph.users(d.id)
        p = index[d.producer]
        for u in users:
            preds[u].add(p)
        value_ids.append(d.id)
        values.append((p, d.size, users, is_out))
        for u in graph.soft_users(d.id):
            if u in index:
                preds[index[u]].add(p)
    labels = [graph.nodes[nid].signature or graph.nodes[nid].name for nid in node_ids]
    const = constant_nodes(graph)
    dag = ForwardDag.build([sorted(s) for s in preds], values, labels,
                           constant=[nid in const for nid in node_ids],
                           random=[graph.nodes[nid].random for nid in node_ids])
    return dag, node_ids, value_ids


def order_random(dag: ForwardDag) -> ForwardDag:
    """``dag`` with an ordering edge ``r -> r'`` between consecutive random nodes wherever ``r``
    is not already an ancestor of ``r'``; ``dag`` itself when no edge is needed.

    Why: random nodes must first run in the graph's order (the simulator's rule), and the
    composers run the parts of every level one after the other, in the order of the contracted
    DAG. With a path from each random node to the next, a convex part holding two random nodes
    holds every random node between them (they lie on a path between the two), and along any
    topological order of the parts, at any level, the random nodes come in the graph's order (a
    path between two parts orders them). The edges constrain the order only, like soft edges:
    no value crosses them, so a score counting a part's interface bytes gives them nothing.

    An edge is added only where no path exists yet, so that random nodes already chained by
    data (dropouts along the residual stream of a transformer) leave the DAG, its dominators and
    its candidates as they are. Going through the nodes in topological order, ``last[u]`` is the
    latest random node (by rank) among ``u`` and its ancestors, edges added so far included;
    since every random node before it already reaches the previous one, the previous random node
    is an ancestor exactly when ``last`` over the predecessors reaches it. Linear in the edges.
    """
    if not dag.random or sum(dag.random) < 2:
        return dag
    preds = list(dag.preds)
    last = [-1] * dag.n
    prev = -1  # the previous random node
    added = 0
    for u, ps in enumerate(preds):
        best = max((last[p] for p in ps), default=-1)
        if dag.random[u]:
            if prev >= 0 and best < prev:
                preds[u] = tuple(sorted((*ps, prev)))
                added += 1
            prev = u
            best = u
        last[u] = best
    if not added:
        return dag
    return replace(dag, preds=preds)


def contract(dag: ForwardDag, blocks: list[list[int]]) -> tuple[ForwardDag, list[tuple[int, ...]]]:
    """Contract each block (a convex set of nodes; together a partition) into one node.

    Returns the contracted DAG and its blocks in its own topological order (each block sorted).
    The order is Kahn's algorithm with the smallest original index first, so that it stays close
    to the execution order and is deterministic. Values used only inside their block vanish.
    """
    block_of = [-1] * dag.n
    for b, members in enumerate(blocks):
        for u in members:
            block_of[u] = b
    if min(block_of, default=0) < 0:
        raise InvalidGraphError("blocks do not cover every node: a partitioner must put every "
                                "node in exactly one block")
    nb = len(blocks)
    bpreds: list[set[int]] = [set() for _ in range(nb)]
    for u, ps in enumerate(dag.preds):
        bu = block_of[u]
        for p in ps:
            bp = block_of[p]
            if bp != bu:
                bpreds[bu].add(bp)
    bsuccs: list[list[int]] = [[] for _ in range(nb)]
    indeg = [len(s) for s in bpreds]
    for b, s in enumerate(bpreds):
        for p in s:
            bsuccs[p].append(b)
    key = [min(m) for m in blocks]
    heap = [(key[b], b) for b in range(nb) if indeg[b] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, b = heapq.heappop(heap)
        order.append(b)
        for s in bsuccs[b]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (key[s], s))
    if len(order) != nb:
        raise InvalidGraphError("contracting these blocks creates a cycle: a block is not "
                                "convex; a partitioner must group nodes so that no path leaves a "
                                "block and comes back")
    rank = [0] * nb
    for r, b in enumerate(order):
        rank[b] = r
    new_preds = [tuple(sorted(rank[p] for p in bpreds[b])) for b in order]
    sizes: list[int] = []
    producers: list[int] = []
    users_out: list[tuple[int, ...]] = []
    is_out: list[bool] = []
    for v, users in enumerate(dag.value_users):
        bp = block_of[dag.value_producer[v]]
        outside = {rank[block_of[u]] for u in users if block_of[u] != bp}
        if not outside and not dag.value_is_output[v]:
            continue
        sizes.append(dag.value_size[v])
        producers.append(rank[bp])
        users_out.append(tuple(sorted(outside)))
        is_out.append(dag.value_is_output[v])
    weight = [sum(dag.weight[u] for u in blocks[b]) for b in order]
    labels = ["+".join(dag.labels[u] for u in sorted(blocks[b])) if len(blocks[b]) == 1
              else f"group{len(blocks[b])}" for b in order]
    constant = [all(dag.constant[u] for u in blocks[b]) for b in order] if dag.constant else []
    random = [any(dag.random[u] for u in blocks[b]) for b in order] if dag.random else []
    new = ForwardDag(new_preds, sizes, producers, users_out, is_out, weight, labels, constant,
                     random)
    return new, [tuple(sorted(blocks[b])) for b in order]


def induced(dag: ForwardDag, nodes: list[int]) -> ForwardDag:
    """The sub-DAG on ``nodes`` (sorted increasingly), renumbered ``0..len(nodes) - 1``.

    Values produced outside vanish, as user inputs do (they bring no edge). A value produced
    inside and read outside counts as an output (``value_is_output``), so that a score still
    sees it leave. Edges to outside nodes are dropped; callers make sure that nothing outside
    lies on a path between two of ``nodes`` (e.g. the nodes are closed under predecessors, or
    their complement is), so that convex sets of the sub-DAG stay convex in ``dag``.
    """
    index = {u: k for k, u in enumerate(nodes)}
    preds = [tuple(index[p] for p in dag.preds[u] if p in index) for u in nodes]
    sizes: list[int] = []
    producers: list[int] = []
    users_out: list[tuple[int, ...]] = []
    is_out: list[bool] = []
    for v, users in enumerate(dag.value_users):
        p = index.get(dag.value_producer[v])
        if p is None:
            continue
        inside = tuple(index[u] for u in users if u in index)
        sizes.append(dag.value_size[v])
        producers.append(p)
        users_out.append(inside)
        is_out.append(dag.value_is_output[v] or len(inside) < len(users))
    return ForwardDag(
        preds, sizes, producers, users_out, is_out,
        [dag.weight[u] for u in nodes], [dag.labels[u] for u in nodes],
        [dag.constant[u] for u in nodes] if dag.constant else [],
        [dag.random[u] for u in nodes] if dag.random else [],
    )
