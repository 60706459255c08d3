"""FastSA's slot state over flat arrays, compiled with numba: the helpers of the kernel.

Each function transcribes one piece of :class:`hiremate.solvers.fastsa.state.SlotState` (and
:func:`~hiremate.solvers.fastsa.state.compact`) decision for decision, over the arrays that
:mod:`hiremate.solvers.fastsa.accel` builds: per-value production and use lists are rows of 2-D
arrays (``P``/``U`` with counts ``Pn``/``Un``) kept sorted, the node table is in CSR form, and
the deltas of a mutation are written to scratch arrays ``dl``/``dh``/``ds``. The annealing loop
that calls them is :func:`hiremate.solvers.fastsa.kernel.anneal_chunk`. Like the kernel, the
functions carry no annotations (numba types them from what they receive).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: a typed zero: a literal argument would compile a second copy of a helper
ZERO = np.int64(0)
#: helpers are called only from compiled code: no Python wrapper to generate (compiles faster)
helper = njit(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)


# -- sorted rows -----------------------------------------------------------------------------
@helper
def bl(arr: np.ndarray, row: int, n: int, v: int) -> int:
    """``bisect_left`` over ``arr[row, :n]``."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[row, mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@helper
def br(arr: np.ndarray, row: int, n: int, v: int) -> int:
    """``bisect_right`` over ``arr[row, :n]``."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if v < arr[row, mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@helper
def insort(arr: np.ndarray, cnt: np.ndarray, row: int, v: int) -> int:
    """Insert ``v`` into the sorted row; returns its new length."""
    n = cnt[row]
    k = br(arr, row, n, v)
    for i in range(n, k, -1):
        arr[row, i] = arr[row, i - 1]
    arr[row, k] = v
    cnt[row] = n + 1
    return n + 1


@helper
def delete_sorted(arr: np.ndarray, cnt: np.ndarray, row: int, v: int) -> None:
    """Remove one ``v`` from the sorted row."""
    n = cnt[row]
    k = bl(arr, row, n, v)
    for i in range(k, n - 1):
        arr[row, i] = arr[row, i + 1]
    cnt[row] = n - 1


# -- SlotState, over arrays ------------------------------------------------------------------
@helper
def first_slot(x, ins_ptr, ins_idx, after_loss, pin, P, Pn, fc, T, loss_slot):
    """``SlotState.first_slot``."""
    lo = fc[x]
    if lo >= 0:
        return lo
    lo = loss_slot + 1 if after_loss[x] else 0
    if pin[x] >= lo:
        lo = pin[x] + 1
    for q in range(ins_ptr[x], ins_ptr[x + 1]):
        d = ins_idx[q]
        if Pn[d] == 0:
            return T
        p0 = P[d, 0]
        if p0 >= lo:
            lo = p0 + 1
    fc[x] = lo
    return lo


@helper
def can_remove(x, t, extra, outs_ptr, outs_idx, kept, P, Pn, U, Un, T):
    """``SlotState.can_remove``."""
    for q in range(outs_ptr[x], outs_ptr[x + 1]):
        d = outs_idx[q]
        np_ = Pn[d]
        k = bl(P, d, np_, t)
        if k > 0 or (0 <= extra < t):
            continue
        nxt = P[d, k + 1] if k + 1 < np_ else T
        if extra > t and extra < nxt:
            nxt = extra
        elif nxt == T and kept[d]:
            return False
        nu = Un[d]
        j = br(U, d, nu, t)
        if j < nu and U[d, j] < nxt:
            return False
    return True


@helper
def add_deltas(x, t, sins_ptr, sins_idx, souts_ptr, souts_idx, overhead, size, kept,
                P, Pn, U, Un, T, dl, dh, ds, n):
    """``SlotState.add_deltas``, appended to the deltas ``dl/dh/ds`` from index ``n``;
    returns the new count."""
    for q in range(sins_ptr[x], sins_ptr[x + 1]):
        d = sins_idx[q]
        np_ = Pn[d]
        k = bl(P, d, np_, t)
        p = P[d, k - 1]
        if k < np_:
            nxt = P[d, k]
        elif kept[d]:
            continue
        else:
            nxt = T
        j = bl(U, d, Un[d], nxt) - 1
        e0 = U[d, j] if j >= 0 and U[d, j] > p else p
        if t > e0:
            dl[n], dh[n], ds[n] = e0 + 1, t + 1, size[d]
            n += 1
    for q in range(souts_ptr[x], souts_ptr[x + 1]):
        d = souts_idx[q]
        s = size[d]
        np_ = Pn[d]
        nu = Un[d]
        k = bl(P, d, np_, t)
        if k < np_:
            nxt = P[d, k]
            last_copy = False
        else:
            nxt = T
            last_copy = kept[d]
        j = bl(U, d, nu, nxt) - 1
        last_use = U[d, j] if j >= 0 else -1
        if k:
            p = P[d, k - 1]
            if last_copy or last_use > t:
                i = bl(U, d, nu, t) - 1
                e1 = U[d, i] if i >= 0 and U[d, i] > p else p
                if e1 + 1 < t:
                    dl[n], dh[n], ds[n] = e1 + 1, t, -s
                    n += 1
                continue
        if last_copy:
            dl[n], dh[n], ds[n] = t, T, s
        else:
            dl[n], dh[n], ds[n] = t, (last_use if last_use > t else t) + 1, s
        n += 1
    ov = overhead[x]
    if ov:
        dl[n], dh[n], ds[n] = t, t + 1, ov
        n += 1
    return n


@helper
def remove_deltas(x, t, outs_ptr, outs_idx, sins_ptr, sins_idx, overhead, size, kept,
                   P, Pn, U, Un, T, dl, dh, ds, n):
    """``SlotState.remove_deltas`` from index ``n``; returns the new count, -1 if invalid."""
    for q in range(outs_ptr[x], outs_ptr[x + 1]):
        d = outs_idx[q]
        s = size[d]
        np_ = Pn[d]
        nu = Un[d]
        k = bl(P, d, np_, t)
        if k + 1 < np_:
            nxt = P[d, k + 1]
            last_copy = False
        else:
            nxt = T
            last_copy = kept[d]
        j = bl(U, d, nu, nxt) - 1
        last_use = U[d, j] if j >= 0 else -1
        if k:
            p = P[d, k - 1]
            if last_copy or last_use > t:
                i = bl(U, d, nu, t) - 1
                e0 = U[d, i] if i >= 0 and U[d, i] > p else p
                if s and e0 + 1 < t:
                    dl[n], dh[n], ds[n] = e0 + 1, t, s
                    n += 1
                continue
        elif last_copy or last_use > t:
            return -1
        if s:
            dl[n] = t
            dh[n] = T if last_copy else (last_use if last_use > t else t) + 1
            ds[n] = -s
            n += 1
    for q in range(sins_ptr[x], sins_ptr[x + 1]):
        d = sins_idx[q]
        np_ = Pn[d]
        k = bl(P, d, np_, t)
        p = P[d, k - 1]
        if k < np_:
            nxt = P[d, k]
        elif kept[d]:
            continue
        else:
            nxt = T
        nu = Un[d]
        j = bl(U, d, nu, nxt) - 1
        if U[d, j] == t:
            i = bl(U, d, nu, t) - 1
            e1 = U[d, i] if i >= 0 and U[d, i] > p else p
            dl[n], dh[n], ds[n] = e1 + 1, t + 1, -size[d]
            n += 1
    ov = overhead[x]
    if ov:
        dl[n], dh[n], ds[n] = t, t + 1, -ov
        n += 1
    return n


@helper
def compact(dl, dh, ds, evp, evs, n):
    """``SlotState.compact`` (:mod:`hiremate.solvers.fastsa.state`) in place: disjoint non-zero ranges in slot order."""
    if n < 2:
        return n
    m = 0
    for i in range(n):
        evp[m], evs[m] = dl[i], ds[i]
        evp[m + 1], evs[m + 1] = dh[i], -ds[i]
        m += 2
    for i in range(1, m):  # insertion sort by position (a few dozen events at most)
        p, s = evp[i], evs[i]
        j = i - 1
        while j >= 0 and evp[j] > p:
            evp[j + 1], evs[j + 1] = evp[j], evs[j]
            j -= 1
        evp[j + 1], evs[j + 1] = p, s
    out = 0
    cur = 0
    start = 0
    i = 0
    while i < m:
        pos = evp[i]
        step = 0
        while i < m and evp[i] == pos:
            step += evs[i]
            i += 1
        if step == 0:
            continue
        if cur:
            dl[out], dh[out], ds[out] = start, pos, cur
            out += 1
        cur += step
        start = pos
    return out


@helper
def argmax(mem, lo, hi):
    """First slot of ``[lo, hi)`` holding the maximum (as ``ndarray.argmax``)."""
    best = lo
    v = mem[lo]
    for i in range(lo + 1, hi):
        if mem[i] > v:
            v = mem[i]
            best = i
    return best


@helper
def peak_with(dl, dh, ds, win, n, mem, T, peak, peak_at):
    """``SlotState.peak_with``: ``(new peak, a slot where it is reached)``."""
    if n == 0:
        return peak, peak_at
    if n == 1:
        lo, hi = dl[0], dh[0]
        at = argmax(mem, lo, hi)
        local = mem[at] + ds[0]
        i = at - lo
    else:
        lo, hi = T, 0
        for q in range(n):
            if dl[q] < lo:
                lo = dl[q]
            if dh[q] > hi:
                hi = dh[q]
        for k in range(lo, hi):
            win[k] = mem[k]
        for q in range(n):
            s = ds[q]
            for k in range(dl[q], dh[q]):
                win[k] += s
        at = argmax(win, lo, hi)
        local = win[at]
        i = at - lo
    if local >= peak:
        return local, lo + i
    if not lo <= peak_at < hi:
        return peak, peak_at
    at = lo + i
    if lo:
        j = argmax(mem, ZERO, lo)
        if mem[j] > local:
            local, at = mem[j], j
    if hi < T:
        j = argmax(mem, hi, T)
        if mem[j] > local:
            local, at = mem[j], j
    return local, at


@helper
def apply_deltas(dl, dh, ds, n, mem):
    for q in range(n):
        s = ds[q]
        for k in range(dl[q], dh[q]):
            mem[k] += s


@helper
def lists_remove(x, t, ins_ptr, ins_idx, outs_ptr, outs_idx, P, Pn, U, Un):
    for q in range(outs_ptr[x], outs_ptr[x + 1]):
        delete_sorted(P, Pn, outs_idx[q], t)
    for q in range(ins_ptr[x], ins_ptr[x + 1]):
        delete_sorted(U, Un, ins_idx[q], t)


@helper
def forget_first(x, rd_ptr, rd_idx, fc):
    for q in range(rd_ptr[x], rd_ptr[x + 1]):
        fc[rd_idx[q]] = -1


@helper
def bounds(dl, dh, ds, n, peak, peak_at, disjoint):
    """``SlotState.peak_bounds``: ``(lower, upper)`` bounds of the new peak."""
    lower = peak
    rise = 0
    for q in range(n):
        s = ds[q]
        if dl[q] <= peak_at < dh[q]:
            lower += s
        if s > 0:
            if disjoint:
                if s > rise:
                    rise = s
            else:
                rise += s
    return lower, peak + rise
