"""FastSA's annealing loop compiled with numba (an optional accelerator).

Why: the pure-Python loop of :meth:`hiremate.solvers.fastsa.solver.FastSA.anneal` spends its
time on interpreter bookkeeping (bisections into per-value slot lists, tuple building, one NumPy call
per range). This module is the same algorithm over flat arrays, compiled once (``cache=True``)
to machine code, which removes that bookkeeping (docs/benchmarks.md, "FastSA evaluation rate",
has the measured rates and the command).

It is a transcription, decision for decision, of ``FastSA.anneal`` and of
:class:`hiremate.solvers.fastsa.state.SlotState`, so that a seed gives the same path with or
without numba (tests check it):

- the random stream is Python's own: :func:`_mt_random` is the Mersenne Twister of
  ``random.Random`` (``genrand_res53``), started from and written back to its state;
- per-value production and use lists are rows of 2-D arrays (``P``/``U`` with counts
  ``Pn``/``Un``), sorted like the Python lists, and the state's operations over them are
  :mod:`hiremate.solvers.fastsa.kernel_slots`; the annealer's ``slots_of``, ``removable``,
  ``placed`` and their position maps are arrays with the same append / swap-remove order;
- the deltas of a mutation are written to scratch arrays ``dl``/``dh``/``ds``.

Rows have a fixed capacity: before each iteration :func:`anneal_chunk` checks it can take one
more mutation and otherwise returns ``GROW`` so that the caller (:mod:`hiremate.solvers.fastsa.accel`) widens
the arrays and calls again from the same iteration; the path does not change.

The reference implementation stays the Python one; this file has no logic of its own. The
compiled functions carry no annotations: numba types them from what they receive (int64 and
float64 scalars, and int64 / float64 / bool arrays built by :mod:`hiremate.solvers.fastsa.accel`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from hiremate.solvers.fastsa.kernel_slots import (
    ZERO, add_deltas, apply_deltas, argmax, bounds, can_remove, compact, first_slot,
    forget_first, helper as _helper, insort, lists_remove, peak_with, remove_deltas,
)

NOP = -1
DONE, FEASIBLE, GROW = 0, 1, 2
"""Status of :func:`anneal_chunk`: ran to the end of the chunk; stopped because the budget
was met (``stop_when_feasible``); a row array is full (widen and call again)."""

# indices into the ``ints`` array shared with the accel module
I_PEAK, I_PEAK_AT, I_ATTEMPTS, I_EVALUATED, I_ACCEPTED, I_BOUNDED = 0, 1, 2, 3, 4, 5
I_NREM, I_NPLACED, I_HAS_BEST, I_HW_P, I_HW_U, I_HW_S, I_IT = 6, 7, 8, 9, 10, 11, 12
N_INTS = 13
# indices into the ``flts`` array
F_COST, F_F, F_BEST_COST, F_TEMP = 0, 1, 2, 3
N_FLTS = 4
# typed constants: a literal argument (True) would compile a second copy of a helper
YES, NO = np.bool_(True), np.bool_(False)

_jit = njit(cache=True, nogil=True)


# -- random.Random's Mersenne Twister (state: 624 words, then the position) ---------------------
@_helper
def _mt_twist(mt: np.ndarray) -> None:
    for k in range(624):
        y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7FFFFFFF)
        v = mt[(k + 397) % 624] ^ (y >> 1)
        if y & 1:
            v ^= 0x9908B0DF
        mt[k] = v


@_helper
def _mt_u32(mt: np.ndarray) -> int:
    i = mt[624]
    if i >= 624:
        _mt_twist(mt)
        i = 0
    y = mt[i]
    mt[624] = i + 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y


@_helper
def _mt_random(mt: np.ndarray) -> float:
    """``random.Random.random()``: 53 random bits from two 32-bit words."""
    a = _mt_u32(mt) >> 5
    b = _mt_u32(mt) >> 6
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)


@_helper
def _lists_add(x, t, ins_ptr, ins_idx, outs_ptr, outs_idx, P, Pn, U, Un, ints):
    for q in range(ins_ptr[x], ins_ptr[x + 1]):
        c = insort(U, Un, ins_idx[q], t)
        if c > ints[I_HW_U]:
            ints[I_HW_U] = c
    for q in range(outs_ptr[x], outs_ptr[x + 1]):
        c = insort(P, Pn, outs_idx[q], t)
        if c > ints[I_HW_P]:
            ints[I_HW_P] = c


@_helper
def _drop(arr, pos, n, t):
    """Swap-remove slot ``t`` from ``arr[:n]`` (as the annealer's ``drop``); returns ``n - 1``."""
    i = pos[t]
    pos[t] = -1
    n -= 1
    last = arr[n]
    if last != t:
        arr[i] = last
        pos[last] = i
    return n


@_helper
def _save_best(seq, best, ints, flts):
    for k in range(seq.shape[0]):
        best[k] = seq[k]
    ints[I_HAS_BEST] = 1
    flts[F_BEST_COST] = flts[F_COST]


# -- the annealing loop ----------------------------------------------------------------------
@_jit
def anneal_chunk(it1, iters, budget, temp0, log_ratio, stop_when_feasible, window, loss_slot,
                 caps, ints, flts, mt, tab, st, walk, sc):
    """Run iterations ``ints[I_IT] .. it1 - 1`` of ``FastSA.anneal``; returns a status.

    ``caps``: row capacities of ``P``, ``U``, ``S`` and the largest number of entries one
    mutation adds to a row of each. ``tab``: the node table (see ``accel.pack_table``);
    ``st``: ``(seq, P, Pn, U, Un, mem, first_cache)``; ``walk``: ``(S, Sn, removable, rpos,
    placed, ppos, best)``; ``sc``: scratch ``(dl, dh, ds, evp, evs, window)``.
    """
    (ins_ptr, ins_idx, outs_ptr, outs_idx, sins_ptr, sins_idx, souts_ptr, souts_idx, rd_ptr,
     rd_idx, cost_of, overhead, out_bytes, fixed, after_loss, needed, pool, size, kept,
     pin) = tab
    seq, P, Pn, U, Un, mem, fc = st
    dl, dh, ds, evp, evs, win = sc
    S, Sn, removable, rpos, placed, ppos, best = walk
    T = seq.shape[0]
    npool = pool.shape[0]
    peak, peak_at = ints[I_PEAK], ints[I_PEAK_AT]
    attempts, evaluated = ints[I_ATTEMPTS], ints[I_EVALUATED]
    accepted, bounded = ints[I_ACCEPTED], ints[I_BOUNDED]
    n_rem, n_placed = ints[I_NREM], ints[I_NPLACED]
    f, temp = flts[F_F], flts[F_TEMP]
    status = DONE
    it = ints[I_IT]
    while it < it1:
        if (ints[I_HW_P] + caps[3] > caps[0] or ints[I_HW_U] + caps[4] > caps[1]
                or ints[I_HW_S] + 1 > caps[2]):
            status = GROW
            break
        if it & 1023 == 0:
            temp = temp0 * math.exp(log_ratio * it / iters)
            if stop_when_feasible and peak <= budget:
                status = FEASIBLE
                break
        it += 1
        attempts += 1
        r = _mt_random(mt)
        if r < 0.34:  # add a (re)computation
            if npool == 0:
                continue
            x = pool[int(_mt_random(mt) * npool)]
            lo = fc[x]
            if lo < 0:
                lo = first_slot(x, ins_ptr, ins_idx, after_loss, pin, P, Pn, fc, T, loss_slot)
            if lo >= T:
                continue
            t = lo + int(_mt_random(mt) * (T - lo))
            if seq[t] != NOP:
                continue
            evaluated += 1
            g_max = f - temp * math.log(1.0 - _mt_random(mt))
            c_new = flts[F_COST] + cost_of[x]
            m = peak if t <= peak_at else peak - out_bytes[x]
            if (budget if budget > m else m) * c_new > g_max:
                bounded += 1
                continue
            n = add_deltas(x, t, sins_ptr, sins_idx, souts_ptr, souts_idx, overhead, size, kept,
                            P, Pn, U, Un, T, dl, dh, ds, ZERO)
            adding = True
        elif r < 0.67:  # remove a computation
            if n_rem == 0:
                continue
            t = removable[int(_mt_random(mt) * n_rem)]
            x = seq[t]
            n = remove_deltas(x, t, outs_ptr, outs_idx, sins_ptr, sins_idx, overhead, size, kept,
                               P, Pn, U, Un, T, dl, dh, ds, ZERO)
            if n < 0:
                continue
            evaluated += 1
            g_max = f - temp * math.log(1.0 - _mt_random(mt))
            c_new = flts[F_COST] - cost_of[x]
            adding = False
        else:  # move a node to a free slot nearby
            if n_placed == 0:
                continue
            t1 = placed[int(_mt_random(mt) * n_placed)]
            x = seq[t1]
            a = fc[x]
            if a < 0:
                a = first_slot(x, ins_ptr, ins_idx, after_loss, pin, P, Pn, fc, T, loss_slot)
            if a < t1 - window:
                a = t1 - window
            b = t1 + window + 1
            if b > T:
                b = T
            t2 = a + int(_mt_random(mt) * (b - a))
            if seq[t2] != NOP or not can_remove(x, t1, t2, outs_ptr, outs_idx, kept, P, Pn, U, Un, T):
                continue
            evaluated += 1
            g_max = f - temp * math.log(1.0 - _mt_random(mt))
            n = add_deltas(x, t2, sins_ptr, sins_idx, souts_ptr, souts_idx, overhead, size, kept,
                            P, Pn, U, Un, T, dl, dh, ds, ZERO)
            _lists_add(x, t2, ins_ptr, ins_idx, outs_ptr, outs_idx, P, Pn, U, Un, ints)
            n = remove_deltas(x, t1, outs_ptr, outs_idx, sins_ptr, sins_idx, overhead, size, kept,
                               P, Pn, U, Un, T, dl, dh, ds, n)
            n = compact(dl, dh, ds, evp, evs, n)
            c = flts[F_COST]
            m, ub = bounds(dl, dh, ds, n, peak, peak_at, YES)
            if (budget if budget > m else m) * c > g_max:
                bounded += 1
                lists_remove(x, t2, ins_ptr, ins_idx, outs_ptr, outs_idx, P, Pn, U, Un)
                continue
            refresh = False
            if (budget if budget > ub else ub) * c > g_max:
                m, new_at = peak_with(dl, dh, ds, win, n, mem, T, peak, peak_at)
                if (budget if budget > m else m) * c > g_max:
                    lists_remove(x, t2, ins_ptr, ins_idx, outs_ptr, outs_idx, P, Pn, U, Un)
                    continue
                peak, peak_at = m, new_at
            elif m == ub:  # the bounds meet: the peak stays at its slot, same value
                peak = m
            else:
                refresh = True
            seq[t2] = x  # commit_move (begun: the list edit at t2 is kept)
            seq[t1] = NOP
            lists_remove(x, t1, ins_ptr, ins_idx, outs_ptr, outs_idx, P, Pn, U, Un)
            forget_first(x, rd_ptr, rd_idx, fc)
            apply_deltas(dl, dh, ds, n, mem)
            if refresh:
                peak_at = argmax(mem, ZERO, T)
                peak = mem[peak_at]
            f = (budget if budget > peak else peak) * c
            if peak <= budget and flts[F_COST] < flts[F_BEST_COST]:
                _save_best(seq, best, ints, flts)
            accepted += 1
            i = ppos[t1]
            ppos[t1] = -1
            placed[i] = t2
            ppos[t2] = i
            if rpos[t1] >= 0:
                i = rpos[t1]
                rpos[t1] = -1
                removable[i] = t2
                rpos[t2] = i
            if not fixed[x]:
                for k in range(Sn[x]):
                    if S[x, k] == t1:
                        S[x, k] = t2
                        break
            continue
        m, ub = bounds(dl, dh, ds, n, peak, peak_at, NO)
        if (budget if budget > m else m) * c_new > g_max:
            bounded += 1
            continue
        new_at = peak_at
        if m == ub:  # the bounds meet: the new peak is m, at the same slot
            known = True
        elif (budget if budget > ub else ub) * c_new > g_max:
            known = True
            m, new_at = peak_with(dl, dh, ds, win, n, mem, T, peak, peak_at)
            if (budget if budget > m else m) * c_new > g_max:
                continue
        else:
            known = False
        accepted += 1
        if adding:  # commit_add
            seq[t] = x
            _lists_add(x, t, ins_ptr, ins_idx, outs_ptr, outs_idx, P, Pn, U, Un, ints)
            flts[F_COST] += cost_of[x]
            forget_first(x, rd_ptr, rd_idx, fc)
            apply_deltas(dl, dh, ds, n, mem)
            k = Sn[x]
            S[x, k] = t
            Sn[x] = k + 1
            if k + 1 > ints[I_HW_S]:
                ints[I_HW_S] = k + 1
            for q in range(k + 1):
                u = S[x, q]
                if rpos[u] < 0 and u != pin[x]:
                    rpos[u] = n_rem
                    removable[n_rem] = u
                    n_rem += 1
            ppos[t] = n_placed
            placed[n_placed] = t
            n_placed += 1
        else:  # commit_remove
            seq[t] = NOP
            lists_remove(x, t, ins_ptr, ins_idx, outs_ptr, outs_idx, P, Pn, U, Un)
            flts[F_COST] -= cost_of[x]
            forget_first(x, rd_ptr, rd_idx, fc)
            apply_deltas(dl, dh, ds, n, mem)
            k = Sn[x]
            for q in range(k):
                if S[x, q] == t:
                    for r2 in range(q, k - 1):
                        S[x, r2] = S[x, r2 + 1]
                    break
            Sn[x] = k - 1
            n_rem = _drop(removable, rpos, n_rem, t)
            n_placed = _drop(placed, ppos, n_placed, t)
            if k - 1 == 1 and needed[x] and rpos[S[x, 0]] >= 0:
                n_rem = _drop(removable, rpos, n_rem, S[x, 0])
        if known:
            peak, peak_at = m, new_at
        else:
            peak_at = argmax(mem, ZERO, T)
            peak = mem[peak_at]
        f = (budget if budget > peak else peak) * c_new
        if peak <= budget and flts[F_COST] < flts[F_BEST_COST]:
            _save_best(seq, best, ints, flts)
    ints[I_IT] = it
    ints[I_PEAK], ints[I_PEAK_AT] = peak, peak_at
    ints[I_ATTEMPTS], ints[I_EVALUATED] = attempts, evaluated
    ints[I_ACCEPTED], ints[I_BOUNDED] = accepted, bounded
    ints[I_NREM], ints[I_NPLACED] = n_rem, n_placed
    flts[F_F], flts[F_TEMP] = f, temp
    return status
