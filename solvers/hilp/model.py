"""The H-ILP / rk-Checkmate formulation as one sparse MILP, built with vectorised numpy code.

Why a separate module: the formulation is the part that must agree with the simulator, and the
backends (HiGHS, CP-SAT, PuLP) only ever see the matrices built here.

Phases (HiRemate, appendix B.2; Rockmate, appendix B): phase ``t`` runs a
subsequence of the nodes ``0..t`` in increasing order and ends with the first computation of node
``t``. A value may be freed only right after a compute step that produces or reads it (every
eager freeing of a fixed compute sequence has this form, so nothing is lost).

Variables (all in ``[0, 1]`` unless said):

- ``R[t, k]`` (binary), ``k <= t``: node ``k`` runs in phase ``t``; ``R[t, t] = 1``, the loss
  runs only in its own phase.
- ``P[t, j]`` (binary), ``t = prod(j)+1 .. T``: value ``j`` is alive before phase ``t``
  (``P[T, j]``: alive at the end). Each value has a single producer in a CD-graph, so the
  per-contribution ``S`` variables of the paper reduce to ``P``.
- ``C[t, j]``, ``t >= prod(j)``: ``j`` is created (it was not alive) when its producer runs in
  phase ``t``; determined by ``R`` and ``P``, so continuous.
- ``D[t, e]`` for each edge ``e = (j, k)`` between a value and a node producing or reading it,
  ``t >= k``: ``j`` is freed right after ``k`` in phase ``t``. The linearised deletion rule
  (B.3, in its disaggregated, tighter form) pins it to ``R[t,k] and not P[t+1,j] and no later
  reader of j runs in phase t``, so it is continuous too.
- ``V[t, k]`` (continuous, memory units): memory held before step ``k`` of phase ``t``.

Memory, exactly as ``hiremate.simulate`` counts it: only ``DataNode.counted`` values have a size;
sources (parameters, buffers, inputs) are free and always present; while node ``k`` runs memory
is ``V[t, k] + (sizes of all outputs of k) + overhead(k)`` (an output already alive counts twice
during the step), which must stay within the budget. Model outputs are never freed; final values
(parameter and input gradients) are alive at the end; every other value is freed by the end.
``save_budget`` bounds ``V[loss, loss]``, the memory held just before the loss node runs (what the
forward keeps for the backward, model outputs included).

Memory figures are divided by ``mem_unit`` (the budget by default, so coefficients are near 1 for
LP-based backends; CP-SAT uses the gcd of the sizes so that every coefficient is an integer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from hiremate.ir.graph import SOURCE_KINDS, Graph

#: memory bounds are ``bound + 0.5 byte - MEM_MARGIN * mem_unit``: an exact integer peak equal
#: to the bound is allowed, and the LP solvers' feasibility tolerance (1e-7 of the unit) cannot
#: let a schedule one byte over it through; with a huge unit this rejects the last ppm
MEM_MARGIN = 1e-6


def _cap(bound: int, unit: float) -> float:
    return (bound + 0.5 - MEM_MARGIN * unit) / unit


@dataclass
class Milp:
    """``min c.x  s.t.  row_lo <= A x <= row_hi,  col_lo <= x <= col_hi, x[integer] integral``."""

    c: np.ndarray
    A: sp.csr_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    integer: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.A.shape


@dataclass
class HilpModel:
    """The MILP of one (graph, budget, save_budget) and the layout of its variables."""

    milp: Milp
    n_nodes: int
    loss: int
    budget: int
    save_budget: int | None
    mem_unit: float
    #: ids (in ``graph.data``) of the non-source values, indexed by ``j``
    data_ids: np.ndarray
    prod: np.ndarray
    size: np.ndarray  # counted bytes of each value j
    #: edges value–node: value index, node id, position in the value's (producer, readers) list
    e_j: np.ndarray
    e_k: np.ndarray
    e_pos: np.ndarray
    off_p: np.ndarray
    off_c: np.ndarray
    off_d: np.ndarray
    base_p: int
    base_c: int
    base_d: int
    base_v: int
    build_time: float = 0.0
    stats: dict = field(default_factory=dict)
    #: first rows of the blocks a model built on top of this one rewrites (the hierarchical
    #: model's option-specific reads): ``eager`` (row of edge ``e`` in phase ``t``:
    #: ``+ off_d[e] + t - e_k[e]``), ``read`` (``+ read_off[e] + t - e_k[e]``, readers only)
    #: and ``pair`` (pair ``i`` of edges ``pair_a[i] < pair_z[i]`` of one value:
    #: ``+ pair_off[i] + t - e_k[pair_z[i]]``)
    row_base: dict = field(default_factory=dict)
    read_off: np.ndarray | None = None
    pair_a: np.ndarray | None = None
    pair_z: np.ndarray | None = None
    pair_off: np.ndarray | None = None

    # -- index helpers (vectorised) ----------------------------------------------------------
    def r(self, t, k):
        t = np.asarray(t)
        return t * (t + 1) // 2 + np.asarray(k)

    def p(self, j, t):
        """Index of ``P[t, j]``; -1 where it is the constant 0 (``t <= prod(j)``)."""
        j, t = np.asarray(j), np.asarray(t)
        idx = self.base_p + self.off_p[j] + (t - self.prod[j] - 1)
        return np.where(t > self.prod[j], idx, -1)

    def c(self, j, t):
        j, t = np.asarray(j), np.asarray(t)
        return self.base_c + self.off_c[j] + (t - self.prod[j])

    def d(self, e, t):
        e, t = np.asarray(e), np.asarray(t)
        return self.base_d + self.off_d[e] + (t - self.e_k[e])

    def v(self, t, k):
        t = np.asarray(t)
        return self.base_v + t * (t + 1) // 2 + np.asarray(k)


def _expand(starts: np.ndarray, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """For each item ``i``, the phases ``starts[i] .. stop-1``: (item index, phase) pairs."""
    counts = np.maximum(stop - starts, 0)
    item = np.repeat(np.arange(len(starts)), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    t = np.arange(int(counts.sum())) - first + np.repeat(starts, counts)
    return item, t


class _Rows:
    """Accumulates constraint triplets block by block."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.n = 0

    def block(self, n_rows: int, lo, hi) -> int:
        base = self.n
        self.lo.append(np.broadcast_to(np.asarray(lo, float), (n_rows,)).copy())
        self.hi.append(np.broadcast_to(np.asarray(hi, float), (n_rows,)).copy())
        self.n += n_rows
        return base

    def add(self, rows, cols, vals) -> None:
        rows = np.asarray(rows, np.int64)
        cols = np.broadcast_to(np.asarray(cols, np.int64), rows.shape)
        vals = np.broadcast_to(np.asarray(vals, float), rows.shape)
        keep = cols >= 0  # -1 marks a variable that is the constant 0
        self.rows.append(rows[keep])
        self.cols.append(cols[keep])
        self.vals.append(vals[keep])

    def matrix(self, n_cols: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        rows = np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)
        cols = np.concatenate(self.cols) if self.cols else np.zeros(0, np.int64)
        vals = np.concatenate(self.vals) if self.vals else np.zeros(0)
        A = sp.csr_matrix((vals, (rows, cols)), shape=(self.n, n_cols))
        A.sum_duplicates()
        return A, np.concatenate(self.lo), np.concatenate(self.hi)


def build_model(
    graph: Graph, budget: int, save_budget: int | None = None, mem_unit: float | None = None
) -> HilpModel:
    """Build the flat H-ILP (rk-Checkmate) MILP of ``graph`` under ``budget`` bytes."""
    import time as _time

    start = _time.perf_counter()
    T = len(graph.nodes)
    loss = graph.loss
    unit = float(mem_unit if mem_unit is not None else max(budget, 1))

    data_ids = np.array([d.id for d in graph.data if d.kind not in SOURCE_KINDS], np.int64)
    J = len(data_ids)
    jof = np.full(len(graph.data), -1, np.int64)
    jof[data_ids] = np.arange(J)
    prod = np.array([graph.data[d].producer for d in data_ids], np.int64)
    size_b = np.array([graph.data[d].size if graph.data[d].counted else 0 for d in data_ids],
                      np.int64)
    size = size_b / unit
    protected = np.zeros(J, bool)
    protected[jof[[o for o in graph.outputs if jof[o] >= 0]]] = True
    final = np.zeros(J, bool)
    final[jof[[d for d in graph.final_data if jof[d] >= 0]]] = True

    # edges value–node: the producer first (pos 0), then the readers in increasing order
    e_j_l, e_k_l, e_pos_l = [], [], []
    for j, d in enumerate(data_ids.tolist()):
        related = [int(prod[j])] + [u for u in graph.users(d)]
        for pos, k in enumerate(related):
            e_j_l.append(j)
            e_k_l.append(k)
            e_pos_l.append(pos)
    e_j = np.array(e_j_l, np.int64)
    e_k = np.array(e_k_l, np.int64)
    e_pos = np.array(e_pos_l, np.int64)
    E = len(e_j)
    first_edge = np.zeros(J + 1, np.int64)
    np.add.at(first_edge, e_j + 1, 1)
    first_edge = np.cumsum(first_edge)

    # variable layout
    n_r = T * (T + 1) // 2
    cnt_p = T - prod  # P[t, j] for t = prod+1 .. T
    off_p = np.cumsum(cnt_p) - cnt_p
    cnt_c = T - prod  # C[t, j] for t = prod .. T-1
    off_c = np.cumsum(cnt_c) - cnt_c
    cnt_d = T - e_k
    off_d = np.cumsum(cnt_d) - cnt_d
    base_p = n_r
    base_c = base_p + int(cnt_p.sum())
    base_d = base_c + int(cnt_c.sum())
    base_v = base_d + int(cnt_d.sum())
    n = base_v + n_r
    m = HilpModel(
        milp=None, n_nodes=T, loss=loss, budget=budget, save_budget=save_budget, mem_unit=unit,
        data_ids=data_ids, prod=prod, size=size_b, e_j=e_j, e_k=e_k, e_pos=e_pos, off_p=off_p,
        off_c=off_c, off_d=off_d, base_p=base_p, base_c=base_c, base_d=base_d, base_v=base_v,
    )

    col_lo = np.zeros(n)
    col_hi = np.ones(n)
    integer = np.zeros(n, bool)
    integer[:base_c] = True  # R and P
    cap = _cap(budget, unit)
    col_hi[base_v:] = cap
    # R: diagonal forced, loss only in its phase
    tt = np.arange(T)
    col_lo[m.r(tt, tt)] = 1.0
    later = np.arange(loss + 1, T)
    col_hi[m.r(later, np.full(len(later), loss))] = 0.0
    # D: model outputs are never freed
    d_item, d_t = _expand(e_k, T)
    d_idx = m.d(d_item, d_t)
    col_hi[d_idx[protected[e_j[d_item]]]] = 0.0
    # end state: final values alive; every other value except model outputs freed
    jj = np.arange(J)
    p_end = m.p(jj, np.full(J, T))
    col_lo[p_end[final]] = 1.0
    col_hi[p_end[~final & ~protected]] = 0.0
    if save_budget is not None:
        col_hi[m.v(loss, loss)] = min(cap, _cap(save_budget, unit))

    c = np.zeros(n)
    rt, rk = np.tril_indices(T)
    times = np.array([nd.time for nd in graph.nodes])
    c[m.r(rt, rk)] = times[rk]

    rows = _Rows()
    # -- values: creation and liveness, per (j, t >= prod) ------------------------------------
    c_item, c_t = _expand(prod, T)
    n_jt = len(c_item)
    c_idx = m.c(c_item, c_t)
    p_now = m.p(c_item, c_t)
    p_next = m.p(c_item, c_t + 1)
    r_prod = m.r(c_t, prod[c_item])
    # P[t+1] - P[t] - C + sum_e D[t, e] = 0
    b = rows.block(n_jt, 0.0, 0.0)
    rr = b + np.arange(n_jt)
    rows.add(rr, p_next, 1.0)
    rows.add(rr, p_now, -1.0)
    rows.add(rr, c_idx, -1.0)
    row_of_jt = b + m.off_c[e_j[d_item]] + (d_t - prod[e_j[d_item]])
    rows.add(row_of_jt, d_idx, 1.0)
    # C <= R[t, prod];  C + P[t] <= 1;  C - R[t, prod] + P[t] >= 0
    b = rows.block(n_jt, -np.inf, 0.0)
    rows.add(b + np.arange(n_jt), c_idx, 1.0)
    rows.add(b + np.arange(n_jt), r_prod, -1.0)
    b = rows.block(n_jt, -np.inf, 1.0)
    rows.add(b + np.arange(n_jt), c_idx, 1.0)
    rows.add(b + np.arange(n_jt), p_now, 1.0)
    b = rows.block(n_jt, 0.0, np.inf)
    rows.add(b + np.arange(n_jt), c_idx, 1.0)
    rows.add(b + np.arange(n_jt), r_prod, -1.0)
    rows.add(b + np.arange(n_jt), p_now, 1.0)

    # -- deletions: D <= R[t, k]; D + P[t+1] <= 1 -----------------------------------------
    n_et = len(d_item)
    r_edge = m.r(d_t, e_k[d_item])
    p_next_e = m.p(e_j[d_item], d_t + 1)
    b = rows.block(n_et, -np.inf, 0.0)
    rows.add(b + np.arange(n_et), d_idx, 1.0)
    rows.add(b + np.arange(n_et), r_edge, -1.0)
    b = rows.block(n_et, -np.inf, 1.0)
    rows.add(b + np.arange(n_et), d_idx, 1.0)
    rows.add(b + np.arange(n_et), p_next_e, 1.0)
    # eager rule: D - R[t, k] + P[t+1] + sum_{later readers u <= t} R[t, u] >= 0
    b_eager = rows.block(n_et, 0.0, np.inf)
    rows.add(b_eager + np.arange(n_et), d_idx, 1.0)
    rows.add(b_eager + np.arange(n_et), r_edge, -1.0)
    rows.add(b_eager + np.arange(n_et), p_next_e, 1.0)

    # pairs (earlier edge a, later edge z) of the same value
    pa, pz = [], []
    for j in range(J):
        lo_e, hi_e = first_edge[j], first_edge[j + 1]
        for z in range(lo_e + 1, hi_e):
            pa.extend(range(lo_e, z))
            pz.extend([z] * (z - lo_e))
    pa_a = np.array(pa, np.int64)
    pz_a = np.array(pz, np.int64)
    q_item, q_t = _expand(e_k[pz_a], T)  # phases where the later node exists
    qa, qz = pa_a[q_item], pz_a[q_item]
    n_q = len(q_item)
    r_later = m.r(q_t, e_k[qz])
    d_early = m.d(qa, q_t)
    # eager rule, continued: later readers of the same value in the same phase
    rows.add(b_eager + (m.off_d[qa] + (q_t - e_k[qa])), r_later, 1.0)
    # D[t, a] + R[t, z] <= 1 (freed after a, so not read again in this phase)
    b = rows.block(n_q, -np.inf, 1.0)
    cnt_q = T - e_k[pz_a]
    m.row_base.update(eager=b_eager, pair=b)
    m.pair_a, m.pair_z, m.pair_off = pa_a, pz_a, np.cumsum(cnt_q) - cnt_q
    rows.add(b + np.arange(n_q), d_early, 1.0)
    rows.add(b + np.arange(n_q), r_later, 1.0)
    # reads: R[t, z] <= P[t] + C[t] - sum_{earlier edges a} D[t, a], one row per (z, t)
    z_item, z_t = _expand(e_k, T)
    reader = e_pos[z_item] > 0
    z_item, z_t = z_item[reader], z_t[reader]
    n_z = len(z_item)
    b = rows.block(n_z, -np.inf, 0.0)
    row_z = np.full(E, -1, np.int64)
    zr = np.flatnonzero(e_pos > 0)
    row_z[zr] = np.cumsum(cnt_d[zr]) - cnt_d[zr]
    m.row_base["read"], m.read_off = b, row_z
    rr = b + np.arange(n_z)
    jz = e_j[z_item]
    rows.add(rr, m.r(z_t, e_k[z_item]), 1.0)
    rows.add(rr, m.p(jz, z_t), -1.0)
    rows.add(rr, m.c(jz, z_t), -1.0)
    rows.add(b + row_z[qz] + (q_t - e_k[qz]), d_early, 1.0)

    # -- memory -----------------------------------------------------------------------------
    # V[t, 0] = sum_j size_j P[t, j]
    p_item, p_t = _expand(prod + 1, T)  # P[t, j] for t in prod+1 .. T-1
    b = rows.block(T, 0.0, 0.0)
    rows.add(b + np.arange(T), m.v(tt, 0), 1.0)
    rows.add(b + p_t, m.p(p_item, p_t), -size[p_item])
    # V[t, k+1] = V[t, k] + sum_{outputs} size C[t, j] - sum_{edges at k} size D[t, e]
    st_t, st_k = np.tril_indices(T, -1)  # k < t: from step k to step k+1 in phase t
    n_st = len(st_t)
    b = rows.block(n_st, 0.0, 0.0)
    row_st = b + st_t * (st_t - 1) // 2 + st_k  # rank of (t, k) with k < t
    rows.add(row_st, m.v(st_t, st_k + 1), 1.0)
    rows.add(row_st, m.v(st_t, st_k), -1.0)
    cv = prod[c_item] < c_t  # the last step of a phase has no transition after it
    rows.add(b + c_t[cv] * (c_t[cv] - 1) // 2 + prod[c_item][cv], c_idx[cv], -size[c_item][cv])
    dv = e_k[d_item] < d_t
    rows.add(b + d_t[dv] * (d_t[dv] - 1) // 2 + e_k[d_item][dv], d_idx[dv],
             size[e_j[d_item]][dv])
    # budget: V[t, k] + R[t, k] * (outputs + overhead of k) <= budget
    w = np.array([sum(size_b[jof[o]] for o in nd.outputs if jof[o] >= 0) + nd.overhead
                  for nd in graph.nodes], float) / unit
    n_tk = len(rt)
    b = rows.block(n_tk, -np.inf, cap)
    rows.add(b + np.arange(n_tk), m.v(rt, rk), 1.0)
    rows.add(b + np.arange(n_tk), m.r(rt, rk), w[rk])

    A, lo, hi = rows.matrix(n)
    m.milp = Milp(c=c, A=A, row_lo=lo, row_hi=hi, col_lo=col_lo, col_hi=col_hi, integer=integer)
    m.build_time = _time.perf_counter() - start
    m.stats = {"cols": n, "rows": A.shape[0], "nnz": A.nnz, "integer": int(integer.sum())}
    return m


def gcd_unit(graph: Graph) -> int:
    """Largest integer dividing every counted size and overhead: an exact integer memory unit."""
    g = 0
    for d in graph.data:
        if d.counted and d.kind not in SOURCE_KINDS:
            g = math.gcd(g, d.size)
    for nd in graph.nodes:
        g = math.gcd(g, nd.overhead)
    return max(g, 1)
