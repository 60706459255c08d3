"""Join DP (the join-networks paper) against an exhaustive search of the pebble game."""

from __future__ import annotations

import heapq
import itertools
import math

import pytest

from hiremate.solvers.chain.join_dp import (
    JoinCosts, join_sequence, min_slots, opt_join, opt_single, simulate_join,
)


def exhaustive_join(lengths, c, costs=JoinCosts(), keep=None):
    """Dijkstra over memory states: forward values held (a set: a duplicate is never useful),
    the backward value held per chain, whether the turn ran. Every move of Table 3 that keeps
    at most ``c`` values stored is an edge (``S`` followed by ``F`` is one move)."""
    k = len(lengths)
    b = tuple(keep) if keep is not None else (0,) * k
    start = (frozenset((j, 0) for j in range(k)), (None,) * k, False)
    if k > c:
        return math.inf
    best = {start: 0.0}
    tie = itertools.count()
    heap = [(0.0, next(tie), start)]
    while heap:
        cost, _, st = heapq.heappop(heap)
        if cost > best[st]:
            continue
        fwd, bwd, turned = st
        if turned and not fwd and all(
                (v == "done" and not b[j]) or (v == 0 and b[j]) for j, v in enumerate(bwd)):
            return cost
        moves = []
        for (j, i) in fwd:
            if i < lengths[j]:
                moves.append((costs.uf, fwd | {(j, i + 1)}, bwd, turned))       # S + F
                moves.append((costs.uf, (fwd - {(j, i)}) | {(j, i + 1)}, bwd, turned))  # F
            moves.append((0.0, fwd - {(j, i)}, bwd, turned))                    # D
        if not turned and all((j, lengths[j]) in fwd for j in range(k)):
            moves.append((costs.ut, fwd - {(j, lengths[j]) for j in range(k)},
                          tuple(lengths), True))
        for j, v in enumerate(bwd):
            if isinstance(v, int) and v > 0 and (j, v - 1) in fwd:
                nv = "done" if (v == 1 and not b[j]) else v - 1
                moves.append((costs.ub, fwd - {(j, v - 1)}, bwd[:j] + (nv,) + bwd[j + 1:],
                              turned))
            if v == 0 and not b[j]:  # discard a finished gradient
                moves.append((0.0, fwd, bwd[:j] + ("done",) + bwd[j + 1:], turned))
        for dc, f2, b2, t2 in moves:
            if len(f2) + sum(isinstance(v, int) for v in b2) > c:
                continue
            key = (f2, b2, t2)
            if cost + dc < best.get(key, math.inf):
                best[key] = cost + dc
                heapq.heappush(heap, (cost + dc, next(tie), key))
    return math.inf


def test_single_chain_closed_form():
    # Theorem 1, eq. (2): with 3 slots every step recomputes from x_0
    for l in range(1, 8):
        assert opt_single(l, 3) == l * (l + 1) / 2 + (l + 1)
    assert opt_single(0, 2) == 1 and math.isinf(opt_single(1, 2))


@pytest.mark.parametrize("lengths", [(1,), (3,), (5,), (1, 1), (2, 1), (2, 3), (3, 3), (1, 0),
                                     (0, 2), (1, 1, 1), (2, 1, 2)])
def test_join_matches_exhaustive(lengths):
    lo = min_slots(lengths)
    assert math.isinf(exhaustive_join(lengths, lo - 1))
    for c in range(lo, lo + 4):
        want = exhaustive_join(lengths, c)
        assert opt_join(lengths, c) == pytest.approx(want)
        ops = join_sequence(lengths, c)
        res = simulate_join(lengths, ops)
        assert res.valid, res.error
        assert res.makespan == pytest.approx(want) and res.peak <= c


def test_join_with_kept_gradients_and_costs():
    costs = JoinCosts(uf=2.0, ub=3.0, ut=0.5)
    for lengths, keep in [((2, 2), (1, 0)), ((3, 1), (0, 1)), ((2, 1, 1), (1, 1, 0))]:
        for c in range(min_slots(lengths, keep, costs), min_slots(lengths, keep, costs) + 3):
            want = exhaustive_join(lengths, c, costs, keep)
            assert opt_join(lengths, c, costs, keep) == pytest.approx(want)
            res = simulate_join(lengths, join_sequence(lengths, c, costs, keep), costs, keep)
            assert res.valid and res.makespan == pytest.approx(want) and res.peak <= c


def test_paper_minimum_slots():
    # Lemma 4 / section 6: two chains need 5 slots, three chains 7
    assert min_slots((5, 25)) == 5
    assert min_slots((10, 10, 10)) == 7
    # with all values stored the makespan is forward + turn + backward
    assert opt_join((4, 10, 12), 4 + 10 + 12 + 3 + 1) == 2 * 26 + 1


def test_simulator_rejects_bad_sequences():
    ops = join_sequence((2, 2), 6)
    assert not simulate_join((2, 2), ops[1:]).valid
    assert not simulate_join((2, 2), ops[:-1]).valid
