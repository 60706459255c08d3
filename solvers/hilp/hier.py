"""Hierarchical H-ILP: the top-level MILP over blocks with option menus (HiRemate, section
3.2.2 and appendix B).

Why a separate module from :mod:`hiremate.solvers.hilp.model`: the flat formulation stays the
one that must agree with the simulator node by node; here it is *reused* on a small top graph
and extended with what options and phantoms add, so both share every liveness constraint.

The top graph (:func:`~hiremate.solvers.hilp.topgraph.top_graph`) has one compute node per
block forward ``F_j`` and per block backward ``B_j``, the loss node, and the top-level (tail)
backward nodes; its data nodes are the *interface* values of the full graph. A block's internal
values are not data nodes; what its forward keeps for its backward is the block's *phantom*,
whose size depends on the option. A top node's edges are the union over its block's options;
with option-specific dependencies (appendix B.1.2, ``TopGraph.opt_reads``) an edge counts only
when the node runs with an option that reads the value (:func:`_option_reads`), e.g. a
backward that keeps every forward value does not keep the block's input alive, the checkpoint
option's does. Without them (``top_graph(..., option_deps=False)``) an option that does not
read an interface value still keeps it alive (conservative).

Model (:func:`build_hier_model`): the flat model of the top graph (``R``, ``P``, ``C``, ``D``,
``V``; block nodes have zero time and overhead there), plus

- ``Ro[t, k, o]`` (binary) for block nodes: node ``k`` runs with option ``o`` in phase ``t``;
  ``sum_o Ro[t, k, o] = R[t, k]`` (constraint 5), objective ``sum Ro * time(o)`` (2);
- ``Sp[t, j, o]`` (binary), ``t = F_j+1 .. T``: phantom ``o`` of block ``j`` alive before phase
  ``t``; (6) ``sum_o Sp <= 1``; (7) ``Sp[t+1] <= Sp[t] + Ro[t, F_j, o]``; (8) as two rows,
  ``Sp[t+1] >= Sp[t] - Ro[t, B_j, o]`` and ``Sp[t+1] >= Ro[t, F_j, o] - Ro[t, B_j, o]`` (the
  paper's single row ``Sp[t+1] >= Sp[t] + Ro[t, F_j, o] - Ro[t, B_j, o]`` forbids recomputing
  a forward, e.g. for its outputs, while its phantom is kept); (9) ``Ro[t, B_j, o] <= Sp[t] +
  Ro[t, F_j, o]``; freed after its backward ``Sp[t+1] + Ro[t, B_j, o] <= 1``; none at the end.
  A *standalone* option (no phantom, and a backward that recomputes every forward value it
  reads but the block's outputs, e.g. the checkpoint option) has no ``Sp`` and no rows (8b)
  and (9): its forward can run for the block's outputs alone and its backward after any
  forward, as rk-Rotor's ``Fe`` / ``Fc`` operations do;
- a save budget (optional): ``V[loss, loss]``, the interface values alive and the phantoms
  kept just before the loss node runs, is bounded as in the flat model; it bounds the full
  graph's memory at that point (after the step before the loss, as
  :func:`~hiremate.solvers.menu.option_from_schedule` counts a subgraph's save) from above for
  the same reasons as the peak;
- memory with phantom terms: ``V[t, 0]`` gains ``sum p_o Sp[t]``; the step after ``F_j`` adds
  ``p_o Ro[t, F_j, o]``, the step after ``B_j`` removes ``p_o (Ro[t, F_j, o] + Sp[t] -
  Sp[t+1])``; while a block node runs, memory is ``V[t, k] + w_o`` with ``w_o`` from the
  option's own step profile (:func:`option_costs`), which bounds the full graph's memory during
  the sub-sequence from above whatever of the block's interface is alive.

The per-step peaks ``w_o`` take the role of the B.3 correction terms (they use the option's
whole step profile rather than one overhead figure), with B.3's credits: each step's row
subtracts the interface values the part is done with before it (block inputs read for the last
time; in a forward part, block outputs made and read for the last time) when the level above
frees them right after the node. Outputs a backward part makes (input gradients, recomputed
outputs) are not credited: the level above reads them later, so it seldom frees them there.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from hiremate.solvers.hilp.model import MEM_MARGIN, HilpModel, Milp, _cap, _Rows, build_model
# the top graph and the option figures, re-exported: this module's users import them from here
from hiremate.solvers.hilp.topgraph import (  # noqa: F401
    OptionCost, Profile, TopGraph, checkpoint_options, option_costs, top_graph,
)


@dataclass
class HierModel:
    """The flat model of the top graph plus option and phantom variables."""

    flat: HilpModel
    milp: Milp
    top: TopGraph
    #: (top node k, option o) -> first column of Ro[t, k, o], t = k .. T-1
    ro: dict[tuple[int, int], int] = field(default_factory=dict)
    #: (block j, option o) -> first column of Sp[t, j, o], t = F_j+1 .. T
    sp: dict[tuple[int, int], int] = field(default_factory=dict)
    build_time: float = 0.0
    stats: dict = field(default_factory=dict)

    def ro_col(self, k: int, o: int, t: int) -> int:
        return self.ro[(k, o)] + (t - k)

    def sp_col(self, j: int, o: int, t: int) -> int:
        """Column of ``Sp[t, j, o]``; -1 where it is the constant 0 (``t <= F_j``)."""
        f = self.top.fwd_node(j)
        return -1 if t <= f else self.sp[(j, o)] + (t - f - 1)


def build_hier_model(top: TopGraph, budget: int, mem_unit: float | None = None,
                     save_budget: int | None = None) -> HierModel:
    """Build the hierarchical H-ILP of ``top`` under ``budget`` bytes (module docstring);
    ``save_budget`` bounds the memory held just before the loss node runs (``V[loss, loss]``:
    the interface values alive then plus the phantoms kept, see :func:`save_bound`)."""
    start = _time.perf_counter()
    g = top.graph
    T = len(g.nodes)
    # the flat model bounds V[loss, loss]; the phantom terms added below enter that column
    # through the V[t, 0] rows and the transitions, so the bound covers them too
    flat = build_model(g, budget, save_budget, mem_unit)
    unit = flat.mem_unit
    A0 = flat.milp.A
    n0 = A0.shape[1]
    N0 = A0.shape[0]
    n_tk, n_st = T * (T + 1) // 2, T * (T - 1) // 2
    b_budget = N0 - n_tk
    b_trans = b_budget - n_st
    b_v0 = b_trans - T
    # the last three row blocks of build_model: V[t,0], transitions, budget (checked)
    assert A0[b_v0 + T - 1, flat.v(T - 1, 0)] == 1.0
    assert A0[b_budget + n_tk - 1, flat.v(T - 1, T - 1)] == 1.0
    if T > 1:
        assert A0[b_trans + n_st - 1, flat.v(T - 1, T - 1)] == 1.0

    hm = HierModel(flat=flat, milp=None, top=top)
    col = n0
    blocks_nodes = [k for k in range(T) if top.kind[k] in ("F", "B")]
    for k in blocks_nodes:
        for o in range(len(top.costs[top.block[k]])):
            hm.ro[(k, o)] = col
            col += T - k
    L = len(top.costs)
    for j in range(L):
        f = top.fwd_node(j)
        for o in range(len(top.costs[j])):
            hm.sp[(j, o)] = col
            col += T - f  # t = f+1 .. T
    n = col
    c = np.concatenate([flat.milp.c, np.zeros(n - n0)])
    col_lo = np.concatenate([flat.milp.col_lo, np.zeros(n - n0)])
    col_hi = np.concatenate([flat.milp.col_hi, np.ones(n - n0)])
    integer = np.concatenate([flat.milp.integer, np.ones(n - n0, bool)])

    # -- additions to existing rows -----------------------------------------------------------
    add_r: list[np.ndarray] = []
    add_c: list[np.ndarray] = []
    add_v: list[np.ndarray] = []

    def put(r, cidx, v) -> None:
        r = np.asarray(r, np.int64)
        add_r.append(r)
        add_c.append(np.broadcast_to(np.asarray(cidx, np.int64), r.shape).copy())
        add_v.append(np.broadcast_to(np.asarray(v, float), r.shape).copy())

    w_flat = np.zeros(T)
    for k, nd in enumerate(g.nodes):
        w_flat[k] = (sum(g.data[d].size for d in nd.outputs if g.data[d].counted)
                     + nd.overhead) / unit
    rows = _Rows()
    cap = _cap(budget, unit)
    did = {d: i for i, d in enumerate(top.data_full)}
    flat_j = {int(d): j for j, d in enumerate(flat.data_ids)}  # top data id -> value index
    edge = {(int(flat.data_ids[j]), int(k)): e for e, (j, k) in enumerate(zip(flat.e_j, flat.e_k))}
    for k in blocks_nodes:
        j = top.block[k]
        is_f = top.kind[k] == "F"
        f = top.fwd_node(j)
        tt = np.arange(k, T)
        opts = top.costs[j]
        # (5): sum_o Ro[t,k,o] - R[t,k] = 0
        b = rows.block(len(tt), 0.0, 0.0)
        rows.add(b + np.arange(len(tt)), flat.r(tt, np.full(len(tt), k)), -1.0)
        for o, oc in enumerate(opts):
            ro = hm.ro[(k, o)] + (tt - k)
            rows.add(b + np.arange(len(tt)), ro, 1.0)
            c[ro] = oc.fwd_time if is_f else oc.bwd_time
            # budget rows (t, k) keep only V[t,k] <= cap for block nodes; the option's steps
            # get rows of their own, with the B.3 credits for values freed after the node
            put(b_budget + tt * (tt + 1) // 2 + k, ro, -w_flat[k])
            for w, fr in (oc.fwd_profile if is_f else oc.bwd_profile):
                b2 = rows.block(len(tt), -np.inf, cap)
                rr = b2 + np.arange(len(tt))
                rows.add(rr, flat.v(tt, np.full(len(tt), k)), 1.0)
                rows.add(rr, ro, w / unit)
                for d_full in fr:
                    e = edge.get((did.get(d_full, -1), k))
                    if e is not None:
                        rows.add(rr, flat.d(e, tt), -flat.size[flat_j[did[d_full]]] / unit)
            p = oc.phantom / unit
            if p == 0:
                continue
            tr = tt[tt > k]  # steps k -> k+1 exist in phases t > k
            rrow = b_trans + tr * (tr - 1) // 2 + k
            if is_f:
                put(rrow, hm.ro[(k, o)] + (tr - k), -p)
            else:
                put(rrow, hm.ro[(f, o)] + (tr - f), p)
                put(rrow, hm.sp[(j, o)] + (tr - f - 1), p)
                put(rrow, hm.sp[(j, o)] + (tr + 1 - f - 1), -p)
    _option_reads(hm, put)
    for j in range(L):
        f = top.fwd_node(j)
        bnode = next(k for k in range(T) if top.kind[k] == "B" and top.block[k] == j)
        opts = top.costs[j]
        ts = np.arange(f + 1, T + 1)  # Sp phases
        # V[t, 0] rows: - p Sp[t]
        for o, oc in enumerate(opts):
            sp_cols = hm.sp[(j, o)] + (ts - f - 1)
            inside = ts < T
            if oc.phantom:
                put(b_v0 + ts[inside], sp_cols[inside], -oc.phantom / unit)
            col_hi[hm.sp[(j, o)] + (T - f - 1)] = 0.0  # no phantom left at the end
            if oc.standalone:
                col_hi[sp_cols] = 0.0  # no token either: see (8) and (9) below
        # (6): sum_o Sp[t] <= 1
        b = rows.block(len(ts), -np.inf, 1.0)
        for o in range(len(opts)):
            rows.add(b + np.arange(len(ts)), hm.sp[(j, o)] + (ts - f - 1), 1.0)
        for o in range(len(opts)):
            tt = np.arange(f, T)  # transitions t -> t+1
            sp_now = np.where(tt > f, hm.sp[(j, o)] + (tt - f - 1), -1)
            sp_next = hm.sp[(j, o)] + (tt - f)
            r_f = hm.ro[(f, o)] + (tt - f)
            r_b = np.where(tt >= bnode, hm.ro[(bnode, o)] + (tt - bnode), -1)
            n_t = len(tt)
            # (7): Sp[t+1] - Sp[t] - Ro[t,F] <= 0
            b = rows.block(n_t, -np.inf, 0.0)
            rr = b + np.arange(n_t)
            rows.add(rr, sp_next, 1.0)
            rows.add(rr, sp_now, -1.0)
            rows.add(rr, r_f, -1.0)
            # (8), split in two so that a forward recomputed while its phantom is kept stays
            # feasible (the paper's single row would ask Sp[t+1] >= 2):
            # Sp[t+1] >= Sp[t] - Ro[t,B] and Sp[t+1] >= Ro[t,F] - Ro[t,B].
            # A standalone option (``OptionCost.standalone``: its forward keeps only the
            # block's outputs, its backward reads no other forward value) leaves nothing to
            # pair: its forward may run for the outputs alone (rk-Rotor's Fe / Fc), also
            # while another option's phantom is kept, and its backward needs no forward of
            # its own; only the rows that pair them are left out
            standalone = opts[o].standalone
            for prev in ((sp_now,) if standalone else (sp_now, r_f)):
                b = rows.block(n_t, 0.0, np.inf)
                rr = b + np.arange(n_t)
                rows.add(rr, sp_next, 1.0)
                rows.add(rr, prev, -1.0)
                rows.add(rr, r_b, 1.0)
            # (9): Ro[t,B] - Sp[t] - Ro[t,F] <= 0 and freed after B: Sp[t+1] + Ro[t,B] <= 1
            sel = tt >= bnode
            n_b = int(sel.sum())
            if not standalone:
                b = rows.block(n_b, -np.inf, 0.0)
                rr = b + np.arange(n_b)
                rows.add(rr, r_b[sel], 1.0)
                rows.add(rr, sp_now[sel], -1.0)
                rows.add(rr, r_f[sel], -1.0)
            b = rows.block(n_b, -np.inf, 1.0)
            rr = b + np.arange(n_b)
            rows.add(rr, sp_next[sel], 1.0)
            rows.add(rr, r_b[sel], 1.0)

    extra = sp.csr_matrix(
        (np.concatenate(add_v) if add_v else np.zeros(0),
         (np.concatenate(add_r) if add_r else np.zeros(0, np.int64),
          np.concatenate(add_c) if add_c else np.zeros(0, np.int64))), shape=(N0, n))
    A_top = sp.hstack([A0, sp.csr_matrix((N0, n - n0))], format="csr") + extra
    A_new, lo_new, hi_new = rows.matrix(n)
    A = sp.vstack([A_top, A_new], format="csr")
    A.sum_duplicates()
    A.eliminate_zeros()
    hm.milp = Milp(c=c, A=A, row_lo=np.concatenate([flat.milp.row_lo, lo_new]),
                   row_hi=np.concatenate([flat.milp.row_hi, hi_new]), col_lo=col_lo,
                   col_hi=col_hi, integer=integer)
    hm.build_time = _time.perf_counter() - start
    hm.stats = {"top_nodes": T, "cols": n, "rows": A.shape[0], "nnz": A.nnz,
                "options": sum(len(cs) for cs in top.costs)}
    return hm


def _option_reads(hm: HierModel, put) -> None:
    """Option-specific dependencies (HiRemate, appendix B.1.2): where only some options of a
    block node ``k`` read an interface value, the flat rows that say ``k`` reads it (the value
    is alive when ``k`` runs; not freed before a later reader in the phase; freed after its
    last reader) count ``k`` as a reader only when it runs with one of those options:
    ``R[t, k]`` becomes ``sum_{o reads} Ro[t, k, o]`` there. An option that does not read the
    value then neither keeps it alive nor may free it where it is not alive; the edge stays,
    so a free after ``k`` remains possible (never earlier than the simulator's eager one)."""
    top, flat = hm.top, hm.flat
    if top.opt_reads is None:
        return
    T = len(top.graph.nodes)
    base = flat.row_base
    pairs_of: dict[int, list[int]] = {}
    for i, z in enumerate(flat.pair_z.tolist()):
        pairs_of.setdefault(z, []).append(i)
    for e in range(len(flat.e_j)):
        k = int(flat.e_k[e])
        if flat.e_pos[e] == 0 or top.kind[k] not in ("F", "B"):
            continue
        d = int(flat.data_ids[flat.e_j[e]])
        reading = [o for o, rd in enumerate(top.opt_reads[k]) if d in rd]
        if len(reading) == len(top.opt_reads[k]):
            continue
        tt = np.arange(k, T)
        r_cols = flat.r(tt, np.full(len(tt), k))

        def swap(rows, sign: float) -> None:
            """``sign * R[t, k]`` in ``rows`` becomes ``sign * sum_{o reads} Ro[t, k, o]``."""
            put(rows, r_cols, -sign)
            for o in reading:
                put(rows, hm.ro[(k, o)] + (tt - k), sign)

        swap(base["read"] + flat.read_off[e] + (tt - k), 1.0)
        swap(base["eager"] + flat.off_d[e] + (tt - k), -1.0)
        for i in pairs_of.get(e, ()):
            a = int(flat.pair_a[i])
            swap(base["pair"] + flat.pair_off[i] + (tt - k), 1.0)
            swap(base["eager"] + flat.off_d[a] + (tt - flat.e_k[a]), 1.0)


def solution_sequence(hm: HierModel, x: np.ndarray) -> tuple[list[int], list[tuple[int, int, int | None]]]:
    """Full-graph compute sequence of a solution, and its top steps (phase, node, option)."""
    top, flat = hm.top, hm.flat
    T = len(top.graph.nodes)
    steps: list[tuple[int, int, int | None]] = []
    seq: list[int] = []
    for t in range(T):
        for k in range(t + 1):
            if x[flat.r(t, k)] <= 0.5:
                continue
            o = None
            if top.kind[k] in ("F", "B"):
                n_o = len(top.costs[top.block[k]])
                o = int(np.argmax([x[hm.ro_col(k, q, t)] for q in range(n_o)]))
            steps.append((t, k, o))
            seq.extend(top.sequence(k, o))
    return seq, steps


def lowest_budget_met(hm: HierModel, x: np.ndarray) -> int:
    """The lowest budget (bytes) whose model, with ``hm``'s memory unit and save budget, still
    admits ``x``: the budget enters the model only as the bound of its memory rows and
    columns, so ``x`` meets every budget from there up. Why it matters: a solution proved
    optimal at one budget is then optimal at every budget down to this one, where a MILP
    could only find its objective again (:meth:`~hiremate.solvers.hilp.top.HilpTop._search`
    does not try them)."""
    milp, unit = hm.milp, hm.flat.mem_unit
    cap = _cap(hm.flat.budget, unit)
    near = 1e-12 * max(abs(cap), 1.0)
    rows = np.flatnonzero(np.abs(milp.row_hi - cap) <= near)
    cols = np.flatnonzero(np.abs(milp.col_hi - cap) <= near)
    used = max(float((milp.A[rows] @ x).max(initial=0.0)), float(x[cols].max(initial=0.0)))
    # the inverse of _cap, rounded up: at that budget the bound is at least ``used``
    return int(np.ceil(used * unit - 0.5 + MEM_MARGIN * unit))


def carry_solution(old: HierModel, x: np.ndarray, new: HierModel) -> np.ndarray | None:
    """A solution ``x`` of ``old`` as a solution of ``new`` (a warm start): ``new`` is the model
    of the same top graph with the same memory unit under a budget at least as high, whose
    blocks' menus may hold more options (each old option is found among the new ones by its
    figures). None when the top graphs or the memory units differ (the layout or the scale of
    the memory columns would differ) or the budget or the save budget is lower (``x`` could
    break it)."""
    t_old, t_new = old.top, new.top
    old_save, new_save = old.flat.save_budget, new.flat.save_budget
    same = (t_old.kind == t_new.kind and t_old.data_full == t_new.data_full
            and old.flat.budget <= new.flat.budget and old.flat.mem_unit == new.flat.mem_unit
            and (new_save is None or (old_save is not None and old_save <= new_save))
            and all(a.inputs == b.inputs and a.outputs == b.outputs
                    for a, b in zip(t_old.graph.nodes, t_new.graph.nodes)))
    n0 = old.flat.milp.shape[1]
    if not same or new.flat.milp.shape[1] != n0:
        return None
    where: list[list[int]] = []
    for c_old, c_new in zip(t_old.costs, t_new.costs):
        idx = []
        for oc in c_old:
            hits = [q for q, other in enumerate(c_new) if other == oc]
            if not hits:
                return None
            idx.append(hits[0])
        where.append(idx)
    if (t_old.opt_reads is None) != (t_new.opt_reads is None):
        return None
    if t_old.opt_reads is not None:
        for k, kind in enumerate(t_old.kind):
            if kind in ("F", "B") and any(
                    rd != t_new.opt_reads[k][where[t_old.block[k]][o]]
                    for o, rd in enumerate(t_old.opt_reads[k])):
                return None  # a row of the new model reads differently: x could break it
    T = len(t_old.graph.nodes)
    y = np.zeros(new.milp.shape[1])
    y[:n0] = x[:n0]
    for (k, o), col in old.ro.items():
        q = where[t_old.block[k]][o]
        y[new.ro[(k, q)]:new.ro[(k, q)] + T - k] = x[col:col + T - k]
    for (j, o), col in old.sp.items():
        f = t_old.fwd_node(j)
        q = where[j][o]
        y[new.sp[(j, q)]:new.sp[(j, q)] + T - f] = x[col:col + T - f]
    return y
