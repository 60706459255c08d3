"""The result of a partitioner: a hierarchy of convex subgraphs of the forward graph.

Level 0 holds the forward compute nodes. Each higher level partitions the nodes of the level
below into blocks; a block of two nodes or more becomes a :class:`Subgraph` (a node of the
higher level), a block of one node passes that node through unchanged. The top level's nodes are
the children of the root subgraph, which the top-level solver schedules (together with the loss
node and the backward nodes that no forward node owns, e.g. input-gradient sums).

A subgraph owns its forward nodes and, through ``ComputeNode.partner``, their backward nodes;
its interface says which data cross its boundary, so a solver can treat it as a CD-graph of its
own. Identical subgraphs (same code on same shapes) share a class; see ``canonical.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from hiremate.ir.graph import FINAL_KINDS, DataKind, Graph

if TYPE_CHECKING:
    import networkx as nx

    from .canonical import SubgraphClass, Translation
    from .dag import ForwardDag


@dataclass(frozen=True, slots=True, order=True)
class Part:
    """A node of some level: an original forward compute node, or a subgraph."""

    kind: str  # "node" or "subgraph"
    id: int    # compute-node id in the Graph, or subgraph id in the Hierarchy

    @property
    def is_node(self) -> bool:
        return self.kind == "node"

    def __str__(self) -> str:
        return f"n{self.id}" if self.is_node else f"s{self.id}"


@dataclass(frozen=True, slots=True)
class Subgraph:
    """A convex group of forward nodes (and their backward partners) that becomes one node above.

    ``children``: the parts of the level below, in execution (topological) order.
    ``fwd_nodes`` / ``bwd_nodes``: compute ids of all original nodes inside, sorted.
    ``inputs``: data read by the forward nodes and produced elsewhere (parameters included);
    ``outputs``: forward data read outside the subgraph or returned by the model;
    ``grad_inputs``: gradients produced outside and read by the backward nodes;
    ``grad_outputs``: gradients produced inside and read outside, or required at the end.
    Without a Graph (``Hierarchy.graph is None``) data ids are the DAG's value indices and the
    backward fields are empty.
    """

    id: int
    level: int
    children: tuple[Part, ...]
    parent: int | None
    fwd_nodes: tuple[int, ...]
    bwd_nodes: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    grad_inputs: tuple[int, ...]
    grad_outputs: tuple[int, ...]

    @property
    def size(self) -> int:
        """Number of nodes of this subgraph's own graph (its children)."""
        return len(self.children)

    @property
    def child_subgraphs(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.children if not c.is_node)


class Hierarchy:
    """Levels, subgraphs with parent/child links, interfaces and identical-subgraph classes.

    ``levels[0]`` are the forward nodes; ``levels[k]`` the nodes of the level-``k`` graph in
    topological order; ``levels[-1]`` the top graph, whose nodes are ``root``'s children.
    ``subgraphs`` are numbered bottom-up: every child subgraph has a smaller id than its parent.
    """

    def __init__(self, graph: Graph | None, dag: "ForwardDag", levels: list[tuple[Part, ...]],
                 subgraphs: list[Subgraph], root: int, partitioner: str):
        from .canonical import classify

        self.graph = graph
        self.dag = dag
        self.levels = tuple(levels)
        self.subgraphs = tuple(subgraphs)
        self.root = root
        self.partitioner = partitioner
        self.class_of, self.classes = classify(self)

    # -- navigation -----------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Number of levels counting the top graph as one (Checkmate: 1, Rockmate: 2)."""
        return len(self.levels)

    @property
    def top(self) -> tuple[Part, ...]:
        return self.subgraphs[self.root].children

    def subgraph(self, sid: int) -> Subgraph:
        return self.subgraphs[sid]

    def leaves(self, part: Part) -> tuple[int, ...]:
        """Forward compute ids below ``part``."""
        return (part.id,) if part.is_node else self.subgraphs[part.id].fwd_nodes

    def bottom_up(self) -> Iterator[Subgraph]:
        """Subgraphs children first: the order in which solvers build option menus."""
        return iter(self.subgraphs)

    def representatives(self) -> list[int]:
        """One subgraph id per class (the one to solve), bottom-up."""
        return [c.representative for c in self.classes]

    def translation(self, sid: int) -> "Translation":
        """How to rename the ids of ``sid``'s class representative into those of ``sid``
        (computed on demand, in time linear in the subgraph's size)."""
        from .canonical import translation

        return translation(self, self.classes[self.class_of[sid]].representative, sid)

    def owner(self, level: int) -> dict[int, Part]:
        """For each forward compute id, the part of level ``level`` that contains it."""
        out: dict[int, Part] = {}
        for part in self.levels[level]:
            for leaf in self.leaves(part):
                out[leaf] = part
        return out

    # -- reports ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Facts for reports (the columns of Table 3(b) of the HiRemate paper, and a few more)."""
        inner = [s for s in self.subgraphs if s.id != self.root]
        per_level = [0] * (self.depth + 1)
        for s in inner:
            per_level[s.level] += 1
        unique = {self.class_of[s.id] for s in inner}
        return {
            "partitioner": self.partitioner,
            "forward_nodes": len(self.levels[0]),
            "levels": self.depth,
            "subgraphs": len(inner),
            "subgraphs_per_level": per_level[1:self.depth],
            "unique_subgraphs": len(unique),
            "largest_subgraph": max((s.size for s in inner), default=0),
            "top_size": len(self.top),
        }

    def to_networkx(self) -> "nx.DiGraph":
        """The hierarchy tree: edges from each subgraph to its children ("s3" -> "n7")."""
        import networkx as nx

        tree = nx.DiGraph()
        for s in self.subgraphs:
            tree.add_node(f"s{s.id}", kind="subgraph", level=s.level, size=s.size,
                          cls=self.class_of[s.id], root=s.id == self.root)
            for c in s.children:
                if c.is_node:
                    tree.add_node(str(c), kind="node", level=0)
                tree.add_edge(f"s{s.id}", str(c))
        return tree

    def level_graph(self, level: int) -> "nx.DiGraph":
        """The contracted forward graph of ``level`` (soft dependencies included as edges)."""
        import networkx as nx

        owner = self.owner(level)
        g = nx.DiGraph()
        g.add_nodes_from(str(p) for p in self.levels[level])
        fwd = self._fwd_index()
        for i, ps in enumerate(self.dag.preds):
            for p in ps:
                a, b = owner[fwd[p]], owner[fwd[i]]
                if a != b:
                    g.add_edge(str(a), str(b))
        return g

    def to_dot(self) -> str:
        """Graphviz text: forward nodes and edges, nested clusters for subgraphs."""
        fwd = self._fwd_index()
        lines = ["digraph hierarchy {", "  rankdir=TB; node [shape=box, fontsize=10];"]

        def emit(part: Part, indent: str) -> None:
            if part.is_node:
                lines.append(f'{indent}n{part.id} [label="{self._label(part.id)}"];')
                return
            s = self.subgraphs[part.id]
            lines.append(f"{indent}subgraph cluster_s{s.id} {{")
            lines.append(f'{indent}  label="s{s.id} (class {self.class_of[s.id]})";')
            for c in s.children:
                emit(c, indent + "  ")
            lines.append(f"{indent}}}")

        for c in self.top:
            emit(c, "  ")
        for i, ps in enumerate(self.dag.preds):
            for p in ps:
                lines.append(f"  n{fwd[p]} -> n{fwd[i]};")
        lines.append("}")
        return "\n".join(lines)

    def to_json(self) -> str:
        """Deterministic JSON of the structure (used to compare runs and to cache)."""
        return json.dumps({
            "partitioner": self.partitioner,
            "levels": [[str(p) for p in lv] for lv in self.levels],
            "subgraphs": [[s.id, s.level, [str(c) for c in s.children]] for s in self.subgraphs],
            "root": self.root,
            "classes": self.class_of,
        }, sort_keys=True)

    def _fwd_index(self) -> list[int]:
        return [p.id for p in self.levels[0]]

    def _label(self, nid: int) -> str:
        if self.graph is not None:
            return self.graph.nodes[nid].name.replace('"', "'")
        return f"n{nid}"

    def __repr__(self) -> str:
        s = self.summary()
        return (f"Hierarchy({s['forward_nodes']} forward nodes, {s['levels']} levels, "
                f"{s['subgraphs']} subgraphs, {s['unique_subgraphs']} unique, "
                f"largest {s['largest_subgraph']}, top {s['top_size']})")


def hierarchy_from_levels(
    dag: "ForwardDag",
    levels: list[list[tuple[int, ...]]],
    partitioner: str,
    graph: Graph | None = None,
    node_ids: list[int] | None = None,
) -> Hierarchy:
    """Assemble a :class:`Hierarchy` from blocks per level (see ``hpartition_levels``)."""
    ids = node_ids if node_ids is not None else list(range(dag.n))
    current = [Part("node", i) for i in ids]
    parts_by_level = [tuple(current)]
    raw: list[tuple[int, tuple[Part, ...]]] = []  # (level, children) by subgraph id
    for k, blocks in enumerate(levels, start=1):
        nxt = []
        for block in blocks:
            if len(block) == 1:
                nxt.append(current[block[0]])
            else:
                raw.append((k, tuple(current[j] for j in block)))
                nxt.append(Part("subgraph", len(raw) - 1))
        current = nxt
        parts_by_level.append(tuple(current))
    raw.append((len(levels) + 1, tuple(current)))
    root = len(raw) - 1
    parent: list[int | None] = [None] * len(raw)
    leaves: list[tuple[int, ...]] = []
    for sid, (_, children) in enumerate(raw):
        found: list[int] = []
        for c in children:
            if c.is_node:
                found.append(c.id)
            else:
                parent[c.id] = sid
                found.extend(leaves[c.id])
        leaves.append(tuple(sorted(found)))
    interface = _Interface(graph, dag)
    subgraphs: list[Subgraph] = []
    for sid, (level, children) in enumerate(raw):
        fields = interface(leaves[sid], [c.id if c.is_node else None for c in children],
                           [None if c.is_node else subgraphs[c.id] for c in children])
        subgraphs.append(Subgraph(sid, level, children, parent[sid], leaves[sid], *fields))
    return Hierarchy(graph, dag, parts_by_level, subgraphs, root, partitioner)


class _Interface:
    """Backward nodes and boundary data of a subgraph, from those of its children (bottom-up,
    so the total cost is linear in the size of each level): whatever crosses the boundary of a
    subgraph crosses the boundary of one of its children, or is touched by one of its nodes."""

    def __init__(self, graph: Graph | None, dag: "ForwardDag"):
        self.graph = graph
        self.dag = dag
        if graph is not None:
            self.graph_outputs = set(graph.outputs)
        else:
            self.reads, self.writes = dag.node_values()

    def __call__(self, fwd: tuple[int, ...], nodes: list[int | None],
                 subs: list[Subgraph | None]) -> tuple[tuple[int, ...], ...]:
        ins: set[int] = set()
        outs: set[int] = set()
        gins: set[int] = set()
        gouts: set[int] = set()
        for sub in subs:
            if sub is not None:
                ins.update(sub.inputs)
                outs.update(sub.outputs)
                gins.update(sub.grad_inputs)
                gouts.update(sub.grad_outputs)
        if self.graph is None:
            return self._dag_only(fwd, nodes, ins, outs)
        g = self.graph
        gnodes, data = g.nodes, g.data
        bwd = []
        for f in fwd:
            partner = gnodes[f].partner
            if partner is not None:
                bwd.append(partner)
        bwd.sort()
        for f in nodes:
            if f is None:
                continue
            ins.update(gnodes[f].inputs)
            outs.update(gnodes[f].outputs)
            b = gnodes[f].partner
            if b is not None:
                gins.update(gnodes[b].inputs)
                gouts.update(gnodes[b].outputs)
        fset = set(fwd)
        members = fset.union(bwd)
        inputs = [d for d in ins if data[d].producer not in fset]
        outputs = [d for d in outs
                   if d in self.graph_outputs or any(u not in members for u in g.users(d))]
        grad_in = [d for d in gins if data[d].producer not in members
                   and data[d].kind in (DataKind.GRAD, DataKind.TANGENT)]
        grad_out = [d for d in gouts
                    if data[d].kind in FINAL_KINDS or any(u not in members for u in g.users(d))]
        return (tuple(bwd), tuple(sorted(inputs)), tuple(sorted(outputs)),
                tuple(sorted(grad_in)), tuple(sorted(grad_out)))

    def _dag_only(self, fwd: tuple[int, ...], nodes: list[int | None], ins: set[int],
                  outs: set[int]) -> tuple[tuple[int, ...], ...]:
        dag = self.dag
        for f in nodes:
            if f is not None:
                ins.update(self.reads[f])
                outs.update(self.writes[f])
        fset = set(fwd)
        inputs = [v for v in ins if dag.value_producer[v] not in fset]
        outputs = [v for v in outs
                   if dag.value_is_output[v] or any(u not in fset for u in dag.value_users[v])]
        return ((), tuple(sorted(inputs)), tuple(sorted(outputs)), (), ())
