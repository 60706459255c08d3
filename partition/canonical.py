"""Identical subgraphs: a canonical form per subgraph and a hash table.

The recognition of identical graphs of "HiRemate: Hierarchical Approach for Efficient
Re-materialization of Large Neural Networks", appendix C.1.1.

Two compute nodes are equivalent when they run the same code (``ComputeNode.signature``) on
data of the same characteristics (kind, shape, dtype, size) with the same measured costs. A
subgraph's canonical form walks its compute nodes in execution order (forward, then backward)
and writes, for each, its equivalence class, the index of the child that holds it, and its
inputs, soft inputs and outputs as local data indices (numbered by first appearance); then the
interface (which local data leave or enter it) and the classes of its child subgraphs. Equal
forms mean the same optimisation problem, so a schedule solved for the class representative
translates to every member by renaming positions: the node at position k of one walk is the
node at position k of the other, and likewise for data and child subgraphs.

Building the forms is linear in the total size of the subgraphs (each forward node appears once
per level), and the hash table makes recognition linear too, instead of pairwise comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hiremate.ir.schedule import Compute, Delete, Schedule

if TYPE_CHECKING:
    from .hierarchy import Hierarchy, Subgraph


@dataclass(frozen=True, slots=True)
class Translation:
    """Renames ids of a class representative (keys) into ids of one member (values)."""

    nodes: dict[int, int]
    data: dict[int, int]
    subgraphs: dict[int, int] = field(default_factory=dict)

    def schedule(self, schedule: Schedule) -> Schedule:
        """Translate a schedule over the representative's compute nodes and data.

        ``Compute`` steps without an option name compute nodes; with an option they name a
        (descendant) subgraph of the representative and are renamed through ``subgraphs``.
        """
        out: list[Compute | Delete] = []
        for step in schedule:
            if isinstance(step, Delete):
                out.append(Delete(self.data[step.data]))
            elif step.option is None:
                out.append(Compute(self.nodes[step.node]))
            else:
                out.append(Compute(self.subgraphs[step.node], step.option))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class SubgraphClass:
    """Subgraphs with equal canonical forms. ``representative`` is the first one bottom-up."""

    id: int
    representative: int
    members: tuple[int, ...]


def classify(h: "Hierarchy") -> tuple[list[int], list[SubgraphClass]]:
    """Class of every subgraph of ``h`` (by id) and the classes, found with a hash table."""
    former = _GraphForm(h) if h.graph is not None else _DagForm(h)
    table: dict[Any, int] = {}
    class_of: list[int] = []
    members: list[list[int]] = []
    for s in h.subgraphs:
        cid = table.setdefault(former.form(s, class_of), len(table))
        if cid == len(members):
            members.append([])
        members[cid].append(s.id)
        class_of.append(cid)
    return class_of, [SubgraphClass(cid, sids[0], tuple(sids)) for cid, sids in enumerate(members)]


def translation(h: "Hierarchy", rep: int, sid: int) -> Translation:
    """Translation from subgraph ``rep`` to ``sid`` (of the same class): walk both the same way
    (children in order, recursively; each node with its backward partner and its data) and
    pair positions."""
    rep_nodes, rep_data = _walk(h, rep)
    nodes, data = _walk(h, sid)
    pairs: dict[int, int] = {}
    _pair_children(h, rep, sid, pairs)
    return Translation(dict(zip(rep_nodes, nodes)), dict(zip(rep_data, data)), pairs)


def _walk(h: "Hierarchy", sid: int) -> tuple[list[int], list[int]]:
    nodes: list[int] = []
    data: list[int] = []
    stack = [iter(h.subgraphs[sid].children)]
    g = h.graph
    reads, writes = (None, None) if g is not None else h.dag.node_values()
    while stack:
        c = next(stack[-1], None)
        if c is None:
            stack.pop()
        elif not c.is_node:
            stack.append(iter(h.subgraphs[c.id].children))
        elif g is not None:
            nd = g.nodes[c.id]
            nodes.append(c.id)
            data.extend(nd.inputs + nd.soft_inputs + nd.outputs)
            if nd.partner is not None:
                b = g.nodes[nd.partner]
                nodes.append(b.id)
                data.extend(b.inputs + b.outputs)
        else:
            nodes.append(c.id)
            data.extend(reads[c.id] + writes[c.id])
    return nodes, data


def _pair_children(h: "Hierarchy", rep: int, sid: int, out: dict[int, int]) -> None:
    """Match descendant subgraphs position by position (equal forms: equal child structure)."""
    for a, b in zip(h.subgraphs[rep].children, h.subgraphs[sid].children):
        if not a.is_node:
            out[a.id] = b.id
            _pair_children(h, a.id, b.id, out)


class _GraphForm:
    """Canonical forms over the full CD-graph, built from the children's forms.

    A child node is written with its class, its backward partner's class, and their data as
    local indices; a child subgraph with its class and its interface data (in its own canonical
    order) as local indices. Each subgraph remembers its interface in canonical order for its
    parent, so the cost is linear in the size of each level.
    """

    def __init__(self, h: "Hierarchy"):
        assert h.graph is not None
        self.nodes = h.graph.nodes
        self.data = h.graph.data
        self.node_class: dict[int, int] = {}
        self.node_keys: dict[Any, int] = {}
        self.iface_order: list[list[int]] = []

    def _char(self, d: int) -> tuple:
        dn = self.data[d]
        return (dn.kind.value, dn.shape, dn.dtype, dn.size)

    def _class(self, nid: int) -> int:
        cls = self.node_class.get(nid)
        if cls is None:
            nd = self.nodes[nid]
            key = (nd.kind.value, nd.signature, nd.time, nd.overhead, nd.random,
                   tuple(self._char(d) for d in nd.inputs),
                   tuple(self._char(d) for d in nd.soft_inputs),
                   tuple(self._char(d) for d in nd.outputs))
            cls = self.node_keys.setdefault(key, len(self.node_keys))
            self.node_class[nid] = cls
        return cls

    def form(self, s: "Subgraph", class_of: list[int]) -> Any:
        local: dict[int, int] = {}

        def loc(ds) -> tuple[int, ...]:
            return tuple(local.setdefault(d, len(local)) for d in ds)

        items: list[tuple] = []
        for c in s.children:
            if c.is_node:
                nd = self.nodes[c.id]
                item: tuple = (self._class(c.id), loc(nd.inputs), loc(nd.soft_inputs),
                               loc(nd.outputs))
                if nd.partner is not None:
                    b = self.nodes[nd.partner]
                    item += (self._class(b.id), loc(b.inputs), loc(b.outputs))
            else:
                item = ("s", class_of[c.id], loc(self.iface_order[c.id]))
            items.append(item)
        sides = (s.inputs, s.outputs, s.grad_inputs, s.grad_outputs)
        iface = tuple(tuple(local[d] for d in ds) for ds in sides)
        crossing = set().union(*sides)
        self.iface_order.append([d for d in local if d in crossing])
        return tuple(items), iface


class _DagForm:
    """Canonical forms over a bare forward DAG: labels and value sizes, built from children.

    Limitation: a :class:`ForwardDag` has no data for soft edges, so only each node's number of
    predecessors reflects them; two DAG-only subgraphs that differ only in where their soft
    edges come from may share a class. With a Graph (the pipeline's path) soft inputs are data
    nodes and are compared exactly.
    """

    def __init__(self, h: "Hierarchy"):
        self.dag = h.dag
        self.reads, self.writes = h.dag.node_values()
        self.iface_order: list[list[int]] = []

    def form(self, s: "Subgraph", class_of: list[int]) -> Any:
        dag = self.dag
        local: dict[int, int] = {}

        def loc(vs) -> tuple[int, ...]:
            return tuple(local.setdefault(v, len(local)) for v in vs)

        items: list[tuple] = []
        for c in s.children:
            if c.is_node:
                u = c.id
                items.append((dag.labels[u], len(dag.preds[u]), loc(self.reads[u]),
                              loc(self.writes[u]),
                              tuple(dag.value_size[v] for v in self.writes[u])))
            else:
                items.append(("s", class_of[c.id], loc(self.iface_order[c.id])))
        iface = (tuple(local[v] for v in s.inputs), tuple(local[v] for v in s.outputs))
        crossing = set(s.inputs).union(s.outputs)
        self.iface_order.append([v for v in local if v in crossing])
        return tuple(items), iface
