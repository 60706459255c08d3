"""H-Partition: the greedy recursive convex partitioning of HiRemate.

The paper is "HiRemate: Hierarchical Approach for Efficient Re-materialization of Large Neural
Networks": section 3.1 and appendix A (Algorithm 2, score eq. 1).

One level of the algorithm, on the current graph G (nodes numbered topologically):

1. Candidates. For every node x, a(x) is the closest common ancestor of its predecessors, with a
   virtual global source above every entry; we take it in the dominator sense (the immediate
   dominator of x). The candidate holds every node on a path from a(x) to x, in the paper's four
   variants with or without each end; candidates of fewer than two or more than ``max_sub``
   nodes are discarded.
   On captured graphs a(x) is often far away: one value computed early and read by every layer
   (GPT-2's causal mask, rotary tables, an encoder's output read by every decoder layer) makes
   the global source the dominator of everything after it, so the paper's interval is the whole
   prefix and no candidate would cover an attention block. For such an x we take instead the
   prefix of x's highest-numbered ancestors (at most ``max_sub``) whose interface, in bytes, is
   smallest: the set of x's ancestors numbered from some t on. With the ancestors numbered
   below t absorbed into the global source this is the paper's interval again.
   Nodes with no edge at all (e.g. BatchNorm's ``num_batches_tracked`` increments) are in no
   candidate (their interval is themselves); once the greedy is done, each joins the group of
   its next (else previous) linked node in topological order when that group has room.
2. Validity. Every candidate is *closed*: each predecessor of a member is a member or numbered
   below the candidate's first linked member (isolated nodes do not count). The paper's
   candidates are closed (all their outside predecessors are a(x)). A closed set is convex (a
   path leaving it and coming back would enter it from a node numbered above its first member),
   and disjoint closed groups contract without a cycle (along an edge between groups, the first
   member's number strictly grows). This replaces Property 1 and Theorem A.4, which the
   generalised candidates do not satisfy: the union of two closed sets need not be closed.
3. Greedy. Repeatedly take the candidate of smallest score s_alpha (eq. 1): the bytes of the
   values entering or leaving it times (number of original nodes)^alpha. It becomes a group;
   every other candidate that meets it absorbs it (the paper's update), then is closed again
   (predecessors in its range are added, whole groups at a time) and dropped when it grows
   beyond ``max_sub`` nodes. For the paper's candidates the closure adds nothing.
4. Stop. The level goes on until no candidate is left or the graph, groups counted as single
   nodes, has at most ``max_top`` nodes. In the latter case it still takes every candidate
   whose score is at most the largest score taken so far, so that identical blocks (equal
   scores) end up grouped alike rather than cut off midway through one repetition; this keeps
   the number of unique subgraphs from growing with the number of layers. Groups become the
   nodes of the next level; repeat until the top graph has at most ``max_top`` nodes.

Random nodes (dropout) must first run in the graph's order. Before the first level, an
ordering edge joins each random node to the next one wherever no path does already
(:func:`.dag.order_random`); like soft edges, these count for closure, convexity and the
contraction's order but carry no bytes, so scores ignore them. Every part at every level then
holds a run of consecutive random nodes, and the parts' order draws them in the graph's order.

When a level finds no candidate at all (e.g. a graph of independent nodes) the level falls back
to cutting its topological order into intervals of ``max_sub`` nodes: an interval of a
topological order is always convex, so progress is guaranteed.

Complexity: building candidates costs O(max_sub * degree * log) per node (the backward searches
stop after ``max_sub`` nodes, and the dominator walk is capped likewise); each merge touches the
candidates that meet the new group, a number bounded by the local structure.
"""

from __future__ import annotations

import bisect
import heapq
import logging

from hiremate.errors import ConfigError
from hiremate.ir.graph import Graph

from .constants import DEFAULT_FRACTION, prologue
from .dag import ForwardDag, contract, forward_dag, induced, order_random
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


def linked_nodes(preds: list[tuple[int, ...]]) -> list[bool]:
    """Whether each node has a predecessor or a successor (isolated nodes constrain nothing)."""
    linked = [bool(ps) for ps in preds]
    for ps in preds:
        for p in ps:
            linked[p] = True
    return linked


def is_closed(group: frozenset[int] | set[int], preds: list[tuple[int, ...]],
              linked: list[bool]) -> bool:
    """Whether every predecessor of a member is a member or precedes the group's first linked
    member: the validity invariant of every candidate and group (see the module docstring).
    It implies convexity, and disjoint closed groups always contract without a cycle."""
    lo = min((u for u in group if linked[u]), default=None)
    if lo is None:
        return True
    return all(p in group or p < lo for u in group for p in preds[u])


def ancestor_suffix(x: int, preds: list[tuple[int, ...]], limit: int) -> list[int]:
    """The ``limit`` highest-numbered ancestors of ``x`` (``x`` first), in decreasing order.

    Every prefix of the answer is closed: a predecessor of one of its nodes is either in it or
    numbered below its last node (the search pops ancestors largest first).
    """
    out: list[int] = []
    heap = [-x]
    seen = {x}
    while heap and len(out) < limit:
        u = -heapq.heappop(heap)
        out.append(u)
        for p in preds[u]:
            if p not in seen:
                seen.add(p)
                heapq.heappush(heap, -p)
    return out


class _Cuts:
    """Interface bytes of each prefix of an ancestor suffix, computed incrementally.

    Adding the next (lowest) node u to a set S of larger-numbered nodes: u's values read
    inside S stop being inputs, u's values read outside S or by the loss become outputs, and
    u's own inputs join the inputs. Outputs of S never change (nothing in S feeds u).
    """

    def __init__(self, dag: ForwardDag):
        self.reads, self.writes = dag.node_values()
        self.size = dag.value_size
        self.users = dag.value_users
        self.is_out = dag.value_is_output

    def best(self, suffix: list[int]) -> int:
        """The prefix length k >= 2 whose interface is smallest (ties: the smaller k), or 0."""
        members: set[int] = set()
        inputs: set[int] = set()
        total = 0
        best_k, best_bytes = 0, -1
        for k, u in enumerate(suffix, start=1):
            members.add(u)
            for v in self.writes[u]:
                if v in inputs:
                    inputs.discard(v)
                    total -= self.size[v]
                if self.is_out[v] or any(w not in members for w in self.users[v]):
                    total += self.size[v]
            for v in self.reads[u]:
                if v not in inputs:
                    inputs.add(v)
                    total += self.size[v]
            if k >= 2 and (best_bytes < 0 or total < best_bytes):
                best_k, best_bytes = k, total
        return best_k


def candidates(dag: ForwardDag, max_sub: int) -> list[frozenset[int]]:
    """The initial candidate groups of one level, deduplicated, in a deterministic order.

    For each x: the paper's four variants of the nodes between a(x) and x when they fit in
    ``max_sub``; otherwise (a(x) is far, typically because x also reads a value computed long
    before, such as an attention mask shared by all layers) the prefix of x's highest-numbered
    ancestors with the smallest interface, with and without x.
    """
    preds = dag.preds
    idom = immediate_dominators(preds, cap=4 * max_sub + 8)
    cuts = _Cuts(dag)
    found: dict[frozenset[int], None] = {}
    for x in range(dag.n):
        a = idom[x]
        between = _between(x, a, preds, max_sub + 1)
        if between is not None:
            inner = between - {a} if a != _ROOT else between
            variants = [inner, inner - {x}]
            if a != _ROOT:
                variants += [between, between - {x}]
        else:
            suffix = ancestor_suffix(x, preds, max_sub)
            k = cuts.best(suffix)
            cut = set(suffix[:k])
            variants = [cut, cut - {x}]
        for c in variants:
            if 2 <= len(c) <= max_sub:
                found.setdefault(frozenset(c), None)
    return list(found)


def _close(members: set[int], preds: list[tuple[int, ...]], linked: list[bool], unit,
           limit: int) -> frozenset[int] | None:
    """Smallest closed superset of ``members`` made of whole units (groups), or None when it
    has more than ``limit`` nodes. ``unit(p)`` lists the nodes that must stay with ``p``."""
    def first() -> int:
        return min((u for u in members if linked[u]), default=len(preds))

    lo = first()
    stack = list(members)
    while stack:
        u = stack.pop()
        for p in preds[u]:
            if p < lo or p in members:
                continue
            for m in unit(p):
                if m not in members:
                    members.add(m)
                    stack.append(m)
            if len(members) > limit:
                return None
            new_lo = first()
            if new_lo < lo:  # predecessors skipped so far may now fall inside the range
                lo = new_lo
                stack = list(members)
                break
    return frozenset(members)


def greedy_groups(dag: ForwardDag, max_top: int, max_sub: int, alpha: float) -> list[frozenset[int]]:
    """One level of Algorithm 2: the groups (of two nodes or more) that become subgraphs."""
    score = _Scorer(dag, alpha)
    preds = dag.preds
    linked = linked_nodes(preds)
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

    def unit(u: int) -> frozenset[int] | tuple[int]:
        return groups[group_of[u]] if group_of[u] >= 0 else (u,)

    count = dag.n
    tier = -1.0  # the largest score selected so far
    while heap:
        s, cid = heap[0]
        if cid not in cand:
            heapq.heappop(heap)
            continue  # stale entry: the candidate was updated or dropped
        if count <= max_top and s > tier:
            break  # small enough, and every candidate scoring <= tier has been taken
        heapq.heappop(heap)
        tier = max(tier, s)
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
            union = remove(other) | c
            if len(union) > max_sub or union == c:
                continue
            merged = _close(set(union), preds, linked, unit, max_sub)
            if merged is None or merged == c or merged in by_set:
                continue
            add(merged, next_id)  # a new id: older heap entries of ``other`` become stale
            next_id += 1
    next_id = _attach_isolated(linked, group_of, groups, max_sub, next_id)
    return [groups[g] for g in sorted(groups, key=lambda g: min(groups[g]))]


def _attach_isolated(linked: list[bool], group_of: list[int], groups: dict[int, frozenset[int]],
                     max_sub: int, next_id: int) -> int:
    """Let each node without any edge join the unit of its next linked node in topological
    order (else of its previous one) when that unit has room; those left over are grouped
    among themselves, ``max_sub`` at a time. ``groups`` and ``group_of`` are updated in place.
    No candidate holds such a node (its interval is itself), and adding it to a closed group
    keeps the group closed, since isolated members do not count."""
    order = [u for u in range(len(linked)) if linked[u]]
    for x in range(len(linked)):
        if linked[x] or group_of[x] >= 0:
            continue
        at = bisect.bisect(order, x)
        for y in order[at:at + 1] + order[max(at - 1, 0):at]:
            g = group_of[y]
            members = groups[g] if g >= 0 else frozenset((y,))
            if len(members) >= max_sub:
                continue
            if g >= 0:
                del groups[g]
            joined = members | {x}
            groups[next_id] = joined
            for u in joined:
                group_of[u] = next_id
            next_id += 1
            break
    left = [x for x in range(len(linked)) if not linked[x] and group_of[x] < 0]
    for s in range(0, len(left) - 1, max_sub):
        chunk = frozenset(left[s:s + max_sub])
        if len(chunk) >= 2:
            groups[next_id] = chunk
            for u in chunk:
                group_of[u] = next_id
            next_id += 1
    return next_id


def interval_groups(n: int, max_sub: int) -> list[frozenset[int]]:
    """Fallback: consecutive runs of a topological order (always convex)."""
    return [frozenset(range(s, min(s + max_sub, n))) for s in range(0, n, max_sub)]


def hpartition_levels(
    dag: ForwardDag, max_top: int, max_sub: int, alpha: float
) -> list[list[tuple[int, ...]]]:
    """All levels: ``levels[k]`` lists the blocks of level ``k + 1`` as tuples of level-``k``
    node indices, in the topological order of level ``k + 1`` (level 0: the DAG's nodes).

    The levels are computed on ``dag`` with its random nodes chained (:func:`.dag.order_random`),
    so that the parts of every level, in their order, draw random numbers in the graph's order.
    """
    levels: list[list[tuple[int, ...]]] = []
    current = order_random(dag)
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


def hoisted_levels(
    dag: ForwardDag, max_top: int, max_sub: int, alpha: float, const_fraction: float
) -> list[list[tuple[int, ...]]]:
    """Levels as :func:`hpartition_levels`, with the prologue (:mod:`.constants`) hoisted: its
    nodes are partitioned on their own up to a single top-level part, which comes first, and
    the other nodes on their own up to ``max_top - 1`` top-level parts.

    Without its edges, a mask or position ids read by every layer no longer makes the global
    source the dominator of every layer, nor ties each layer's candidates to the start of the
    graph. The prologue is closed under predecessors, so no path leaves it and comes back, nor
    leaves the rest and comes back: convex sets of either side are convex in ``dag``, and the
    prologue's parts followed by the rest's parts is a topological order at every level.
    Random nodes are chained first (:func:`.dag.order_random`): a random node is never
    constant, and with the chain no later random node can be hoisted before an earlier one.
    """
    dag = order_random(dag)
    pro = prologue(dag, const_fraction) if max_top >= 2 and dag.n > max_top else []
    if not pro or len(pro) == dag.n:
        return hpartition_levels(dag, max_top, max_sub, alpha)
    hoisted = set(pro)
    rest = [u for u in range(dag.n) if u not in hoisted]
    sides = [(pro, hpartition_levels(induced(dag, pro), 1, max_sub, alpha)),
             (rest, hpartition_levels(induced(dag, rest), max_top - 1, max_sub, alpha))]
    log.info("H-Partition: %d constant nodes hoisted into a first top-level part", len(pro))
    depth = max(len(lv) for _, lv in sides)
    width = [len(pro), len(rest)]  # nodes of each side at the current level
    levels: list[list[tuple[int, ...]]] = []
    for k in range(depth):
        blocks: list[tuple[int, ...]] = []
        offset = 0
        for side, (nodes, side_levels) in enumerate(sides):
            if k < len(side_levels):
                own = side_levels[k]
            else:  # this side is done: its parts pass through
                own = [(j,) for j in range(width[side])]
            if k == 0:
                blocks += [tuple(nodes[j] for j in b) for b in own]
            else:
                blocks += [tuple(offset + j for j in b) for b in own]
            offset += width[side]
            width[side] = len(own)
        levels.append(blocks)
    return levels


class HPartition:
    """The H-Partition partitioner: a hierarchy whose subgraphs have at most ``max_sub`` nodes
    and whose top graph has at most ``max_top`` nodes (paper: M^l and M^t). With ``prologue``,
    constant nodes are hoisted into a first top-level part (:func:`hoisted_levels`), holding at
    most ``const_fraction`` of the forward values' bytes, as the sequence partitioner does. It
    is off by default: on the zoo's transformers it adds a level (the prologue's own) and a
    class or two, and groups the layers no better (docs/graphs.md, "Prologue pre-pass")."""

    name = "hpartition"

    def __init__(self, max_top: int = 30, max_sub: int = 15, alpha: float = 0.5,
                 prologue: bool = False, const_fraction: float = DEFAULT_FRACTION):
        if max_sub < 2:
            raise ConfigError(f"max_sub={max_sub}: subgraphs need at least 2 nodes; use >= 2")
        if max_top < 1:
            raise ConfigError(f"max_top={max_top}: the top graph needs at least 1 node")
        if alpha < 0:
            raise ConfigError(f"alpha={alpha} must be >= 0 (the paper uses 0.5)")
        if not 0 <= const_fraction <= 1:
            raise ConfigError(f"const_fraction={const_fraction} must be in [0, 1] (a share of "
                              "the forward values' bytes)")
        self.max_top = max_top
        self.max_sub = max_sub
        self.alpha = alpha
        self.prologue = bool(prologue)
        self.const_fraction = float(const_fraction)

    def __repr__(self) -> str:
        extra = ""
        if self.prologue:
            extra += ", prologue=True"
        if self.const_fraction != DEFAULT_FRACTION:
            extra += f", const_fraction={self.const_fraction}"
        return (f"HPartition(max_top={self.max_top}, max_sub={self.max_sub}, "
                f"alpha={self.alpha}{extra})")

    def coarser(self, top_size: int) -> "HPartition | None":
        """The same partitioner with a top graph of at most half of ``top_size`` nodes (the top
        a partition of this one had), or None below 2. The composer asks for it when the top
        level of this partition finds no schedule within the budget: a smaller top puts more
        of the graph inside subgraphs, for the composers below it to schedule, where the
        options of a fine top's parts may not combine within the budget."""
        smaller = min(self.max_top, top_size) // 2
        if smaller < 2:
            return None
        return HPartition(smaller, self.max_sub, self.alpha, self.prologue, self.const_fraction)

    def levels(self, dag: ForwardDag) -> list[list[tuple[int, ...]]]:
        """The blocks of every level (see :func:`hpartition_levels`)."""
        if self.prologue:
            return hoisted_levels(dag, self.max_top, self.max_sub, self.alpha,
                                  self.const_fraction)
        return hpartition_levels(dag, self.max_top, self.max_sub, self.alpha)

    def partition_dag(self, dag: ForwardDag) -> Hierarchy:
        """Partition a bare forward DAG (no interfaces in data ids, no backward nodes)."""
        return hierarchy_from_levels(dag, self.levels(dag), partitioner=repr(self))

    def partition(self, graph: Graph) -> Hierarchy:
        dag, node_ids, value_ids = forward_dag(graph)
        return hierarchy_from_levels(dag, self.levels(dag), partitioner=repr(self), graph=graph,
                                     node_ids=node_ids)
