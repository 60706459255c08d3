"""Rotor: optimal rematerialisation of heterogeneous chains (``papers/rotor-heterogeneous-chains.txt``).

Two dynamic programs over a :class:`~solvers.chain.Chain`:

- the optimal *persistent* sequence (section 4.4, Algorithms 3-4), ``O(n^3 S)``;
- the optimal *weakly persistent* sequence with a floating materialised activation
  (section 4.3, Algorithms 1-2), ``O(n^6 S)``, which is optimal over all valid sequences
  (Lemma 4.4) but only practical for short chains.

Memory is discretised into ``S`` slots of ``(budget - x[0]) / S`` each; every size is rounded
*up*, so a sequence the DP accepts always fits the real budget (at worst it is slightly
pessimistic). The persistent DP is written as a generic engine over stages that each have a
menu of "keep for the backward" variants (:class:`StageModel`): Rotor is the one-variant case and
rk-Rotor (:mod:`solvers.rk_rotor`) the many-variant one.

The engine is vectorised with numpy over memory. For a fixed end ``t`` the "checkpoint at
``s'``" choices of every start ``s`` read the same shifted rows ``C[s', t, m - x[s'-1]]``, kept in
a per-``t`` column stack; the table row of ``s`` is a second stack; each ``(s, t)`` entry is then
one add and one ``min`` over a contiguous block, with no gathers.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hiremate.solvers.chain import (
    B, Chain, ChainOp, ChainSolution, F_all, F_ck, F_e, solution,
)

log = logging.getLogger(__name__)

DEFAULT_SLOTS = 500
_EPS = 1e-9


# -- the stage model shared with rk-Rotor ------------------------------------------------------
@dataclass(frozen=True)
class StageModel:
    """Costs the persistent DP reads, 1-based (index 0 of per-stage arrays is unused).

    - ``x[k]``, ``delta[k]`` (``k = 0..n``): sizes of ``a^k`` and ``δ^k``;
    - ``fe_time[k]``, ``fe_mem[k]``: time of a no-save forward of stage ``k`` and the memory it
      adds while it runs (its output plus its overhead);
    - per stage ``k``, arrays over its variants ``o``: ``ft``/``bt`` (forward and backward
      times), ``keep`` (what stays from the forward to the backward, ``ā^k`` in Rotor),
      ``fpeak`` (memory the forward adds while it runs), ``bpeak`` (memory while the backward
      runs on top of what is stored apart from ``ā^k`` and ``δ^k``, its outputs included);
    - ``kept_after_loss``: bytes alive after the last stage's backward.
    """

    x: np.ndarray
    delta: np.ndarray
    fe_time: np.ndarray
    fe_mem: np.ndarray
    ft: tuple[np.ndarray, ...]
    bt: tuple[np.ndarray, ...]
    keep: tuple[np.ndarray, ...]
    fpeak: tuple[np.ndarray, ...]
    bpeak: tuple[np.ndarray, ...]
    kept_after_loss: float = 0.0

    @property
    def n(self) -> int:
        return len(self.x) - 1

    @classmethod
    def from_chain(cls, chain: Chain) -> "StageModel":
        """Rotor's model: one variant per stage (``F_all``)."""
        n = chain.n
        pad = lambda seq: np.array([0.0] + list(seq), dtype=float)  # noqa: E731
        x = np.array(chain.x, dtype=float)
        delta = np.array(chain.delta, dtype=float)
        xbar = pad(chain.xbar)
        of, ob = pad(chain.fwd_overhead), pad(chain.bwd_overhead)
        uf, ub = pad(chain.fwd_time), pad(chain.bwd_time)
        one = lambda v: np.array([v], dtype=float)  # noqa: E731
        return cls(
            x=x, delta=delta, fe_time=uf, fe_mem=np.concatenate([[0.0], x[1:] + of[1:]]),
            ft=(one(0),) + tuple(one(uf[k]) for k in range(1, n + 1)),
            bt=(one(0),) + tuple(one(ub[k]) for k in range(1, n + 1)),
            keep=(one(0),) + tuple(one(xbar[k]) for k in range(1, n + 1)),
            fpeak=(one(0),) + tuple(one(xbar[k] + of[k]) for k in range(1, n + 1)),
            bpeak=(one(0),) + tuple(one(xbar[k] + ob[k] + delta[k - 1])
                                    for k in range(1, n + 1)),
            kept_after_loss=float(chain.kept_after_loss),
        )

    def scaled(self, slot: float) -> "StageModel":
        """Sizes in slots, rounded up (times unchanged)."""
        up = lambda a: np.ceil(np.asarray(a, dtype=float) / slot - _EPS).clip(min=0)  # noqa
        return StageModel(
            x=up(self.x), delta=up(self.delta), fe_time=self.fe_time, fe_mem=up(self.fe_mem),
            ft=self.ft, bt=self.bt, keep=tuple(up(a) for a in self.keep),
            fpeak=tuple(up(a) for a in self.fpeak), bpeak=tuple(up(a) for a in self.bpeak),
            kept_after_loss=float(up(self.kept_after_loss)),
        )

    def empty_forward_need(self) -> np.ndarray:
        """``need[s, t]``: memory (beyond ``a^{s-1}`` and ``δ^t``) that no-save forwards of
        stages ``s..t-1`` need: the paper's ``m_∅^{s,t}`` without ``δ^t``."""
        n = self.n
        need = np.zeros((n + 2, n + 2))
        for s in range(1, n + 1):
            run = self.fe_mem[s]
            need[s, s] = run
            for t in range(s + 1, n + 1):
                need[s, t] = run  # forwards j = s..t-1
                run = max(run, self.x[t - 1] + self.fe_mem[t])
        return need


def _prefix(fe_time: np.ndarray) -> np.ndarray:
    """``pf[k] = fe_time[1] + ... + fe_time[k]``."""
    return np.concatenate([[0.0], np.cumsum(fe_time[1:])])


def _shift(row: np.ndarray, k: int) -> np.ndarray:
    """``out[m] = row[m - k]`` (``inf`` where ``m < k``), along the last axis."""
    k = int(k)
    if k <= 0:
        return row
    out = np.full_like(row, np.inf)
    if k < row.shape[-1]:
        out[..., k:] = row[..., : row.shape[-1] - k]
    return out


# -- persistent DP engine ----------------------------------------------------------------------
class PersistentTable:
    """Optimal persistent sequences of a :class:`StageModel` whose sizes are in slots.

    ``cost(s, t)[m]`` is the optimal makespan of the sub-chain ``s..t`` (backward steps
    ``B(t)..B(s)``) from ``a^{s-1}`` and ``δ^t`` with ``m`` slots besides ``a^{s-1}``
    (and besides ``kept_after_loss`` when ``t < n``: sub-chains that end before the last stage
    run after the turn, and their callers account for it).
    """

    def __init__(self, model: StageModel, slots: int):
        self.model = model
        self.slots = int(slots)
        n = model.n
        S = self.slots
        self.pf = _prefix(model.fe_time)
        self.need = model.empty_forward_need()
        self.P = int(model.kept_after_loss)
        self.mrange = np.arange(S + 1, dtype=float)
        self.rows: list[np.ndarray] = [np.empty((0, S + 1))] * (n + 2)
        self.cols: list[np.ndarray] = [np.full((t + 1, S + 1), np.inf) for t in range(n + 1)]
        self.times: list[np.ndarray] = [ft + bt for ft, bt in zip(model.ft, model.bt)]
        self._fill()

    def cost(self, s: int, t: int) -> np.ndarray:
        return self.rows[s][t - s]

    def _option_values(self, s: int, t: int, nxt: np.ndarray | None) -> np.ndarray:
        """Best ``F_all``-type start at ``s`` for every ``m`` (``inf`` where impossible)."""
        md = self.model
        thr = np.maximum(md.delta[t] + md.fpeak[s],
                         md.delta[s] + md.bpeak[s] + (self.P if (t == md.n and s < md.n) else 0))
        times = self.times[s]
        if nxt is None:
            vals = np.broadcast_to(times[:, None], (len(times), self.slots + 1))
        else:
            vals = np.stack([_shift(nxt, k) for k in md.keep[s]]) + times[:, None]
        vals = np.where(self.mrange[None, :] >= thr[:, None], vals, np.inf)
        return vals.min(axis=0)

    def _fill(self) -> None:
        md = self.model
        n = md.n
        S = self.slots
        for s in range(n, 0, -1):
            row = np.full((n - s + 1, S + 1), np.inf)
            self.rows[s] = row
            for t in range(s, n + 1):
                nxt = self.rows[s + 1][t - s - 1] if t > s else None
                best = self._option_values(s, t, nxt)
                if t > s:
                    part = row[0: t - s]
                    if t == n and self.P:
                        part = _shift(part, self.P)
                    ck = (self.cols[t][s + 1: t + 1] + part).min(axis=0) - self.pf[s - 1]
                    ck[self.mrange < md.delta[t] + self.need[s, t]] = np.inf
                    best = np.minimum(best, ck)
                row[t - s] = best
                self.cols[t][s] = _shift(best, md.x[s - 1]) + self.pf[s - 1]

    def sequence(self, m: int | None = None) -> list[tuple]:
        """Operations of the optimal sequence for the whole chain with ``m`` slots (default:
        all): ``("Fck", k)``, ``("Fe", k)``, ``("Fall", k, o)``, ``("B", k, o)``."""
        md = self.model
        n = md.n
        m = self.slots if m is None else int(m)
        if not np.isfinite(self.cost(1, n)[m]):
            raise ValueError("no persistent sequence fits in this memory")
        out: list[tuple] = []
        stack: list[tuple] = [("solve", 1, n, m)]
        while stack:
            item = stack.pop()
            if item[0] != "solve":
                out.append(item)
                continue
            _, s, t, m = item
            target = self.cost(s, t)[m]
            choice = self._choose(s, t, m, target)
            if choice[0] == "all":
                o = choice[1]
                todo = [("Fall", s, o)]
                if t > s:
                    todo.append(("solve", s + 1, t, m - int(md.keep[s][o])))
                todo.append(("B", s, o))
            else:
                sp = choice[1]
                todo = [("Fck", s)] + [("Fe", j) for j in range(s + 1, sp)]
                todo.append(("solve", sp, t, m - int(md.x[sp - 1])))
                todo.append(("solve", s, sp - 1, m - (self.P if t == n else 0)))
            stack.extend(reversed(todo))
        return out

    def _choose(self, s: int, t: int, m: int, target: float) -> tuple:
        md = self.model
        n = md.n
        best: tuple[float, tuple] = (math.inf, ())
        P = self.P if (t == n and s < n) else 0
        for o in range(len(md.keep[s])):
            if m < md.delta[t] + md.fpeak[s][o] or m < md.delta[s] + md.bpeak[s][o] + P:
                continue
            val = self.times[s][o]
            if t > s:
                k = m - int(md.keep[s][o])
                val = val + (self.cost(s + 1, t)[k] if k >= 0 else math.inf)
            if val < best[0]:
                best = (val, ("all", o))
        if t > s and m >= md.delta[t] + self.need[s, t]:
            shift = self.P if t == n else 0
            for sp in range(s + 1, t + 1):
                k1, k2 = m - int(md.x[sp - 1]), m - shift
                if k1 < 0 or k2 < 0:
                    continue
                val = (self.pf[sp - 1] - self.pf[s - 1]) + self.cost(sp, t)[k1] \
                    + self.cost(s, sp - 1)[k2]
                if val < best[0]:
                    best = (val, ("ck", sp))
        if not best[1] or not np.isfinite(best[0]):
            raise AssertionError(f"persistent DP: no choice reaches C[{s},{t},{m}]={target}")
        return best[1]


def min_memory(model: StageModel) -> tuple[float, list[tuple]]:
    """Smallest memory (beyond ``x[0]``) for which a persistent sequence exists, with exact
    sizes, and one such sequence (the same recursion as :class:`PersistentTable`, with
    ``max`` for ``+`` and ``min`` over choices)."""
    n = model.n
    P = model.kept_after_loss
    need = model.empty_forward_need()
    mm = np.full((n + 2, n + 2), np.inf)
    arg: dict[tuple[int, int], tuple] = {}
    for s in range(n, 0, -1):
        for t in range(s, n + 1):
            Pb = P if (t == n and s < n) else 0.0
            base = np.maximum(model.delta[t] + model.fpeak[s], model.delta[s] + model.bpeak[s] + Pb)
            if t > s:
                base = np.maximum(base, model.keep[s] + mm[s + 1, t])
            o = int(np.argmin(base))
            best, choice = float(base[o]), ("all", o)
            if t > s:
                sps = np.arange(s + 1, t + 1)
                vals = np.maximum(model.x[sps - 1] + mm[sps, t],
                                  mm[s, sps - 1] + (P if t == n else 0.0))
                i = int(np.argmin(vals))
                val = max(float(vals[i]), model.delta[t] + need[s, t])
                if val < best:
                    best, choice = val, ("ck", int(sps[i]))
            mm[s, t] = best
            arg[(s, t)] = choice
    ops: list[tuple] = []
    stack: list[tuple] = [("solve", 1, n)]
    while stack:
        item = stack.pop()
        if item[0] != "solve":
            ops.append(item)
            continue
        _, s, t = item
        kind, v = arg[(s, t)]
        if kind == "all":
            todo = [("Fall", s, v)] + ([("solve", s + 1, t)] if t > s else []) + [("B", s, v)]
        else:
            todo = [("Fck", s)] + [("Fe", j) for j in range(s + 1, v)]
            todo += [("solve", v, t), ("solve", s, v - 1)]
        stack.extend(reversed(todo))
    return float(mm[1, n]), ops


def _to_chain_ops(seq: Sequence[tuple]) -> list[ChainOp]:
    conv = {"Fck": F_ck, "Fe": F_e, "Fall": F_all, "B": B}
    return [conv[item[0]](item[1]) for item in seq]


def _slot_size(avail: float, slots: int) -> float:
    return avail / slots if avail > 0 else 1.0


# -- chain-level entry points ------------------------------------------------------------------
def persistent_min_budget(chain: Chain) -> float:
    """Smallest budget (``x[0]`` included) for which a persistent sequence exists."""
    return chain.x[0] + min_memory(StageModel.from_chain(chain))[0]


def solve_persistent(chain: Chain, budget: float, slots: int = DEFAULT_SLOTS) -> ChainSolution:
    """Optimal persistent sequence (Algorithms 3-4) within ``budget`` (chain units, ``x[0]``
    included). Raises ``ValueError`` when no persistent sequence fits."""
    model = StageModel.from_chain(chain)
    avail = budget - chain.x[0]
    exact_min, min_ops = min_memory(model)
    if avail < exact_min - 1e-12 * max(1.0, abs(exact_min)):
        raise ValueError(f"budget {budget} is below the persistent minimum "
                         f"{chain.x[0] + exact_min}")
    table = PersistentTable(model.scaled(_slot_size(avail, slots)), slots)
    if np.isfinite(table.cost(1, chain.n)[slots]):
        return solution(chain, _to_chain_ops(table.sequence()), budget)
    log.info("rotor: budget within %d slots of the minimum; using the minimum-memory sequence",
             slots)
    return solution(chain, _to_chain_ops(min_ops), budget)


# -- weakly persistent DP (Algorithms 1-2) -----------------------------------------------------
class WeakTable:
    """``C_FL(s, t, l, m)`` of Theorem 4.7 for a one-variant :class:`StageModel` in slots.

    From ``a^{s-1}`` (not counted; it may be freed unless ``t == s``) and ``δ^l``, run
    ``B(l)..B(t)`` and end with only ``δ^{t-1}``. Three ways to start:

    - ``F_all(s)`` (only when ``t == s``: ``ā^s`` stays until ``B(s)``, Lemma 4.6);
    - ``F_ck(s) F_e(s+1..s'-1)``: a checkpoint ``a^{s'-1}`` that serves ``B(l)..B(t')``, then the
      rest from ``a^{s-1}`` with ``δ^{t'-1}`` (the paper's ``C_ck`` with ``r = s``);
    - ``F_e(s..r-1)``: the floating activation moves from ``a^{s-1}`` to ``a^{r-1}``
      (``r <= t``), then ``C_FL(r, t, l)``.

    The last case replaces the paper's ``C_ck`` with ``r > s``, which moves the floating
    activation only while taking a new checkpoint; that misses sequences that move it just
    before the last backward steps of a sub-chain (found by the exhaustive search in the
    tests). Forward-memory conditions are checked per choice, with the floating activation
    where it is while each forward runs.
    """

    def __init__(self, model: StageModel, slots: int):
        self.md = model
        self.S = int(slots)
        self.pf = _prefix(model.fe_time)
        self.need = model.empty_forward_need()
        self.P = int(model.kept_after_loss)
        self.mrange = np.arange(self.S + 1, dtype=float)
        self.table: dict[tuple[int, int, int], np.ndarray] = {}
        n = model.n
        if n > 40:
            log.warning("weakly persistent DP on %d stages: O(n^5 S) work, expect a long run", n)
        for ell in range(1, n + 1):
            for s in range(ell, 0, -1):
                for t in range(s, ell + 1):
                    self.table[(s, t, ell)] = self._entry(s, t, ell)

    def get(self, s: int, t: int, ell: int) -> np.ndarray:
        return self.table[(s, t, ell)]

    def _get_shift(self, s: int, t: int, ell: int, k: int) -> np.ndarray:
        """``C_FL(s, t, l, m - k)`` for every ``m`` (``k`` may be negative)."""
        row = self.get(s, t, ell)
        k = int(k)
        if k >= 0:
            return _shift(row, k)
        out = np.full_like(row, np.inf)
        out[: len(row) + k] = row[-k:]
        return out

    def _all_choice(self, s: int, t: int, ell: int):
        md = self.md
        if s != t:
            return None
        P = self.P if (ell == self.md.n and s < self.md.n) else 0
        thr = max(md.delta[ell] + md.fpeak[s][0], md.delta[s] + md.bpeak[s][0] + P)
        return thr, md.ft[s][0] + md.bt[s][0], int(md.keep[s][0])

    def _ck_choices(self, s: int, t: int, ell: int):
        """``(s', t', threshold, time, shift1, shift2)`` of the checkpoint choices."""
        if t >= ell:
            return
        md = self.md
        shift2 = self.P if ell == md.n else 0
        for sp in range(s + 1, ell + 1):
            thr = md.delta[ell] + self.need[s, sp]
            tconst = self.pf[sp - 1] - self.pf[s - 1]
            for tp in range(max(sp, t + 1), ell + 1):
                yield sp, tp, thr, tconst, int(md.x[sp - 1]), shift2

    def _move_choices(self, s: int, t: int, ell: int):
        """``(r, threshold, time, shift)`` of the moves of the floating activation."""
        if s == 1 or t == s:
            return
        md = self.md
        x, fe = md.x, md.fe_mem
        thr = md.delta[ell] + fe[s]
        for r in range(s + 1, t + 1):
            if r > s + 1:
                thr = max(thr, md.delta[ell] + x[r - 2] + fe[r - 1] - x[s - 1])
            yield r, thr, self.pf[r - 1] - self.pf[s - 1], int(x[r - 1] - x[s - 1])

    def _entry(self, s: int, t: int, ell: int) -> np.ndarray:
        mr = self.mrange
        best = np.full(self.S + 1, np.inf)
        if s == 1 and t > 1:
            return best  # a^0 is never freed: unreachable
        choice = self._all_choice(s, t, ell)
        if choice is not None:
            thr, time, keep = choice
            val = np.full(self.S + 1, time)
            if ell > s:
                val = val + _shift(self.get(s + 1, s + 1, ell), keep)
            best = np.where(mr >= thr, val, np.inf)
        for sp, tp, thr, tconst, k1, k2 in self._ck_choices(s, t, ell):
            val = tconst + _shift(self.get(sp, tp, ell), k1) + _shift(self.get(s, t, tp - 1), k2)
            best = np.minimum(best, np.where(mr >= thr, val, np.inf))
        for r, thr, tconst, k in self._move_choices(s, t, ell):
            val = tconst + self._get_shift(r, t, ell, k)
            best = np.minimum(best, np.where(mr >= thr, val, np.inf))
        return best

    def sequence(self) -> list[tuple]:
        n = self.md.n
        if not np.isfinite(self.get(1, 1, n)[self.S]):
            raise ValueError("no sequence fits in this memory")
        out: list[tuple] = []
        stack: list[tuple] = [("solve", 1, 1, n, self.S)]
        while stack:
            item = stack.pop()
            if item[0] != "solve":
                out.append(item)
                continue
            _, s, t, ell, m = item
            stack.extend(reversed(self._choose(s, t, ell, m)))
        return out

    def _choose(self, s: int, t: int, ell: int, m: int) -> list[tuple]:
        at = lambda arr, k: arr[k] if 0 <= k < len(arr) else math.inf  # noqa: E731
        best: tuple[float, list[tuple]] = (math.inf, [])
        choice = self._all_choice(s, t, ell)
        if choice is not None and m >= choice[0]:
            _, val, keep = choice
            todo = [("Fall", s, 0)]
            if ell > s:
                val += at(self.get(s + 1, s + 1, ell), m - keep)
                todo.append(("solve", s + 1, s + 1, ell, m - keep))
            best = (val, todo + [("B", s, 0)])
        for sp, tp, thr, tconst, k1, k2 in self._ck_choices(s, t, ell):
            if m < thr:
                continue
            val = tconst + at(self.get(sp, tp, ell), m - k1) + at(self.get(s, t, tp - 1), m - k2)
            if val < best[0]:
                fwd = [("Fck", s)] + [("Fe", j) for j in range(s + 1, sp)]
                best = (val, fwd + [("solve", sp, tp, ell, m - k1), ("solve", s, t, tp - 1, m - k2)])
        for r, thr, tconst, k in self._move_choices(s, t, ell):
            if m < thr:
                continue
            val = tconst + at(self.get(r, t, ell), m - k)
            if val < best[0]:
                best = (val, [("Fe", j) for j in range(s, r)] + [("solve", r, t, ell, m - k)])
        if not best[1] or not np.isfinite(best[0]):
            raise AssertionError(f"weak DP: no choice reaches C_FL[{s},{t},{ell},{m}]")
        return best[1]


def solve_weak(chain: Chain, budget: float, slots: int = DEFAULT_SLOTS) -> ChainSolution:
    """Optimal (weakly persistent) sequence, Algorithms 1-2, within ``budget``. Falls back to
    the persistent minimum-memory sequence when discretisation makes a budget right at the
    minimum look infeasible. Raises ``ValueError`` when nothing fits."""
    model = StageModel.from_chain(chain)
    avail = budget - chain.x[0]
    if avail >= 0:
        table = WeakTable(model.scaled(_slot_size(avail, slots)), slots)
        if np.isfinite(table.get(1, 1, chain.n)[slots]):
            return solution(chain, _to_chain_ops(table.sequence()), budget)
    exact_min, min_ops = min_memory(model)
    if avail >= exact_min - 1e-12 * max(1.0, abs(exact_min)):
        return solution(chain, _to_chain_ops(min_ops), budget)
    raise ValueError(f"budget {budget} is below the minimum {chain.x[0] + exact_min}")
