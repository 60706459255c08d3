"""H-Partition: the greedy recursive convex partitioning of HiRemate (paper, section 3.1, app. A).

One level of the algorithm, on the current graph G:

1. For every node x, a(x) is the closest common ancestor of its predecessors, with a virtual
   global source above every entry. We take the dominator sense of "closest common ancestor":
   a(x) is the immediate dominator of x, which on a DAG numbered topologically is the lowest
   common ancestor of x's predecessors in the dominator tree. This is exactly what makes the
   candidate groups valid in the sense of the paper's Property 1: every predecessor of a node
   on a path from a(x) to x is itself on such a path, or is a(x).
2. The candidate C_x holds every node on a path from a(x) to x, in four variants with or
   without each end. The variants that keep a(x) are kept only when a(x) has at most one
   predecessor, the case where they still satisfy Property 1 (head: that predecessor); the
   others would be convex on their own but could lose convexity when merged with a neighbour.
   Candidates with fewer than two or more than ``max_sub`` nodes are discarded.
3. Repeatedly take the candidate of smallest score s_alpha (eq. 1): the bytes of the values
   entering or leaving it times (number of original nodes)^alpha. It becomes a group; every
   other candidate that meets it absorbs it (Theorem A.4: still a valid candidate, hence convex)
   and is dropped when it grows beyond ``max_sub`` nodes.
4. Stop when no candidate is left or the graph, groups counted as single nodes, has at most
   ``max_top`` nodes; groups become the nodes of the next level; repeat until the top graph has
   at most ``max_top`` nodes.

When a level finds no candidate at all (e.g. a graph of independent nodes) the level falls back
to cutting its topological order into intervals of ``max_sub`` nodes: an interval of a
topological order is always convex, so progress is guaranteed.

Complexity: building candidates costs O(max_sub * degree) per node (the backward search stops
when it exceeds ``max_sub`` nodes, and the dominator walk is capped likewise); each merge
touches the candidates that meet the new group, a number bounded by the local structure.
"""

from __future__ import annotations

import heapq
import logging

from hiremate.errors import ConfigError
from hiremate.graph import Graph

from .dag import ForwardDag, contract, forward_dag
from .hierarchy import Hierarchy, hierarchy_from_levels

log = logging.getLogger(__name__)

_ROOT = -1  # the virtual global source


def immediate_dominators(preds: list[tuple[int, ...]], cap: int) -> list[int]:
    """Immediate dominator of each node of a topologically numbered DAG (``-1``: the source).

    Each node's dominator is the meeting point of its predecessors' dominator chains. A walk
    longer than ``cap`` steps means the dominator is far away: any candidate built on it would
    exceed the size limit, so we answer the virtual source, which dominates everything and keeps
    every later answer a true dominator (hence every candidate valid).
    """
    idom = [_ROOT] * len(preds)
    for x, ps in enumerate(preds):
        if not ps:
            continue
        a = ps[-1]
        steps = 0
        for b in ps[:-1]:
            while a != b:
                if a > b:
                    a = idom[a]
                else:
                    b = idom[b]
                steps += 1
                if a == _ROOT or b == _ROOT or steps > cap:
                    a = _ROOT
                    break
            if a == _ROOT:
                break
        idom[x] = a
    return idom


def _between(x: int, a: int, preds: list[tuple[int, ...]], limit: int) -> set[int] | None:
    """Nodes on paths from ``a`` to ``x`` (both included unless ``a`` is the source), or None
    when there are more than ``limit``. Since ``a`` dominates ``x``, searching backwards from
    ``x`` without expanding ``a`` visits exactly those nodes."""
    seen = {x}
    stack = [x]
    while stack:
        u = stack.pop()
        if u == a:
            continue
        for p in preds[u]:
            if p not in seen:
                seen.add(p)
                if len(seen) > limit:
                    return None
                stack.append(p)
    return seen


class _Scorer:
    """s_alpha(C) = (bytes of values entering or leaving C) * (original nodes in C)^alpha."""

    def __init__(self, dag: ForwardDag, alpha: float):
        self.alpha = alpha
        self.reads, self.writes = dag.node_values()
        self.size = dag.value_size
        self.producer = dag.value_producer
        self.users = [frozenset(u) for u in dag.value_users]
        self.is_out = dag.value_is_output
        self.weight = dag.weight

    def __call__(self, group: frozenset[int]) -> float:
        size, producer, users, is_out = self.size, self.producer, self.users, self.is_out
        total = 0
        leaves = 0
        seen: set[int] = set()
        for u in group:
            leaves += self.weight[u]
            for v in self.reads[u]:
                if v not in seen and producer[v] not in group:
                    seen.add(v)
                    total += size[v]
            for v in self.writes[u]:
                if is_out[v] or not users[v] <= group:
                    total += size[v]
        return total * leaves ** self.alpha


def candidates(dag: ForwardDag, max_sub: int) -> list[frozenset[int]]:
    """The initial candidate groups of one level, deduplicated, in a deterministic order."""
    preds = dag.preds
    idom = immediate_dominators(preds, cap=4 * max_sub + 8)
    found: dict[frozenset[int], None] = {}
    for x in range(dag.n):
        a = idom[x]
        between = _between(x, a, preds, max_sub + 2)
        if between is None:
            continue
        keep_head = a != _ROOT and len(preds[a]) <= 1
        inner = between - {a} if a != _ROOT else between
        variants = [inner, inner - {x}]
        if keep_head:
            variants += [between, between - {x}]
        for c in variants:
            if 2 <= len(c) <= max_sub:
                found.setdefault(frozenset(c), None)
    return list(found)


def greedy_groups(dag: ForwardDag, max_top: int, max_sub: int, alpha: float) -> list[frozenset[int]]:
    """One level of Algorithm 2: the groups (of two nodes or more) that become subgraphs."""
    score = _Scorer(dag, alpha)
    cand: dict[int, frozenset[int]] = {}
    by_set: dict[frozenset[int], int] = {}
    of_node: list[set[int]] = [set() for _ in range(dag.n)]
    heap: list[tuple[float, int]] = []

    def add(c: frozenset[int], cid: int) -> None:
        cand[cid] = c
        by_set[c] = cid
        for u in c:
            of_node[u].add(cid)
        heapq.heappush(heap, (score(c), cid))

    def remove(cid: int) -> frozenset[int]:
        c = cand.pop(cid)
        del by_set[c]
        for u in c:
            of_node[u].discard(cid)
        return c

    next_id = 0
    for c in candidates(dag, max_sub):
        add(c, next_id)
        next_id += 1

    group_of = [-1] * dag.n
    groups: dict[int, frozenset[int]] = {}
    count = dag.n
    while heap and count > max_top:
        _, cid = heapq.heappop(heap)
        if cid not in cand:
            continue  # stale entry: the candidate was updated or dropped
        c = remove(cid)
        units = {group_of[u] if group_of[u] >= 0 else -2 - u for u in c}
        count -= len(units) - 1
        for g in units:
            if g >= 0:
                del groups[g]
        groups[cid] = c
        for u in c:
            group_of[u] = cid
        touched = sorted(set().union(*(of_node[u] for u in c)))
        for other in touched:
            merged = remove(other) | c
            if len(merged) > max_sub or merged == c or merged in by_set:
                continue
            add(merged, next_id)  # a new id: older heap entries of ``other`` become stale
            next_id += 1
    return [groups[g] for g in sorted(groups, key=lambda g: min(groups[g]))]


def interval_groups(n: int, max_sub: int) -> list[frozenset[int]]:
    """Fallback: consecutive runs of a topological order (always convex)."""
    return [frozenset(range(s, min(s + max_sub, n))) for s in range(0, n, max_sub)]


def hpartition_levels(
    dag: ForwardDag, max_top: int, max_sub: int, alpha: float
) -> list[list[tuple[int, ...]]]:
    """All levels: ``levels[k]`` lists the blocks of level ``k + 1`` as tuples of level-``k``
    node indices, in the topological order of level ``k + 1`` (level 0: the DAG's nodes)."""
    levels: list[list[tuple[int, ...]]] = []
    current = dag
    while current.n > max_top:
        groups = greedy_groups(current, max_top, max_sub, alpha)
        if not groups:
            log.info("H-Partition level %d: no candidate group, cutting %d nodes into intervals",
                     len(levels) + 1, current.n)
            groups = interval_groups(current.n, max_sub)
        grouped = set().union(*groups)
        blocks = [sorted(g) for g in groups] + [[u] for u in range(current.n) if u not in grouped]
        current, ordered = contract(current, blocks)
        levels.append(ordered)
        log.debug("H-Partition level %d: %d groups, %d nodes left", len(levels), len(groups),
                  current.n)
    return levels


class HPartition:
    """The H-Partition partitioner: a hierarchy whose subgraphs have at most ``max_sub`` nodes
    and whose top graph has at most ``max_top`` nodes (paper: M^l and M^t)."""

    name = "hpartition"

    def __init__(self, max_top: int = 30, max_sub: int = 15, alpha: float = 0.5):
        if max_sub < 2:
            raise ConfigError(f"max_sub={max_sub}: subgraphs need at least 2 nodes; use >= 2")
        if max_top < 1:
            raise ConfigError(f"max_top={max_top}: the top graph needs at least 1 node")
        if alpha < 0:
            raise ConfigError(f"alpha={alpha} must be >= 0 (the paper uses 0.5)")
        self.max_top = max_top
        self.max_sub = max_sub
        self.alpha = alpha

    def __repr__(self) -> str:
        return f"HPartition(max_top={self.max_top}, max_sub={self.max_sub}, alpha={self.alpha})"

    def partition_dag(self, dag: ForwardDag) -> Hierarchy:
        """Partition a bare forward DAG (no interfaces in data ids, no backward nodes)."""
        levels = hpartition_levels(dag, self.max_top, self.max_sub, self.alpha)
        return hierarchy_from_levels(dag, levels, partitioner=repr(self))

    def partition(self, graph: Graph) -> Hierarchy:
        dag, node_ids, value_ids = forward_dag(graph)
        levels = hpartition_levels(dag, self.max_top, self.max_sub, self.alpha)
        return hierarchy_from_levels(dag, levels, partitioner=repr(self), graph=graph,
                                     node_ids=node_ids)
