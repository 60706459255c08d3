"""TW-Remat: rematerialisation guided by a tree decomposition (Kumar et al., NeurIPS 2019).

Why a tree decomposition: if the forward graph has a balanced separator ``X`` (a bag of a tree
decomposition of width ``k``), then any value in one component of ``G - X`` can be recomputed
from ``X`` and its own component alone. Keeping ``X`` while work stays inside one component, and
recursing into that component, keeps ``O(k log n)`` values alive at once while every node is
recomputed ``O(log n)``-ish times on graphs of small treewidth.

How it is adapted to CD-graphs (forward + loss + backward):

* the separator hierarchy is built once over the forward nodes (undirected data-flow graph):
  each region is split by the bag that best balances the bytes of its components, recursively,
  down to leaves of at most ``leaf`` nodes; every forward node has a *home* region (the one
  whose separator or leaf holds it) and a *depth*;
* the loss node and then each backward node, in their original order, are *requests*: the forward
  values they read must be in memory. A forward value is produced on demand (recursively from its
  inputs) and stays usable while the requests stay inside its home region's subtree; when
  the requests leave it, it is dropped and recomputed if needed again. Backward nodes and the
  loss run exactly once; model outputs are never recomputed;
* the family of schedules: forward nodes of depth ``< level`` are never dropped (stored
  checkpoints), and, for the extension to non-unit costs and sizes (greedy), the nodes with the
  highest recompute-time per byte are kept too (fraction ``keep_ratio``). ``level=0`` recomputes
  most, large ``level`` is autodiff. Every member of the family is replayed by the simulator
  and the fastest one within the budget wins.

Frees follow from the compute sequence (:mod:`hiremate.ir.sequence`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable

import networkx as nx
from networkx.algorithms.approximation import treewidth_min_degree, treewidth_min_fill_in

from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.graph import SOURCE_KINDS, Graph
from hiremate.ir.option import Option, pareto_front
from hiremate.ir.schedule import Schedule
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.solvers.menu import option_from_schedule
from hiremate.ir.sequence import sequence_to_schedule
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)

DECOMPOSITIONS = {"min_degree": treewidth_min_degree, "min_fill_in": treewidth_min_fill_in}


@dataclass
class SeparatorHierarchy:
    """Recursive balanced separators of the forward graph: home region and depth per node."""

    home: dict[int, int] = field(default_factory=dict)       # fwd node -> region id
    parent: list[int] = field(default_factory=list)          # region id -> parent region (-1)
    depth_of_region: list[int] = field(default_factory=list)
    width: int = 0                                           # largest separator used

    def depth(self, node: int) -> int:
        return self.depth_of_region[self.home[node]]

    def ancestors(self, region: int) -> list[int]:
        out = []
        while region >= 0:
            out.append(region)
            region = self.parent[region]
        return out

    @property
    def max_depth(self) -> int:
        return max(self.depth_of_region, default=0)


def forward_graph(graph: Graph) -> nx.Graph:
    """Undirected data-flow graph of the forward nodes, with bytes as node weights."""
    und = nx.Graph()
    for node in graph.fwd_nodes:
        weight = sum(graph.data[d].size for d in node.outputs if graph.data[d].counted)
        und.add_node(node.id, weight=weight + 1)
        for d in node.inputs:
            producer = graph.data[d].producer
            if producer is not None and graph.nodes[producer].is_fwd:
                und.add_edge(producer, node.id)
    return und


def _best_bag(sub: nx.Graph, decomposition: str) -> frozenset:
    """The bag of a tree decomposition of ``sub`` whose removal best balances component weight.

    Each vertex is charged to the first bag met by a DFS of the decomposition tree; removing a
    bag leaves the subtrees around it, whose charged weights estimate the components'.
    """
    _, tree = DECOMPOSITIONS[decomposition](sub)
    bags = list(tree.nodes)
    if len(bags) == 1:
        return bags[0]
    root = max(bags, key=len)
    order = list(nx.dfs_preorder_nodes(tree, root))
    parent = {root: None}
    for u, v in nx.dfs_edges(tree, root):
        parent[v] = u
    charged: dict[frozenset, int] = {b: 0 for b in bags}
    seen: set[int] = set()
    for bag in order:
        for v in bag:
            if v not in seen:
                seen.add(v)
                charged[bag] += sub.nodes[v]["weight"]
    below = dict(charged)
    for bag in reversed(order):
        if parent[bag] is not None:
            below[parent[bag]] += below[bag]
    total = below[root]

    def worst_side(bag: frozenset) -> tuple[int, int]:
        sides = [below[c] for c in tree.neighbors(bag) if parent.get(c) == bag]
        sides.append(total - below[bag])
        return max(sides), sum(sub.nodes[v]["weight"] for v in bag)

    return min(order, key=worst_side)


def build_hierarchy(graph: Graph, leaf: int = 4, decomposition: str = "min_degree"
                    ) -> SeparatorHierarchy:
    """Split the forward graph recursively by balanced separators until regions have
    at most ``leaf`` nodes."""
    und = forward_graph(graph)
    h = SeparatorHierarchy()
    stack: list[tuple[frozenset, int, int]] = [
        (frozenset(c), -1, 0) for c in nx.connected_components(und)
    ]
    while stack:
        region, parent, depth = stack.pop()
        rid = len(h.parent)
        h.parent.append(parent)
        h.depth_of_region.append(depth)
        if len(region) <= max(leaf, 1):
            for v in region:
                h.home[v] = rid
            continue
        sub = und.subgraph(region)
        sep = _best_bag(sub, decomposition)
        if len(sep) >= len(region):  # a clique: nothing to split
            for v in region:
                h.home[v] = rid
            continue
        h.width = max(h.width, len(sep) - 1)
        for v in sep:
            h.home[v] = rid
        rest = und.subgraph(region - sep)
        for comp in nx.connected_components(rest):
            stack.append((frozenset(comp), rid, depth + 1))
    return h


def twremat_sequence(graph: Graph, hierarchy: SeparatorHierarchy, level: int,
                     keep: Iterable[int] = ()) -> list[int]:
    """The compute sequence of one member of the family (see module docstring)."""
    nodes = graph.nodes
    data = graph.data
    fwd_preds: dict[int, list[int]] = {}
    for node in graph.fwd_nodes:
        preds = {data[d].producer for d in node.inputs if data[d].kind not in SOURCE_KINDS}
        fwd_preds[node.id] = sorted(p for p in preds if p is not None)
    pinned = set(keep)
    outputs = set(graph.outputs)
    for node in graph.fwd_nodes:
        if any(d in outputs for d in node.outputs) or node.mutates:
            pinned.add(node.id)
        elif hierarchy.depth(node.id) < level:
            pinned.add(node.id)
    valid: set[int] = set()
    seq: list[int] = []
    # random nodes must first run in the graph's order (the simulator's rule): before the first
    # run of one, the earlier ones that never ran are produced first
    randoms = [n.id for n in graph.fwd_nodes if n.random]
    ran: set[int] = set()

    def ensure(target: int) -> None:
        # iterative post-order: compute every missing ancestor before its user
        stack = [(target, False)]
        while stack:
            v, expanded = stack.pop()
            if v in valid:
                continue
            if expanded:
                seq.append(v)
                valid.add(v)
                ran.add(v)
                continue
            if v not in ran and nodes[v].random:
                earlier = [r for r in randoms if r < v and r not in ran]
                if earlier:  # they run first (smallest on top), then v again
                    stack.append((v, False))
                    stack.extend((r, False) for r in reversed(earlier))
                    continue
            stack.append((v, True))
            stack.extend((p, False) for p in fwd_preds[v] if p not in valid)

    def needs(nid: int) -> list[int]:
        out = []
        for d in nodes[nid].inputs:
            p = data[d].producer
            if p is not None and nodes[p].is_fwd:
                out.append(p)
        return out

    loss = nodes[graph.loss]
    first = set(needs(loss.id))
    first.update(n.id for n in graph.fwd_nodes if n.mutates or n.random)
    first.update(data[d].producer for d in graph.outputs if data[d].producer is not None)
    requests = [(loss.id, sorted(first))] + [(n.id, needs(n.id)) for n in graph.bwd_nodes]
    for nid, needed in requests:
        scope: set[int] = set()
        for u in needed:
            scope.update(hierarchy.ancestors(hierarchy.home[u]))
        drop = [v for v in valid if v not in pinned and hierarchy.home[v] not in scope]
        valid.difference_update(drop)
        for u in needed:
            ensure(u)
        seq.append(nid)
    return seq


@dataclass(frozen=True)
class Candidate:
    """One simulated member of the TW-Remat family."""

    params: tuple
    schedule: Schedule
    peak: int
    time: float


class TWRemat:
    """TW-Remat as a whole-graph solver and as a menu (bottom) solver.

    ``schedule`` raises :class:`InfeasibleBudgetError` (with ``min_budget``, the lowest peak in
    the family) when no member meets the budget; every returned schedule has been replayed by
    ``hiremate.simulate`` and is valid and within the budget.
    """

    name = "twremat"

    def __init__(self, leaves: tuple[int, ...] = (2, 8),
                 decompositions: tuple[str, ...] = ("min_degree", "min_fill_in"),
                 keep_ratios: tuple[float, ...] = (0.0, 0.2), max_nodes: int = 5000):
        self.leaves = leaves
        self.decompositions = decompositions
        self.keep_ratios = keep_ratios
        self.max_nodes = max_nodes
        self._cached: tuple[Graph, list[Candidate]] | None = None

    def applicable(self, graph: Graph) -> bool:
        return 0 < len(graph) <= self.max_nodes

    # -- the family -------------------------------------------------------------------------
    def candidates(self, graph: Graph) -> list[Candidate]:
        """Every simulated member of the family, autodiff included (cached per graph)."""
        if self._cached is not None and self._cached[0] is graph:
            return self._cached[1]
        out: list[Candidate] = []
        auto = autodiff_schedule(graph)
        res = simulate(graph, auto)
        if res.valid:
            out.append(Candidate(("autodiff",), auto, res.peak, res.time))
        ratio = {}
        for n in graph.fwd_nodes:
            size = sum(graph.data[d].size for d in n.outputs if graph.data[d].counted)
            ratio[n.id] = n.time / (size + 1)
        by_ratio = sorted(ratio, key=lambda v: -ratio[v])
        seen: set[tuple[int, ...]] = set()
        for dec in self.decompositions:
            for leaf in self.leaves:
                h = build_hierarchy(graph, leaf, dec)
                for q in self.keep_ratios:
                    keep = by_ratio[: int(q * len(by_ratio))]
                    for level in range(h.max_depth + 2):
                        seq = twremat_sequence(graph, h, level, keep)
                        sig = tuple(seq)
                        if sig in seen:
                            continue
                        seen.add(sig)
                        sched = sequence_to_schedule(graph, seq)
                        res = simulate(graph, sched)
                        if not res.valid:  # a bug, never expected: skip but say so
                            log.warning("TW-Remat member %s invalid: %s", (dec, leaf, q, level),
                                        res.error)
                            continue
                        out.append(Candidate((dec, leaf, q, level), sched, res.peak, res.time))
        log.debug("TW-Remat: %d distinct members for %r", len(out), graph)
        self._cached = (graph, out)
        return out

    def schedule(self, graph: Graph, budget: int) -> Schedule:
        cands = self.candidates(graph)
        fits = [c for c in cands if c.peak <= budget]
        if not fits:
            lowest = min(c.peak for c in cands)
            raise InfeasibleBudgetError(
                f"TW-Remat cannot fit {graph!r} in {fmt_bytes(budget)}: its lowest schedule "
                f"peaks at {fmt_bytes(lowest)}; raise the budget to at least that, or use a "
                "solver that searches further (e.g. FastSA or H-ILP)",
                min_budget=lowest,
            )
        return min(fits, key=lambda c: (c.time, c.peak)).schedule

    def menu(self, graph: Graph, budgets: Iterable[int] | None = None) -> list[Option]:
        """Options for the budgets (whole-subgraph peaks) that some member meets; with no
        budgets, the Pareto front of the whole family."""
        cands = self.candidates(graph)
        if budgets is None:
            chosen = cands
        else:
            chosen = []
            for b in budgets:
                fits = [c for c in cands if c.peak <= b]
                if fits:
                    chosen.append(min(fits, key=lambda c: (c.time, c.peak)))
        return pareto_front([option_from_schedule(graph, c.schedule, self.name) for c in chosen])


TWREMAT_SOLVERS = {"twremat": TWRemat}
