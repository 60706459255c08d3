"""Graph-level join solver: several chains that meet at the loss (Siamese, cross-modal networks).

The join-networks paper solves the *homogeneous* join (unit sizes and times,
:mod:`solvers.join_dp`). A real graph has a size, a time and an overhead per stage, so this module
generalises its canonical form (Definition 8, Theorem 3) to heterogeneous chains with Rotor's
conventions (:mod:`solvers.chain`): stage ``k`` of chain ``j`` is forward node ``f_{j,k}``,
producing ``a_j^k``, and its backward partner ``b_{j,k}``, which reads ``δ_j^k``, ``a_j^k`` and
``a_j^{k-1}`` and produces ``δ_j^{k-1}``. The last activation of every chain is a model output:
once computed it stays (the caller owns it). The loss is the *turn*: it reads every chain's
output and produces every ``δ_j^{n_j}``.

A sub-problem ``J(s, f)[m]``: chain ``j`` holds its start value ``a_j^{s_j-1}`` (``s_j = n_j + 1``:
the chain has reached its output), and at the end must hold ``δ_j^{s_j-1}`` for every ``j``;
``f_j`` says the start value is kept for the caller (it is the caller's ``ā``), otherwise
``B(s_j)`` frees it. ``m`` is the memory of the sub-problem, start values included (so a value
freed by one chain serves the others, as the paper's ``c - Σ b_j``). Choices, for the chain ``q``
whose backward finishes last:

- *checkpoint* ``s'``: ``F(s_q)`` keeping its input, no-save forwards up to ``a_q^{s'-1}``, the
  sub-join from there (``m`` less the start value held), then chain ``q``'s stages
  ``s_q..s'-1`` reversed alone, with what the other chains keep subtracted: Rotor's persistent
  table (:class:`~solvers.rotor.PersistentTable`) on that chain — the paper's ``Opt_0`` term;
- *keep* (Rotor's ``F_all``): ``F(s_q)``, the sub-join from ``a_q^{s_q}`` with ``f_q`` set, then
  ``B(s_q)``: needed here because the backward reads its own output (the paper's does not).

The base case is the turn. Memory is discretised as in Rotor: every size is rounded *up* to
slots, so an accepted schedule always fits the real budget. :meth:`JoinDP.min_budget` is the exact
minimum over the same canonical family (the recursion with ``max`` for ``+``); at budgets too
close to it for the rounding, the minimum-memory schedule is returned.

Not covered: chains that meet in a forward op before the loss (the paper's turn is the loss) and
chains that share an intermediate activation; :meth:`JoinDP.applicable` is ``False`` for them.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import numpy as np

from hiremate.errors import SolverError
from hiremate.solvers.chain.join_graph import JoinGraph, graph_join
from hiremate.solvers.chain.persistent import (
    DEFAULT_SLOTS, PersistentTable, StageModel, shift_row,
)
from hiremate.ir.simulator import autodiff_schedule, simulate

log = logging.getLogger(__name__)

_EPS = 1e-9


# -- the dynamic program -----------------------------------------------------------------------
class _Sizes:
    """Per-chain sizes in a common unit (slots, or exact bytes for the minimum-memory pass)."""

    def __init__(self, jg: JoinGraph, unit: Callable[[float], float]):
        self.x = [[unit(v) for v in c.x] for c in jg.chains]
        self.delta = [[unit(v) for v in c.delta] for c in jg.chains]
        self.of = [[unit(v) for v in c.of] for c in jg.chains]
        self.ob = [[unit(v) for v in c.ob] for c in jg.chains]
        self.P = [self.x[j][c.n] for j, c in enumerate(jg.chains)]
        self.turn = sum(self.P) + unit(jg.loss_need)


class JoinTable:
    """``J(s, f)`` over memories ``0..S`` (slots) for a join graph; see the module docstring."""

    def __init__(self, jg: JoinGraph, slot: float, slots: int):
        self.jg = jg
        self.S = int(slots)
        up = lambda v: float(math.ceil(v / slot * (1 - _EPS))) if v > 0 else 0.0  # noqa: E731
        self.sz = _Sizes(jg, up)
        self.mr = np.arange(self.S + 1, dtype=float)
        self.rev = []
        for c in jg.chains:
            model = StageModel.from_chain(c.reversal_chain()).scaled(slot)
            self.rev.append(PersistentTable(model, self.S, dtype=np.float64))
        self.memo: dict[tuple, np.ndarray] = {}

    def start(self) -> tuple[tuple[int, ...], tuple[bool, ...]]:
        k = len(self.jg.chains)
        return (1,) * k, (False,) * k

    def value(self, m: int | None = None) -> float:
        s, f = self.start()
        return float(self.get(s, f)[self.S if m is None else m])

    def get(self, s: tuple[int, ...], f: tuple[bool, ...]) -> np.ndarray:
        key = (s, f)
        if key not in self.memo:
            best = np.full(self.S + 1, np.inf)
            for _, need, time, _ in _choices(self.jg, self.sz, s, f, self):
                np.minimum(best, np.where(self.mr >= need - _EPS, time, np.inf), out=best)
            self.memo[key] = best
        return self.memo[key]


def _end_mem(jg: JoinGraph, sz: _Sizes, s, f) -> float:
    """What a sub-join leaves: every ``δ^{s_j-1}``, every output, the kept start values."""
    out = sum(sz.P)
    for j, c in enumerate(jg.chains):
        out += sz.delta[j][s[j] - 1]
        if f[j] and 2 <= s[j] <= c.n:
            out += sz.x[j][s[j] - 1]
    return out


def _choices(jg: JoinGraph, sz: _Sizes, s, f, table: "JoinTable | None"):
    """Yield ``(choice, memory need, time, sub-problems)`` of ``J(s, f)``.

    With a table, ``time`` is a vector over memories (``need`` a scalar threshold); without, the
    sizes are exact, ``time`` is ``None`` and ``need`` is the minimum memory of the choice
    (the sub-problems' minima are read from ``_min_memo``-style callers through ``table=None``
    by :func:`_min_need`)."""
    chains = jg.chains
    k = len(chains)
    if all(s[j] == chains[j].n + 1 for j in range(k)):
        need = sz.turn
        yield ("turn",), need, (np.full(table.S + 1, jg.loss_time) if table else None), ()
        return
    B0 = sum(sz.x[j][s[j] - 1] for j in range(k))
    # random nodes first run in the graph's order (the simulator's rule): chain q may run its
    # stages for the first time only up to a random node later than the next random node of
    # another chain (one chain always has the earliest, so some choice stays)
    nxt = [c.next_random[s[j]] for j, c in enumerate(chains)]
    for q, c in enumerate(chains):
        sq = s[q]
        if sq > c.n:
            continue
        bound = min((nxt[j] for j in range(k) if j != q), default=math.inf)
        if c.next_random[sq] == c.fwd[sq] and c.fwd[sq] > bound:
            continue  # stage s_q itself is random and comes after another chain's
        x, d, of, ob = sz.x[q], sz.delta[q], sz.of[q], sz.ob[q]
        Xq = x[sq - 1]
        # keep: F(s_q), sub-join with a^{s_q} kept, B(s_q)
        s2 = s[:q] + (sq + 1,) + s[q + 1:]
        f2 = f[:q] + (True,) + f[q + 1:]
        E = _end_mem(jg, sz, s2, f2)
        need = max(B0 + x[sq] + of[sq], Xq + E + d[sq - 1] + ob[sq])
        time = None
        if table is not None:
            time = c.ft[sq] + c.bt[sq] + shift_row(table.get(s2, f2), Xq)
        yield ("keep", q), need, time, ((s2, f2, Xq),)
        # checkpoint a^{s'-1}
        fneed = x[sq] + of[sq]
        ftime = 0.0
        for sp in range(sq + 1, c.n + 2):
            if sp > sq + 1:
                kk = sp - 1
                if c.next_random[kk] == c.fwd[kk] and c.fwd[kk] > bound:
                    break  # this forward run would draw out of order
                fneed = max(fneed, x[kk - 1] + x[kk] + of[kk])
            ftime += c.ft[sp - 1]
            s2 = s[:q] + (sp,) + s[q + 1:]
            f2 = f[:q] + (False,) + f[q + 1:]
            off = Xq + _end_mem(jg, sz, s2, f2) - d[sp - 1]
            need = B0 + fneed
            time = None
            if table is not None:
                rev = table.rev[q].cost(sq, sp - 1)
                time = ftime + shift_row(table.get(s2, f2), Xq) + shift_row(rev, off)
            yield ("ck", q, sp, off), need, time, ((s2, f2, Xq), ("rev", q, sq, sp - 1, off))


# -- exact minimum memory (the same recursion with max for + and min over choices) -------------
class _MinMemory:
    def __init__(self, jg: JoinGraph):
        self.jg = jg
        self.sz = _Sizes(jg, float)
        self.memo: dict[tuple, tuple[float, tuple]] = {}
        self.rmin: list[dict] = []
        for c in jg.chains:
            self.rmin.append(_rotor_min_table(StageModel.from_chain(c.reversal_chain()), c.n))

    def get(self, s, f) -> tuple[float, tuple]:
        key = (s, f)
        if key not in self.memo:
            best: tuple[float, tuple] = (math.inf, ())
            for choice, need, _, subs in _choices(self.jg, self.sz, s, f, None):
                val = need
                for sub in subs:
                    if sub[0] == "rev":
                        _, q, a, b, off = sub
                        val = max(val, off + self.rmin[q][(a, b)][0])
                    else:
                        s2, f2, shift = sub
                        val = max(val, shift + self.get(s2, f2)[0])
                if val < best[0]:
                    best = (val, choice)
            self.memo[key] = best
        return self.memo[key]


def _rotor_min_table(md: StageModel, n: int) -> dict:
    """Exact minimum memory (besides ``a^{s-1}``) of Rotor's persistent recursion for every
    sub-chain ``s..t`` with ``t <= n`` (no loss stage involved), with the argmin."""
    need = md.empty_forward_need()
    out: dict[tuple[int, int], tuple[float, tuple]] = {}
    for d in range(n):
        for s in range(1, n - d + 1):
            t = s + d
            val = max(md.delta[t] + md.fpeak[s][0], md.delta[s] + md.bpeak[s][0])
            if t > s:
                val = max(val, md.keep[s][0] + out[(s + 1, t)][0])
            best = (float(val), ("all",))
            for sp in range(s + 1, t + 1):
                v = max(md.delta[t] + need[s, t], md.x[sp - 1] + out[(sp, t)][0],
                        out[(s, sp - 1)][0])
                if v < best[0]:
                    best = (float(v), ("ck", sp))
            out[(s, t)] = best
    return out


def _rotor_min_ops(tab: dict, s: int, t: int) -> list[tuple]:
    _, choice = tab[(s, t)]
    if choice[0] == "all":
        return [("Fall", s, 0)] + (_rotor_min_ops(tab, s + 1, t) if t > s else []) + [("B", s, 0)]
    sp = choice[1]
    return ([("Fck", s)] + [("Fe", j) for j in range(s + 1, sp)] + _rotor_min_ops(tab, sp, t)
            + _rotor_min_ops(tab, s, sp - 1))


# -- schedules ---------------------------------------------------------------------------------
class _Emitter:
    """Turn the choices of a solved join into graph steps (computes and deletions)."""

    def __init__(self, jg: JoinGraph):
        from hiremate.ir.schedule import Compute, Delete

        self.jg = jg
        self.C, self.D = Compute, Delete
        self.steps: list = []

    def drop(self, ids) -> None:
        self.steps.extend(self.D(d) for d in ids if d is not None and d not in self.jg.protected)

    def turn(self) -> None:
        self.steps.append(self.C(self.jg.loss))

    def forward(self, q: int, sq: int, sp: int) -> None:
        """``F(s_q)`` keeping its input, then no-save forwards up to ``a^{sp-1}``."""
        c = self.jg.chains[q]
        self.steps.append(self.C(c.fwd[sq]))
        for k in range(sq + 1, sp):
            self.steps.append(self.C(c.fwd[k]))
            self.drop([c.act[k - 1]])

    def backward(self, q: int, k: int, free_input: bool) -> None:
        c = self.jg.chains[q]
        self.steps.append(self.C(c.bwd[k]))
        self.drop(c.grad[k])
        if k < c.n:
            self.drop([c.act[k]])
        if free_input and k > 1:
            self.drop([c.act[k - 1]])

    def reversal(self, q: int, s: int, ops: list[tuple], keep_start: bool) -> None:
        """Rotor operations on chain ``q`` (the last stage's ``F_all`` is a no-op: its output,
        a model output, is still there)."""
        c = self.jg.chains[q]
        plain = {s - 1}
        for op in ops:
            kind, k = op[0], op[1]
            if kind in ("Fck", "Fe"):
                self.steps.append(self.C(c.fwd[k]))
                plain.add(k)
                if kind == "Fe" and k - 1 in plain:
                    plain.discard(k - 1)
                    self.drop([c.act[k - 1]])
            elif kind == "Fall":
                if k < c.n:
                    self.steps.append(self.C(c.fwd[k]))
            else:
                free = k - 1 in plain and not (k - 1 == s - 1 and keep_start)
                plain.discard(k - 1)
                self.backward(q, k, free)

    def tail(self) -> None:
        if self.jg.tail:
            self.steps.extend(self.C(t) for t in self.jg.tail)
            for c in self.jg.chains:
                self.drop(c.grad[0])


def _emit_table(em: _Emitter, table: JoinTable, s, f, m: int) -> None:
    target = table.get(s, f)[m]
    for choice, need, time, subs in _choices(table.jg, table.sz, s, f, table):
        if m < need - _EPS or not time[m] <= target * (1 + 1e-12) + 1e-12:
            continue
        _emit_choice(em, choice, s, f, subs,
                     lambda s2, f2, sh: _emit_table(em, table, s2, f2, m - int(sh)),
                     lambda q, a, b, off: table.rev[q].sequence(m - int(off), a, b))
        return
    raise SolverError(f"join DP: no choice reaches J[{s},{f}][{m}] = {target} (a bug in "
                      "hiremate; please report it)")


def _emit_min(em: _Emitter, mm: _MinMemory, s, f) -> None:
    _, best = mm.get(s, f)
    for choice, _, _, subs in _choices(mm.jg, mm.sz, s, f, None):
        if choice == best:
            _emit_choice(em, choice, s, f, subs, lambda s2, f2, sh: _emit_min(em, mm, s2, f2),
                         lambda q, a, b, off: _rotor_min_ops(mm.rmin[q], a, b))
            return
    raise SolverError("join minimum-memory pass: lost its choice (a bug in hiremate; please "
                      "report it)")


def _emit_choice(em: _Emitter, choice, s, f, subs, sub_join, rev_ops) -> None:
    if choice[0] == "turn":
        em.turn()
        return
    q = choice[1]
    sq = s[q]
    if choice[0] == "keep":
        em.forward(q, sq, sq + 1)
        sub_join(*subs[0])
        em.backward(q, sq, free_input=not f[q])
        return
    sp = choice[2]
    em.forward(q, sq, sp)
    sub_join(*subs[0])
    _, _, a, b, off = subs[1]
    em.reversal(q, a, rev_ops(q, a, b, off), keep_start=f[q])


# -- the solver --------------------------------------------------------------------------------
class JoinDP:
    """Optimal-in-its-family schedules of join graphs (several chains joining at the loss):
    the heterogeneous generalisation of the join-networks paper's dynamic program, with
    Rotor's persistent table for each chain's reversal and memory in ``slots`` slots."""

    name = "join"

    def __init__(self, slots: int = DEFAULT_SLOTS):
        self.slots = int(slots)
        self.last_makespan: float | None = None

    def applicable(self, graph) -> bool:
        return graph_join(graph)[0] is not None

    def min_budget(self, graph) -> int:
        """Smallest budget (bytes) this solver can schedule ``graph`` in."""
        jg = self._structure(graph)
        return self._min(jg)[0]

    def schedule(self, graph, budget: int):
        """A schedule whose simulated peak is at most ``budget`` bytes; ``last_makespan`` is
        the DP's predicted time (the simulator's time of the returned schedule)."""
        from hiremate.errors import InfeasibleBudgetError
        from hiremate.units import fmt_bytes

        jg = self._structure(graph)
        need, mm = self._min(jg)
        if budget < need:
            raise InfeasibleBudgetError(
                f"{self.name}: budget {fmt_bytes(budget)} is below the {fmt_bytes(need)} this "
                f"join of {len(jg.chains)} chains needs; raise the budget or use a solver that "
                "recomputes more", min_budget=need)
        # enough memory to keep everything: nothing to recompute (the DP's slots round sizes
        # up, so at exactly the autodiff peak it would recompute what it need not)
        store_all = autodiff_schedule(graph)
        sim_all = simulate(graph, store_all)
        if sim_all.valid and sim_all.peak <= budget:
            self.last_makespan = sim_all.time
            return store_all
        em = _Emitter(jg)
        table = self.table(jg, budget)
        if table is not None and math.isfinite(table.value()):
            _emit_table(em, table, *table.start(), table.S)
            self.last_makespan = table.value() + jg.tail_time
        else:
            log.info("join: budget %s within the slot rounding of the minimum; using the "
                     "minimum-memory schedule", budget)
            _emit_min(em, mm, *mm_start(jg))
            self.last_makespan = None
        em.tail()
        steps = tuple(em.steps)
        sim = simulate(graph, steps)
        if not sim.valid or sim.peak > budget:
            # slot rounding can hide a byte with huge tensors: the simulator is the truth, and
            # the minimum-memory schedule always fits a budget of at least ``need``
            log.info("join: DP schedule peaks at %s over the budget %s; using the "
                     "minimum-memory schedule", sim.peak, budget)
            em = _Emitter(jg)
            _emit_min(em, mm, *mm_start(jg))
            em.tail()
            steps = tuple(em.steps)
            self.last_makespan = None
        return steps

    def table(self, jg: JoinGraph, budget: int) -> JoinTable | None:
        """The DP table for ``budget`` bytes (exact one-byte slots when the budget is at most
        ``slots`` bytes)."""
        if budget <= 0:
            return None
        if budget <= self.slots:
            return JoinTable(jg, 1.0, int(budget))
        return JoinTable(jg, budget / self.slots, self.slots)

    def _min(self, jg: JoinGraph) -> tuple[int, _MinMemory]:
        mm = _MinMemory(jg)
        val = mm.get(*mm_start(jg))[0]
        return max(int(math.ceil(val - 1e-9)), jg.tail_need), mm

    def _structure(self, graph) -> JoinGraph:
        from hiremate.errors import SolverError

        jg, why = graph_join(graph)
        if jg is None:
            raise SolverError(f"{self.name} schedules join graphs (chains that meet at the loss) "
                              f"only: {why}; use a general-graph solver (e.g. H-ILP) for this "
                              "graph")
        return jg


def mm_start(jg: JoinGraph) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    k = len(jg.chains)
    return (1,) * k, (False,) * k


#: name -> solver class, registered by :mod:`hiremate.registry`
JOIN_SOLVERS: dict[str, type] = {"join": JoinDP}
