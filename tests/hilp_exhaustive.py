"""Exhaustive optimum over phase schedules (an independent truth for the H-ILP tests).

Dijkstra over states (phase t, position k in the phase, set of alive values), with the
simulator's memory model: phase t runs an increasing subsequence of 0..t ending with t (the loss
only in its own phase); after each compute step, any subset of the alive deletable values that
the node reads or produces may be freed. Written from the simulator's rules, not from the MILP.
"""

from __future__ import annotations

import heapq
import itertools
import math

from hiremate.ir.graph import SOURCE_KINDS, Graph


def exhaustive_optimum(graph: Graph, budget: int, save_budget: int | None = None,
                       max_states: int = 2_000_000) -> float:
    T = len(graph.nodes)
    loss = graph.loss
    counted = [d.size if d.counted else 0 for d in graph.data]
    source = {d.id for d in graph.data if d.kind in SOURCE_KINDS}
    protected = set(graph.outputs)
    final = frozenset(graph.final_data)
    nodes = graph.nodes
    start = (0, 0, frozenset())
    dist = {start: 0.0}
    heap = [(0.0, 0, start)]
    tick = itertools.count(1)
    while heap:
        cost, _, state = heapq.heappop(heap)
        if dist.get(state, math.inf) < cost:
            continue
        t, k, alive = state
        if t == T:
            if final <= alive:
                return cost
            continue
        if len(dist) > max_states:
            raise RuntimeError("exhaustive search too large")
        mem = sum(counted[d] for d in alive)
        succ: list[tuple[float, tuple]] = []

        def advance(alive2):
            return (t + 1, 0, alive2) if k == t else (t, k + 1, alive2)

        must = k == t
        can_run = (k != loss or t == loss)
        if not must:
            succ.append((cost, advance(alive)))
        if can_run:
            node = nodes[k]
            ok = all(d in source or d in alive for d in node.inputs)
            if k == loss and t == loss and save_budget is not None and mem > save_budget:
                ok = False
            if ok and mem + sum(counted[d] for d in node.outputs) + node.overhead <= budget:
                after = alive | frozenset(node.outputs)
                cands = [d for d in dict.fromkeys(node.inputs + node.outputs)
                         if d in after and d not in source and d not in protected]
                for r in range(len(cands) + 1):
                    for drop in itertools.combinations(cands, r):
                        succ.append((cost + node.time, advance(after - frozenset(drop))))
        for c2, s2 in succ:
            if c2 < dist.get(s2, math.inf):
                dist[s2] = c2
                heapq.heappush(heap, (c2, next(tick), s2))
    return math.inf
