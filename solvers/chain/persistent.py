"""Rotor's persistent dynamic program, an engine over stages that offer menus
(Rotor paper, section 4.4, Algorithms 3-4), ``O(n^3 S)``.

A :class:`StageModel` lists, per stage, the variants of "keep for the backward" it offers:
Rotor (:mod:`hiremate.solvers.chain.rotor`) is the one-variant case and rk-Rotor
(:mod:`hiremate.solvers.chain.rk_rotor`) the many-variant one; the join solver reverses its
chains with it too. Memory is discretised into slots (:func:`discretise`); every size is
rounded *up*, so a sequence the DP accepts always fits the real budget.

The engine is vectorised with numpy over memory. For a fixed end ``t`` the "checkpoint at
``s'``" choices of every start ``s`` read the same shifted rows ``C[s', t, m - x[s'-1]]``, kept in
a per-``t`` column stack; the table row of ``s`` is a second stack; each ``(s, t)`` entry is then
one add and one ``min`` over a contiguous block, with no gathers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hiremate.errors import InfeasibleBudgetError, SolverError
from hiremate.solvers.chain.model import Chain

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
        # the tolerance for float error is relative: an absolute one would round a byte-sized
        # value to 0 slots when a slot holds more than 1e9 bytes (2**40-byte tensors)
        up = lambda a: np.ceil(np.asarray(a, dtype=float) / slot * (1 - _EPS)).clip(min=0)  # noqa
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


def prefix(fe_time: np.ndarray) -> np.ndarray:
    """``pf[k] = fe_time[1] + ... + fe_time[k]``."""
    return np.concatenate([[0.0], np.cumsum(fe_time[1:])])


def shift_row(row: np.ndarray, k: int) -> np.ndarray:
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

    def __init__(self, model: StageModel, slots: int, dtype=np.float32):
        self.model = model
        self.slots = int(slots)
        n = model.n
        S = self.slots
        self.dtype = dtype
        self.pf = prefix(model.fe_time)
        self.need = model.empty_forward_need()
        self.P = int(model.kept_after_loss)
        self.mrange = np.arange(S + 1, dtype=float)
        self.rows: list[np.ndarray] = [np.empty((0, S + 1), dtype)] * (n + 2)
        # cols[t][s'] = C[s', t, m - x[s'-1]] + pf[s'-1]: what every start s < s' reads
        self.cols: list[np.ndarray] = [np.full((t + 1, S + 1), np.inf, dtype)
                                       for t in range(n + 1)]
        self.times: list[np.ndarray] = [ft + bt for ft, bt in zip(model.ft, model.bt)]
        self._fill()

    def cost(self, s: int, t: int) -> np.ndarray:
        return self.rows[s][t - s]

    def _start_all(self, s: int) -> np.ndarray:
        """``F_all``-type starts of ``s`` for every end ``t = s..n`` at once (row ``t - s``):
        ``min_o time_o + C[s+1, t, m - keep_o]`` where option ``o``'s memory fits.
        Row ``s + 1`` is complete before row ``s`` starts, so this is one vectorised step."""
        md = self.model
        n = md.n
        S1 = self.slots + 1
        ts = np.arange(s, n + 1)
        out = np.full((len(ts), S1), np.inf, self.dtype)
        nxt = self.rows[s + 1] if s < n else np.empty((0, S1), self.dtype)
        padded = np.concatenate([np.full((len(ts) - 1, S1), np.inf, self.dtype), nxt], axis=1)
        Pt = np.where((ts == n) & (s < n), self.P, 0)
        for o in range(len(self.times[s])):
            lo = np.ceil(np.maximum(md.delta[ts] + md.fpeak[s][o],
                                    md.delta[s] + md.bpeak[s][o] + Pt) - _EPS)
            ok = self.mrange[None, :] >= lo[:, None]
            # t == s: the stage alone; t > s: then the rest with keep_o less memory
            first = np.where(ok[0], self.times[s][o], np.inf)
            np.minimum(out[0], first, out=out[0])
            if len(ts) > 1:
                k = int(min(md.keep[s][o], S1))
                vals = padded[:, S1 - k: 2 * S1 - k] + self.dtype(self.times[s][o])
                vals[~ok[1:]] = np.inf
                np.minimum(out[1:], vals, out=out[1:])
        return out

    def _fill(self) -> None:
        """Fill the table, start ``s`` from ``n`` down to 1 and end ``t`` upwards.

        Two cuts keep the ``O(n^3 S)`` part small: a checkpoint start is only evaluated on
        memories where both of its sub-chains can be finite (their first finite entries are
        tracked), and not where an ``F_all`` start already reaches the no-recomputation time.
        """
        md = self.model
        n = md.n
        S1 = self.slots + 1
        scratch = np.empty((n + 1, S1), self.dtype)
        first = np.full((n + 2, n + 2), S1, dtype=np.int64)  # first finite m of C[s, t]
        xi = md.x.astype(np.int64)
        best_time = np.array([0.0] + [float(np.min(self.times[k])) for k in range(1, n + 1)])
        for s in range(n, 0, -1):
            row = self._start_all(s)
            self.rows[s] = row
            xs = int(md.x[s - 1])
            lb = 0.0
            for t in range(s, n + 1):
                lb += best_time[t]
                best = row[t - s]
                if t > s:
                    k = t - s
                    Pt = self.P if t == n else 0
                    sps = np.arange(s + 1, t + 1)
                    starts = np.maximum(first[sps, t] + xi[sps - 1], first[s, sps - 1] + Pt)
                    lo = max(int(starts.min()),
                             int(math.ceil(md.delta[t] + self.need[s, t] - _EPS)), 0)
                    done = np.flatnonzero(best <= lb * (1 + 1e-6) + 1e-9)
                    hi = int(done[0]) if len(done) else S1
                    if lo < hi:
                        part = row[0:k, lo - Pt: hi - Pt] if lo >= Pt else \
                            shift_row(row[0:k], Pt)[:, lo:hi]
                        buf = scratch[:k, : hi - lo]
                        np.add(self.cols[t][s + 1: t + 1, lo:hi], part, out=buf)
                        ck = buf.min(axis=0)
                        ck -= self.pf[s - 1]
                        np.minimum(best[lo:hi], ck, out=best[lo:hi])
                fin = np.flatnonzero(np.isfinite(best))
                first[s, t] = int(fin[0]) if len(fin) else S1
                col = self.cols[t][s]
                if xs < S1:
                    np.add(best[: S1 - xs], self.pf[s - 1], out=col[xs:])

    def sequence(self, m: int | None = None, start: int = 1, end: int | None = None
                 ) -> list[tuple]:
        """Operations of the optimal sequence for the sub-chain ``start..end`` (default: the
        whole chain) with ``m`` slots (default: all): ``("Fck", k)``, ``("Fe", k)``,
        ``("Fall", k, o)``, ``("B", k, o)``."""
        md = self.model
        n = md.n
        m = self.slots if m is None else int(m)
        end = n if end is None else end
        if not np.isfinite(self.cost(start, end)[m]):
            raise InfeasibleBudgetError(f"no persistent sequence fits in {m} memory slots; "
                                        "raise the budget")
        out: list[tuple] = []
        stack: list[tuple] = [("solve", start, end, m)]
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
            held = self.P if t == n else 0
            for sp in range(s + 1, t + 1):
                k1, k2 = m - int(md.x[sp - 1]), m - held
                if k1 < 0 or k2 < 0:
                    continue
                val = (self.pf[sp - 1] - self.pf[s - 1]) + self.cost(sp, t)[k1] \
                    + self.cost(s, sp - 1)[k2]
                if val < best[0]:
                    best = (val, ("ck", sp))
        if not best[1] or not np.isfinite(best[0]):
            raise SolverError(f"persistent DP: no choice reaches C[{s},{t},{m}]={target} (a bug "
                              "in hiremate; please report it)")
        return best[1]


def min_memory(model: StageModel) -> tuple[float, list[tuple]]:
    """Smallest memory (beyond ``x[0]``) for which a persistent sequence exists, with exact
    sizes, and one such sequence (the same recursion as :class:`PersistentTable`, with
    ``max`` for ``+`` and ``min`` over choices). Entries of one diagonal ``t - s`` depend only
    on shorter sub-chains, so each diagonal is one vectorised step."""
    n = model.n
    P = model.kept_after_loss
    need = model.empty_forward_need()
    mm = np.full((n + 2, n + 2), np.inf)
    arg: dict[tuple[int, int], tuple] = {}
    nopt = max(len(k) for k in model.keep[1:])
    # per-stage variant arrays padded to nopt (inf where a stage has fewer variants)
    fpk = np.full((n + 2, nopt), np.inf)
    bpk = np.full((n + 2, nopt), np.inf)
    kp = np.full((n + 2, nopt), np.inf)
    for k in range(1, n + 1):
        q = len(model.keep[k])
        fpk[k, :q], bpk[k, :q], kp[k, :q] = model.fpeak[k], model.bpeak[k], model.keep[k]
    delta, x = model.delta, model.x
    for d in range(0, n):
        s = np.arange(1, n - d + 1)
        t = s + d
        Pb = np.where((t == n) & (s < n), P, 0.0)
        base = np.maximum(delta[t][:, None] + fpk[s], (delta[s] + Pb)[:, None] + bpk[s])
        if d > 0:
            base = np.maximum(base, kp[s] + mm[s + 1, t][:, None])
        o = np.argmin(base, axis=1)
        best = base[np.arange(len(s)), o]
        kind = np.zeros(len(s), dtype=int)
        choice = o.copy()
        if d > 0:
            off = np.arange(1, d + 1)
            sp = s[:, None] + off[None, :]
            vals = np.maximum(x[sp - 1] + mm[sp, t[:, None]],
                              mm[s[:, None], sp - 1] + np.where(t == n, P, 0.0)[:, None])
            i = np.argmin(vals, axis=1)
            ckv = np.maximum(vals[np.arange(len(s)), i], delta[t] + need[s, t])
            better = ckv < best
            best = np.where(better, ckv, best)
            kind = np.where(better, 1, 0)
            choice = np.where(better, sp[np.arange(len(s)), i], o)
        mm[s, t] = best
        for j in range(len(s)):
            arg[(int(s[j]), int(t[j]))] = ("ck" if kind[j] else "all", int(choice[j]))
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


def discretise(model: StageModel, avail: float, slots: int) -> tuple[StageModel, int]:
    """Sizes in slots and the slot count: ``avail / slots`` per slot, or one unit per slot
    (exact) when sizes are whole numbers and ``avail <= slots``."""
    sizes = np.concatenate([model.x, model.delta, model.fe_mem, *model.keep[1:],
                            *model.fpeak[1:], *model.bpeak[1:], [model.kept_after_loss]])
    if 1 <= avail <= slots and np.all(sizes == np.round(sizes)):
        S = int(math.floor(avail))
        return model.scaled(1.0), S
    return model.scaled(avail / slots if avail > 0 else 1.0), slots


def fitting_min_memory(model: StageModel, budget: float, base: float,
                       what: str) -> tuple[float, list[tuple]]:
    """:func:`min_memory`, checked against ``budget`` (of which ``base``, the chain input, is
    taken first): an :class:`InfeasibleBudgetError` naming the least budget when it does not
    fit. The tolerance is relative, capped below a byte, so that 2**40-byte sizes cannot let a
    byte slip."""
    exact_min, min_ops = min_memory(model)
    if budget - base < exact_min - min(1e-12 * max(1.0, abs(exact_min)), 0.25):
        low = base + exact_min
        raise InfeasibleBudgetError(f"budget {budget} is below the {what} minimum {low}; raise "
                                    "the budget", min_budget=math.ceil(low))
    return exact_min, min_ops

