"""Identical subgraphs: a canonical form per subgraph and a hash table (paper, C.1.1).

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

from hiremate.schedule import Compute, Delete, Schedule

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
    translations: dict[int, Translation]


def classify(h: "Hierarchy") -> tuple[list[int], list[SubgraphClass]]:
    """Class of every subgraph of ``h`` (by id) and the classes, found with a hash table."""
    former = _GraphForm(h) if h.graph is not None else _DagForm(h)
    table: dict[Any, int] = {}
    class_of: list[int] = []
    walks: list[tuple[list[int], list[int]]] = []
    members: list[list[int]] = []
    for s in h.subgraphs:
        key, comp, data = former.form(s, class_of)
        cid = table.setdefault(key, len(table))
        if cid == len(members):
            members.append([])
        members[cid].append(s.id)
        class_of.append(cid)
        walks.append((comp, data))
    classes = []
    for cid, sids in enumerate(members):
        rep = sids[0]
        rep_comp, rep_data = walks[rep]
        translations = {}
        for sid in sids:
            comp, data = walks[sid]
            pairs: dict[int, int] = {}
            _pair_children(h, rep, sid, pairs)
            translations[sid] = Translation(dict(zip(rep_comp, comp)), dict(zip(rep_data, data)),
                                            pairs)
        classes.append(SubgraphClass(cid, rep, tuple(sids), translations))
    return class_of, classes


def _pair_children(h: "Hierarchy", rep: int, sid: int, out: dict[int, int]) -> None:
    """Match descendant subgraphs position by position (equal forms: equal child structure)."""
    for a, b in zip(h.subgraphs[rep].children, h.subgraphs[sid].children):
        if not a.is_node:
            out[a.id] = b.id
            _pair_children(h, a.id, b.id, out)


def _child_positions(h: "Hierarchy", s: "Subgraph") -> dict[int, int]:
    pos: dict[int, int] = {}
    for j, c in enumerate(s.children):
        for leaf in h.leaves(c):
            pos[leaf] = j
    return pos


class _GraphForm:
    """Canonical forms over the full CD-graph (forward and backward nodes, data nodes)."""

    def __init__(self, h: "Hierarchy"):
        assert h.graph is not None
        self.h = h
        self.nodes = h.graph.nodes
        self.data = h.graph.data
        self.node_class: dict[int, int] = {}
        self.node_keys: dict[Any, int] = {}

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

    def form(self, s: "Subgraph", class_of: list[int]) -> tuple[Any, list[int], list[int]]:
        pos = _child_positions(self.h, s)
        for f in s.fwd_nodes:
            partner = self.nodes[f].partner
            if partner is not None:
                pos[partner] = pos[f]
        comp = list(s.fwd_nodes) + list(s.bwd_nodes)
        local: dict[int, int] = {}

        def loc(ds: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(local.setdefault(d, len(local)) for d in ds)

        items = tuple(
            (self._class(c), pos[c], loc(self.nodes[c].inputs), loc(self.nodes[c].soft_inputs),
             loc(self.nodes[c].outputs))
            for c in comp
        )
        iface = tuple(tuple(local[d] for d in ds)
                      for ds in (s.inputs, s.outputs, s.grad_inputs, s.grad_outputs))
        kids = tuple(-1 if c.is_node else class_of[c.id] for c in s.children)
        return (items, iface, kids), comp, list(local)


class _DagForm:
    """Canonical forms over a bare forward DAG: labels, value sizes, predecessor positions."""

    def __init__(self, h: "Hierarchy"):
        self.h = h
        self.dag = h.dag
        self.reads, self.writes = h.dag.node_values()
        self.fwd_index = {p.id: i for i, p in enumerate(h.levels[0])}

    def form(self, s: "Subgraph", class_of: list[int]) -> tuple[Any, list[int], list[int]]:
        dag = self.dag
        pos = _child_positions(self.h, s)
        comp = list(s.fwd_nodes)
        index = {self.fwd_index[c]: k for k, c in enumerate(comp)}
        local: dict[int, int] = {}
        items = []
        for c in comp:
            u = self.fwd_index[c]
            items.append((
                dag.labels[u], pos[c],
                tuple(index.get(p, -1) for p in dag.preds[u]),
                tuple((local.setdefault(v, len(local)), dag.value_size[v]) for v in self.reads[u]),
                tuple((local.setdefault(v, len(local)), dag.value_size[v]) for v in self.writes[u]),
            ))
        iface = (tuple(local[v] for v in s.inputs), tuple(local[v] for v in s.outputs))
        kids = tuple(-1 if c.is_node else class_of[c.id] for c in s.children)
        return (tuple(items), iface, kids), comp, list(local)
