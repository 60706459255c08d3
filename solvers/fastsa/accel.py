"""Runs FastSA's annealing loop in the numba kernel (:mod:`hiremate.solvers.fastsa.kernel`) when numba is there.

Why a separate module: numba is an optional dependency (``pip install hiremate[fast]``). This
module imports it only when asked, packs a :class:`~hiremate.solvers.fastsa.state.SlotState`
and the annealer's proposal sets into flat arrays, runs the kernel in chunks (the wall-clock
deadline is checked between chunks, at multiples of 1,024 iterations as the Python loop does),
widens row arrays when the kernel asks, and writes everything back: the state (sequence,
per-value lists, profile, peak, cost, first-slot cache) and the ``random.Random`` state, so a
later annealing or any caller sees exactly what the Python loop would have left.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import time
from dataclasses import dataclass

import numpy as np

from hiremate.solvers.fastsa.state import NOP, SlotState

log = logging.getLogger(__name__)

CHUNK = 8192
"""Iterations per kernel call (a multiple of 1,024): a few milliseconds, so that a deadline is
overshot by little and a call's fixed cost (unboxing its arrays) is negligible."""

_I64 = np.int64

MIN_ROWS = 4
"""Least initial capacity of a row (copies of a node, productions or uses of a value); rows are
widened (doubled) when full. Tests lower it to exercise the widening."""


def available() -> bool:
    """Whether numba can be imported (the kernel compiles on first use, then is cached)."""
    return importlib.util.find_spec("numba") is not None


def usable(state: SlotState, rng: random.Random) -> bool:
    """The kernel transcribes exactly :class:`SlotState` and ``random.Random``; a subclass of
    either (a test's instrumented state, a custom generator) runs the Python loop instead."""
    return (available() and type(state) is SlotState and type(rng) is random.Random
            and state.mem.dtype == _I64)


@dataclass
class KernelResult:
    """Counters and best visited sequence of one kernel annealing (as ``AnnealStats``)."""

    attempts: int
    evaluated: int
    accepted: int
    bounded: int
    best: list[int] | None


def _csr(lists) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(lists) + 1, dtype=_I64)
    ptr[1:] = np.cumsum([len(v) for v in lists]) if len(lists) else []
    idx = np.fromiter((d for v in lists for d in v), dtype=_I64, count=int(ptr[-1]))
    return ptr, idx


def _max_mult(lists) -> int:
    """Most entries one node adds to a single value's list (a node may read a value twice)."""
    return max([1] + [max(v.count(d) for d in v) for v in map(list, lists) if v])


def pack_table(state: SlotState, pool: list[int], needed: list[bool]) -> tuple:
    """The node table as the kernel's ``tab`` tuple (layout documented in the kernel)."""
    table = state.table
    parts: list[np.ndarray] = []
    for lists in (table.ins, table.outs, state.sized_ins, state.sized_outs, state.readers):
        parts.extend(_csr(lists))
    parts += [np.asarray(table.cost, dtype=np.float64), np.asarray(table.overhead, dtype=_I64),
              np.asarray(state.out_bytes, dtype=_I64),
              np.asarray(table.movable_only, dtype=np.bool_),
              np.asarray(table.after_loss, dtype=np.bool_), np.asarray(needed, dtype=np.bool_),
              np.asarray(pool, dtype=_I64), np.asarray(state.size, dtype=_I64),
              np.asarray(state.kept, dtype=np.bool_), np.asarray(state.pin, dtype=_I64)]
    return tuple(parts)


def _rows(lists, cap: int) -> tuple[np.ndarray, np.ndarray]:
    arr = np.zeros((len(lists), cap), dtype=_I64)
    cnt = np.zeros(len(lists), dtype=_I64)
    for i, v in enumerate(lists):
        if v:
            arr[i, :len(v)] = v
            cnt[i] = len(v)
    return arr, cnt


def _widen(arr: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros((arr.shape[0], cap), dtype=_I64)
    out[:, :arr.shape[1]] = arr
    return out


def anneal(state: SlotState, budget: int, iters: int, temp0: float, log_ratio: float,
           rng: random.Random, stop_when_feasible: bool, deadline: float, window: int,
           pool: list[int], needed: list[bool], slots_of: dict[int, list[int]],
           removable: list[int], placed: list[int]) -> KernelResult:
    """``FastSA.anneal``'s loop in the kernel, from the proposal sets it built; the state and
    ``rng`` are left as the Python loop leaves them."""
    from hiremate.solvers.fastsa import kernel as K  # imports numba

    table = state.table
    T = state.T
    tab = pack_table(state, pool, needed)
    mult_in, mult_out = _max_mult(table.ins), _max_mult(table.outs)
    cap_p = 2 * max([MIN_ROWS] + [len(p) for p in state.prods]) + mult_out
    cap_u = 2 * max([MIN_ROWS] + [len(u) for u in state.uses]) + mult_in
    copies = [slots_of.get(x, []) for x in range(len(table))]
    cap_s = 2 * max([MIN_ROWS] + [len(c) for c in copies])
    P, Pn = _rows(state.prods, cap_p)
    U, Un = _rows(state.uses, cap_u)
    S, Sn = _rows(copies, cap_s)
    seq = np.asarray(state.seq, dtype=_I64)
    mem = np.ascontiguousarray(state.mem)
    fc = np.asarray(state.first_cache, dtype=_I64)
    rem = np.full(T, NOP, dtype=_I64)
    rem[:len(removable)] = removable
    rpos = np.full(T, -1, dtype=_I64)
    rpos[rem[:len(removable)]] = np.arange(len(removable))
    plc = np.full(T, NOP, dtype=_I64)
    plc[:len(placed)] = placed
    ppos = np.full(T, -1, dtype=_I64)
    ppos[plc[:len(placed)]] = np.arange(len(placed))
    best = np.full(T, NOP, dtype=_I64)
    io = max([0] + [len(a) + len(b) for a, b in zip(table.ins, table.outs)])
    n_scratch = 2 * (io + 1) + 2
    sc = tuple(np.zeros(n, dtype=_I64) for n in (n_scratch, n_scratch, n_scratch,
                                                  2 * n_scratch, 2 * n_scratch, T))

    ints = np.zeros(K.N_INTS, dtype=_I64)
    flts = np.zeros(K.N_FLTS, dtype=np.float64)
    ints[K.I_PEAK], ints[K.I_PEAK_AT] = state.peak, state.peak_at
    ints[K.I_NREM], ints[K.I_NPLACED] = len(removable), len(placed)
    ints[K.I_HW_P], ints[K.I_HW_U], ints[K.I_HW_S] = Pn.max(initial=0), Un.max(initial=0), \
        Sn.max(initial=0)
    flts[K.F_COST] = state.cost
    flts[K.F_F] = max(budget, state.peak) * state.cost
    flts[K.F_BEST_COST] = np.inf
    flts[K.F_TEMP] = temp0
    if state.peak <= budget:
        best[:] = seq
        ints[K.I_HAS_BEST] = 1
        flts[K.F_BEST_COST] = state.cost
    version, mt_state, gauss_next = rng.getstate()
    mt = np.array(mt_state, dtype=_I64)

    while ints[K.I_IT] < iters:
        it = int(ints[K.I_IT])
        if it & 1023 == 0 and time.perf_counter() > deadline:
            break
        caps = np.array([P.shape[1], U.shape[1], S.shape[1], mult_out, mult_in], dtype=_I64)
        status = K.anneal_chunk(min(iters, (it // CHUNK + 1) * CHUNK), iters, budget, temp0,
                                log_ratio, stop_when_feasible, window, state.loss_slot, caps,
                                ints, flts, mt, tab, (seq, P, Pn, U, Un, mem, fc),
                                (S, Sn, rem, rpos, plc, ppos, best), sc)
        if status == K.FEASIBLE:
            break
        if status == K.GROW:  # widen whichever row array is close to full, then go on
            if ints[K.I_HW_P] + mult_out > P.shape[1]:
                P = _widen(P, 2 * P.shape[1])
            if ints[K.I_HW_U] + mult_in > U.shape[1]:
                U = _widen(U, 2 * U.shape[1])
            if ints[K.I_HW_S] + 1 > S.shape[1]:
                S = _widen(S, 2 * S.shape[1])
            log.debug("FastSA kernel: rows widened to %s", (P.shape, U.shape, S.shape))

    rng.setstate((version, tuple(int(v) for v in mt), gauss_next))
    state.seq[:] = seq.tolist()
    state.prods = [P[d, :Pn[d]].tolist() for d in range(len(Pn))]
    state.uses = [U[d, :Un[d]].tolist() for d in range(len(Un))]
    state.first_cache[:] = fc.tolist()
    if mem is not state.mem:
        state.mem[:] = mem
    state.cost = float(flts[K.F_COST])
    state.peak, state.peak_at = int(ints[K.I_PEAK]), int(ints[K.I_PEAK_AT])
    return KernelResult(int(ints[K.I_ATTEMPTS]), int(ints[K.I_EVALUATED]),
                        int(ints[K.I_ACCEPTED]), int(ints[K.I_BOUNDED]),
                        [int(x) for x in best if x != NOP] if ints[K.I_HAS_BEST] else None)
