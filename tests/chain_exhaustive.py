"""Exhaustive searches over chain sequences, the independent truth for the chain DP tests.

Dijkstra over the states of :func:`hiremate.solvers.chain.model.chain_step`: every valid sequence
of ``F_ck``/``F_e``/``F_all``/``B`` operations (Definition 3.1 of the Rotor paper) is a path, its
makespan the path length, and only operations that stay within the budget are edges.
``persistent=True`` keeps only memory persistent sequences (Definition 4.1): once ``F_ck(i)``
or ``F_all(i)`` has run, nothing on a stage ``< i`` and no ``F_e(i)`` may run before ``B(i)``.
"""

from __future__ import annotations

import heapq
import itertools
import math

from hiremate.solvers.chain.model import (
    B, Chain, ChainOp, ChainStepError, F_all, F_ck, F_e, OpKind, chain_step, initial_state,
)


def exhaustive_chain(chain: Chain, budget: float, persistent: bool = False
                     ) -> tuple[float, list[ChainOp] | None]:
    """Smallest makespan of a valid sequence within ``budget`` (and one such sequence)."""
    n = chain.n
    start = initial_state(chain)
    if start.mem > budget + 1e-9:
        return math.inf, None
    tie = itertools.count()
    key0 = (start.plain, start.bar, start.grad, start.turned, frozenset())
    best = {key0: 0.0}
    heap = [(0.0, next(tie), start, frozenset(), [])]
    while heap:
        cost, _, state, held, ops = heapq.heappop(heap)
        key = (state.plain, state.bar, state.grad, state.turned, held)
        if cost > best.get(key, math.inf):
            continue
        if state.grad == 0:
            return cost, ops
        low = max(held, default=0)
        cands = [B(state.grad)] + [f(k) for k in range(1, n + 1) for f in (F_ck, F_e, F_all)]
        for op in cands:
            if persistent and (op.stage < low or (op.kind is OpKind.F_E and op.stage in held)):
                continue
            try:
                new, during, _ = chain_step(chain, state, op)
            except ChainStepError:
                continue
            if max(during, new.mem) > budget + 1e-9:
                continue
            nheld = held
            if persistent:
                if op.kind in (OpKind.F_CK, OpKind.F_ALL):
                    nheld = held | {op.stage}
                elif op.kind is OpKind.B:
                    nheld = held - {op.stage}
            ncost = cost + (chain.bwd_time[op.stage - 1] if op.kind is OpKind.B
                            else chain.fwd_time[op.stage - 1])
            nkey = (new.plain, new.bar, new.grad, new.turned, nheld)
            if ncost < best.get(nkey, math.inf) - 1e-12:
                best[nkey] = ncost
                heapq.heappush(heap, (ncost, next(tie), new, nheld, ops + [op]))
    return math.inf, None
