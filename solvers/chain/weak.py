"""Rotor's weakly persistent dynamic program (Rotor paper,
section 4.3, Algorithms 1-2): optimal over all valid sequences (Lemma 4.4), with a floating
materialised activation, ``O(n^6 S)`` and so only practical for short chains.
:func:`hiremate.solvers.chain.rotor.solve_weak` runs it.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from hiremate.errors import InfeasibleBudgetError, SolverError
from hiremate.solvers.chain.persistent import StageModel, prefix, shift_row

log = logging.getLogger(__name__)

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
        self.pf = prefix(model.fe_time)
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
            return shift_row(row, k)
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
                val = val + shift_row(self.get(s + 1, s + 1, ell), keep)
            best = np.where(mr >= thr, val, np.inf)
        for sp, tp, thr, tconst, k1, k2 in self._ck_choices(s, t, ell):
            val = (tconst + shift_row(self.get(sp, tp, ell), k1)
                   + shift_row(self.get(s, t, tp - 1), k2))
            best = np.minimum(best, np.where(mr >= thr, val, np.inf))
        for r, thr, tconst, k in self._move_choices(s, t, ell):
            val = tconst + self._get_shift(r, t, ell, k)
            best = np.minimum(best, np.where(mr >= thr, val, np.inf))
        return best

    def sequence(self) -> list[tuple]:
        n = self.md.n
        if not np.isfinite(self.get(1, 1, n)[self.S]):
            raise InfeasibleBudgetError(f"no sequence fits in {self.S} memory slots; raise "
                                        "the budget")
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
            raise SolverError(f"weak DP: no choice reaches C_FL[{s},{t},{ell},{m}] (a bug in "
                              "hiremate; please report it)")
        return best[1]
