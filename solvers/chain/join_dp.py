"""Optimal rematerialisation of several homogeneous chains that join at the loss
(the join-networks paper: Siamese and cross-modal networks).

Model (Table 3): ``k`` chains of lengths ``ℓ_j``; every forward value ``x_i^{(j)}`` and every
backward value ``x̄_i^{(j)}`` takes one of ``c`` memory slots. Operations:

- ``S(j, i)``: copy ``x_i^{(j)}`` into a new slot (a checkpoint);
- ``F(j, i)``: ``x_i^{(j)} -> x_{i+1}^{(j)}`` in place (``u_f``);
- ``T``: the turn (loss): every ``x_{ℓ_j}^{(j)} -> x̄_{ℓ_j}^{(j)}`` in place (``u_t``);
- ``Fb(j, i)``: ``x_i^{(j)}, x̄_{i+1}^{(j)} -> x̄_i^{(j)}``, freeing ``x_i`` (``u_b``);
- ``D(j, i)`` / ``Db(j)``: free a forward value / the final ``x̄_0^{(j)}`` (no cost).

:func:`opt_single` is the classic dynamic program for one chain (Theorem 1, with the first
checkpoint ``i`` ranging over ``1..l``); :func:`opt_join` is Theorem 3: place the first
checkpoint ``i`` of the chain ``m`` whose backward finishes last, solve the remaining join with
one slot less (chain ``m`` now starts at ``x_i`` and its last gradient is kept, ``b_m = 1``),
then reverse the first ``i`` steps of chain ``m`` with the slots that the kept gradients of the
other chains leave. :func:`join_sequence` rebuilds the operations and :func:`simulate_join`
replays them (validity, makespan, peak slots).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from hiremate.errors import InfeasibleBudgetError


@dataclass(frozen=True)
class JoinCosts:
    """Unit costs of forward steps, backward steps and the turn."""

    uf: float = 1.0
    ub: float = 1.0
    ut: float = 1.0


def opt_single(l: int, c: int, costs: JoinCosts = JoinCosts()) -> float:  # noqa: E741
    """``Opt_0(l, c)``: from ``{x_0, x̄_{l+1}}`` to ``{x̄_0}`` (``l`` forward steps, ``l + 1``
    backward steps) with ``c`` slots."""
    return _single(l, c, costs)[0]


@lru_cache(maxsize=None)
def _single(l: int, c: int, costs: JoinCosts) -> tuple[float, int]:  # noqa: E741
    """Value and best first checkpoint (0 when there is none to place)."""
    if l == 0:
        return (costs.ub, 0) if c >= 2 else (math.inf, 0)
    if c < 3:
        return math.inf, 0
    best, arg = math.inf, 0
    for i in range(1, l + 1):
        val = i * costs.uf + _single(l - i, c - 1, costs)[0] + _single(i - 1, c, costs)[0]
        if val < best:
            best, arg = val, i
    return best, arg


def opt_join(lengths: Sequence[int], c: int, costs: JoinCosts = JoinCosts(),
             keep: Sequence[int] | None = None) -> float:
    """``Opt_b-multi(ℓ, c, b)``: the optimal makespan of the join with chain lengths
    ``lengths`` and ``c`` slots; ``keep[j] = 1`` when ``x̄_0^{(j)}`` must stay in memory
    (default: none, ``PROB_multi``)."""
    b = tuple(keep) if keep is not None else (0,) * len(lengths)
    return _join(tuple(lengths), c, b, costs)[0]


@lru_cache(maxsize=None)
def _join(ell: tuple[int, ...], c: int, b: tuple[int, ...], costs: JoinCosts
          ) -> tuple[float, tuple[int, int] | None]:
    k = len(ell)
    if not any(ell):
        return (costs.ut, None) if c >= k else (math.inf, None)
    if c < k + 1:
        return math.inf, None
    best, arg = math.inf, None
    for m in range(k):
        rest_slots = c - sum(b[j] for j in range(k) if j != m)
        for i in range(1, ell[m] + 1):
            tail = _single(i - 1, rest_slots, costs)[0]
            if not math.isfinite(tail):
                continue
            sub = _join(ell[:m] + (ell[m] - i,) + ell[m + 1:], c - 1,
                        b[:m] + (1,) + b[m + 1:], costs)[0]
            val = i * costs.uf + sub + tail
            if val < best:
                best, arg = val, (m, i)
    return best, arg


def min_slots(lengths: Sequence[int], keep: Sequence[int] | None = None,
              costs: JoinCosts = JoinCosts()) -> int:
    """Fewest slots for which the join can be processed (the DP's own feasibility limit)."""
    c = len(lengths)
    while not math.isfinite(opt_join(lengths, c, costs, keep)):
        c += 1
    return c


# -- operations ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JoinOp:
    """``kind`` in ``S``, ``F``, ``T``, ``Fb``, ``D``, ``Db``; ``chain``/``pos`` as in the
    module docstring (``-1`` for the turn)."""

    kind: str
    chain: int = -1
    pos: int = -1

    def __str__(self) -> str:
        return self.kind if self.kind == "T" else f"{self.kind}({self.chain},{self.pos})"


def _single_ops(chain: int, start: int, l: int, c: int, costs: JoinCosts) -> list[JoinOp]:  # noqa
    """Reverse ``x_start .. x_{start+l}`` of ``chain`` from ``{x_start, x̄_{start+l+1}}``."""
    if l == 0:
        return [JoinOp("Fb", chain, start)]
    val, i = _single(l, c, costs)
    if not math.isfinite(val):
        raise InfeasibleBudgetError(f"a single chain of length {l} does not fit in {c} slots; "
                                    "give more slots")
    ops = [JoinOp("S", chain, start)] + [JoinOp("F", chain, start + q) for q in range(i)]
    ops += _single_ops(chain, start + i, l - i, c - 1, costs)
    ops += _single_ops(chain, start, i - 1, c, costs)
    return ops


def join_sequence(lengths: Sequence[int], c: int, costs: JoinCosts = JoinCosts(),
                  keep: Sequence[int] | None = None) -> list[JoinOp]:
    """Operations of an optimal schedule (:class:`InfeasibleBudgetError`, a ``ValueError``,
    when ``c`` slots are too few)."""
    ell = tuple(lengths)
    b = tuple(keep) if keep is not None else (0,) * len(ell)
    if not math.isfinite(_join(ell, c, b, costs)[0]):
        raise InfeasibleBudgetError(f"the join {list(ell)} does not fit in {c} slots; give "
                                    "more slots")
    return _join_ops(ell, (0,) * len(ell), c, b, costs)


def _join_ops(ell, start, c, b, costs) -> list[JoinOp]:
    k = len(ell)
    if not any(ell):
        return [JoinOp("T")] + [JoinOp("Db", j, start[j]) for j in range(k) if not b[j]]
    _, (m, i) = _join(ell, c, b, costs)
    ops = [JoinOp("S", m, start[m])] + [JoinOp("F", m, start[m] + q) for q in range(i)]
    sub_ell = ell[:m] + (ell[m] - i,) + ell[m + 1:]
    sub_start = start[:m] + (start[m] + i,) + start[m + 1:]
    ops += _join_ops(sub_ell, sub_start, c - 1, b[:m] + (1,) + b[m + 1:], costs)
    rest_slots = c - sum(b[j] for j in range(k) if j != m)
    ops += _single_ops(m, start[m], i - 1, rest_slots, costs)
    if not b[m]:
        ops.append(JoinOp("Db", m, start[m]))
    return ops


@dataclass(frozen=True)
class JoinResult:
    valid: bool
    makespan: float
    peak: int
    error: str | None = None


def simulate_join(lengths: Sequence[int], ops: Sequence[JoinOp], costs: JoinCosts = JoinCosts(),
                  keep: Sequence[int] | None = None) -> JoinResult:
    """Replay ``ops``: valid when each operation's inputs are stored, the turn runs once, every
    ``x̄_0^{(j)}`` is computed and, at the end, exactly the kept ones are stored."""
    k = len(lengths)
    b = tuple(keep) if keep is not None else (0,) * k
    fwd = Counter((j, 0) for j in range(k))
    bwd: dict[int, int] = {}  # chain -> i such that x̄_i is stored
    done: set[int] = set()
    turned = False
    time, peak = 0.0, k

    def fail(n: int, why: str) -> JoinResult:
        return JoinResult(False, time, peak, f"operation {n} ({ops[n]}): {why}")

    for n, op in enumerate(ops):
        j, i = op.chain, op.pos
        if op.kind == "S":
            if fwd[(j, i)] < 1:
                return fail(n, "nothing to copy")
            fwd[(j, i)] += 1
        elif op.kind == "F":
            if fwd[(j, i)] < 1 or i >= lengths[j]:
                return fail(n, "input not stored")
            fwd[(j, i)] -= 1
            fwd[(j, i + 1)] += 1
            time += costs.uf
        elif op.kind == "T":
            if turned or any(fwd[(q, lengths[q])] < 1 for q in range(k)):
                return fail(n, "the turn needs every chain's last value, once")
            for q in range(k):
                fwd[(q, lengths[q])] -= 1
                bwd[q] = lengths[q]
            turned = True
            time += costs.ut
        elif op.kind == "Fb":
            if bwd.get(j) != i + 1 or fwd[(j, i)] < 1:
                return fail(n, "needs x_i and x̄_{i+1}")
            fwd[(j, i)] -= 1
            bwd[j] = i
            time += costs.ub
        elif op.kind == "D":
            if fwd[(j, i)] < 1:
                return fail(n, "not stored")
            fwd[(j, i)] -= 1
        elif op.kind == "Db":
            if bwd.get(j) != 0:
                return fail(n, "x̄_0 not stored")
            del bwd[j]
            done.add(j)
        else:
            return fail(n, "unknown operation")
        peak = max(peak, sum(fwd.values()) + len(bwd))
    finished = done | {j for j, i in bwd.items() if i == 0}
    if not turned or finished != set(range(k)):
        return JoinResult(False, time, peak, "end: some chain is not back-propagated")
    if {j for j in bwd} != {j for j in range(k) if b[j]} or sum(fwd.values()):
        return JoinResult(False, time, peak, "end: memory does not hold exactly the kept values")
    return JoinResult(True, time, peak)
