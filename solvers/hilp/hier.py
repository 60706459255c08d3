"""Hierarchical H-ILP: the top-level MILP over blocks with option menus (HiRemate, section
3.2.2 and appendix B).

Why a separate module from :mod:`hiremate.solvers.hilp.model`: the flat formulation stays the
one that must agree with the simulator node by node; here it is *reused* on a small top graph
and extended with what options and phantoms add, so both share every liveness constraint.

The top graph (:func:`top_graph`) has one compute node per block forward ``F_j`` and per block
backward ``B_j``, the loss node, and the top-level (tail) backward nodes. Its data nodes are
the *interface* values of the full graph: those produced by one top node and read by another,
plus the model outputs and the final gradients. A block's internal values are not data nodes;
what its forward keeps for its backward is the block's *phantom*, whose size depends on the
option. Dependencies are the union over the block's options (an option that does not read an
interface value still keeps it alive: conservative, see ``bench/bench_hilp_hier.py``).

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
whole step profile rather than one overhead figure); the finer per-sub-step terms that credit
inputs freed inside a block are not modelled (conservative).
"""

from __future__ import annotations

import heapq
import time as _time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import scipy.sparse as sp

from hiremate.errors import SolverError
from hiremate.ir.graph import ComputeNode, DataNode, Graph, NodeKind
from hiremate.ir.option import Option
from hiremate.ir.schedule import Compute
from hiremate.ir.simulator import trace
from hiremate.ir.tracker import counted_sizes

from hiremate.solvers.hilp.model import HilpModel, Milp, _cap, _Rows, build_model

if TYPE_CHECKING:
    from hiremate.ir.blocks import Block, TopProblem


#: a step profile: (memory above the rest while the step runs, top-level inputs already read
#: for the last time in the part: freed by then when the level above frees them after the node)
Profile = tuple[tuple[int, frozenset], ...]


@dataclass(frozen=True)
class OptionCost:
    """One option as the top level sees it (bytes and seconds, full-graph compute ids)."""

    fwd_time: float
    bwd_time: float
    fwd_peak: int   # memory above everything else alive while the forward part runs
    bwd_peak: int   # the same for the backward part, beyond the block's phantom and grads in
    phantom: int
    fwd_seq: tuple[int, ...]
    bwd_seq: tuple[int, ...]
    fwd_profile: Profile = ()
    bwd_profile: Profile = ()
    solver: str = ""
    #: the backward part reads no value of the block's forward but its outputs (it recomputes
    #: what it needs) and the forward part keeps nothing else: the option's forward and
    #: backward need not pair up (``standalone`` in :func:`build_hier_model`)
    standalone: bool = False


def _prune(entries: list[tuple[int, frozenset]]) -> Profile:
    """Keep, per set of freed inputs, the highest memory; drop an entry that another with no
    more credits and at least as much memory covers. The sets grow along a part (an input read
    for the last time stays so), hence at most ``inputs + 1`` entries remain."""
    best: dict[frozenset, int] = {}
    for w, fr in entries:
        best[fr] = max(best.get(fr, w), w)
    items = sorted(best.items(), key=lambda kv: (len(kv[0]), -kv[1]))
    kept: list[tuple[int, frozenset]] = []
    for fr, w in items:
        if not any(w2 >= w and f2 <= fr for w2, f2 in kept):
            kept.append((w, fr))
    return tuple(kept)


@dataclass
class TopGraph:
    """The top graph and what links it to the blocks and the full graph."""

    graph: Graph
    kind: list[str]            # per top node: "F", "B", "loss" or "tail"
    block: list[int]           # block index for F/B nodes, -1 otherwise
    full: list[int]            # full compute id for loss/tail nodes, -1 otherwise
    costs: list[list[OptionCost]]  # per block
    data_full: list[int]       # top data id -> full data id

    def fwd_node(self, j: int) -> int:
        return self.kind.index("F") + j

    def sequence(self, k: int, option: int | None) -> list[int]:
        """Full-graph compute ids that top node ``k`` (with ``option``) stands for."""
        if self.kind[k] == "F":
            return list(self.costs[self.block[k]][option].fwd_seq)
        if self.kind[k] == "B":
            return list(self.costs[self.block[k]][option].bwd_seq)
        return [self.full[k]]


def option_costs(block: "Block", option: Option) -> OptionCost:
    """Top-level figures of ``option`` from its step profile on the block's CD-graph.

    Forward, per step: the memory of the part (outputs and internal values; the block's inputs
    are sources there, so not counted), which is what the full graph adds while it runs.
    Backward, per step: ``memory - gradients in still alive``, minus the phantom and minus the
    outputs the part does not recompute (the level above holds the phantom and all gradients
    in; an output the part does not recompute is either alive above, or absent in the full
    graph too). Each step also lists the inputs (full ids) read for the last time before it:
    the B.3 correction credits them when the level above frees them after the node."""
    sub = block.graph
    dmap = block.data_map
    counted = counted_sizes(sub)
    grads_in = set(sub.nodes[sub.loss].outputs)
    outs = set(sub.outputs)
    parts = (list(option.fwd), list(option.bwd))
    # last compute-step index of each read, per part (full data ids)
    last: list[dict[int, int]] = []
    for part in parts:
        lr: dict[int, int] = {}
        for i, step in enumerate(part):
            if isinstance(step, Compute):
                for d in sub.nodes[step.node].inputs:
                    lr[dmap[d]] = i
        last.append(lr)

    def freed(p: int, i: int, strict: bool) -> frozenset:
        return frozenset(d for d, li in last[p].items() if (li < i if strict else li <= i))

    # the simulator's step rule over forward part, loss, backward part
    cut = len(parts[0])
    tr = trace(sub, tuple(parts[0]) + (Compute(sub.loss),) + tuple(parts[1]))
    fwd: list[tuple[int, frozenset]] = []
    for i, step in enumerate(parts[0]):
        if isinstance(step, Compute):
            fwd.append((tr.during[i], freed(0, i, True)))
        fwd.append((tr.after[i], freed(0, i, False)))
    held = tr.after[cut - 1] if cut else tr.start
    g_alive = tr.after[cut] - held  # the gradients in, made by the loss
    bwd_raw: list[tuple[int, frozenset]] = []
    recomputed: set[int] = set()
    made_bwd: set[int] = set()
    reads_fwd = False  # the backward part reads a forward value it did not make (not an output)
    for i, step in enumerate(parts[1]):
        j = cut + 1 + i
        if isinstance(step, Compute):
            node = sub.nodes[step.node]
            reads_fwd = reads_fwd or any(
                d not in made_bwd and d not in outs and sub.data[d].producer is not None
                and sub.data[d].producer != sub.loss
                and sub.nodes[sub.data[d].producer].kind is NodeKind.FWD for d in node.inputs)
            made_bwd.update(node.outputs)
            recomputed.update(d for d in node.outputs if d in outs)
            bwd_raw.append((tr.during[j] - g_alive, freed(1, i, True)))
        else:
            g_alive -= sum(counted[d] for d in tr.freed[j] if d in grads_in)
        bwd_raw.append((tr.after[j] - g_alive, freed(1, i, False)))
    out_b = sum(counted[d] for d in outs)
    phantom = max(held - out_b, 0)
    less = phantom + sum(counted[d] for d in outs - recomputed)
    bwd = [(max(w - less, 0), fr) for w, fr in bwd_raw]
    fwd_p, bwd_p = _prune(fwd), _prune(bwd)
    return OptionCost(
        fwd_time=option.fwd_time, bwd_time=option.bwd_time,
        fwd_peak=max((w for w, _ in fwd_p), default=0),
        bwd_peak=max((w for w, _ in bwd_p), default=0), phantom=phantom,
        fwd_seq=tuple(block.sequence(option.fwd)), bwd_seq=tuple(block.sequence(option.bwd)),
        fwd_profile=fwd_p, bwd_profile=bwd_p, solver=option.solver,
        standalone=phantom == 0 and held == out_b and not reads_fwd)


def checkpoint_options(block: "Block") -> list[Option]:
    """The block's *checkpoint* option, when its menu lacks one with no phantom: the forward
    keeps only the outputs, the backward recomputes the whole forward first. H-ILP's forward
    always leaves its option's phantom (constraints 7-8), so without such an option a block
    whose menu holds only large phantoms can never be recomputed from its input alone (what
    rk-Rotor's ``Fc`` operation does)."""
    from hiremate.solvers.menu import option_from_schedule
    from hiremate.ir.sequence import sequence_to_schedule

    if any(o.phantom == 0 for o in block.options):
        return []
    sub = block.graph
    fwd = [n.id for n in sub.fwd_nodes]
    seq = fwd + [sub.loss] + fwd + [n.id for n in sub.bwd_nodes]
    try:
        return [option_from_schedule(sub, sequence_to_schedule(sub, seq), "checkpoint")]
    except Exception:  # an invalid sequence (should not happen): go without the option
        return []


def top_graph(problem: "TopProblem", checkpoint: bool = True) -> TopGraph:
    """Contract the full graph's blocks into ``F_j`` / ``B_j`` nodes (see module docstring);
    ``checkpoint`` adds each block's checkpoint option where its menu lacks one."""
    graph = problem.graph
    blocks = problem.blocks
    L = len(blocks)
    costs = [[option_costs(b, o) for o in b.options + (checkpoint_options(b) if checkpoint else [])]
             for b in blocks]
    if any(not c for c in costs):
        raise SolverError("hierarchical H-ILP needs at least one option per block")
    # top node "names": ("F", j), ("loss",), ("B", j), ("tail", id)
    owner: dict[int, tuple] = {graph.loss: ("loss", -1)}
    for j, b in enumerate(blocks):
        owner.update({n: ("F", j) for n in b.fwd})
        owner.update({n: ("B", j) for n in b.bwd})
    owner.update({n: ("tail", n) for n in problem.tail})
    outs_of = [{b.data_map[d] for d in b.graph.outputs} for b in blocks]

    def reads(seqs: Sequence[Sequence[int]], own: set[tuple], allowed: set[int]) -> set[int]:
        """Non-source data read by any of ``seqs`` before the sequence produces it, produced
        by a top node outside ``own`` (or in ``allowed``: a block's outputs read by its
        backward; the block's other forward values are its phantom)."""
        found: set[int] = set()
        for seq in seqs:
            made: set[int] = set()
            for nid in seq:
                node = graph.nodes[nid]
                for d in node.inputs:
                    p = graph.data[d].producer
                    if p is None or d in made:
                        continue
                    if owner[p] not in own or d in allowed:
                        found.add(d)
                made.update(node.outputs)
        return found

    names: list[tuple] = [("F", j) for j in range(L)] + [("loss", -1)]
    names += [("B", j) for j in range(L)] + [("tail", n) for n in problem.tail]
    inputs: dict[tuple, set[int]] = {}
    for j in range(L):
        inputs[("F", j)] = reads([c.fwd_seq for c in costs[j]], {("F", j)}, set())
        inputs[("B", j)] = reads([c.bwd_seq for c in costs[j]], {("F", j), ("B", j)},
                                 outs_of[j])
    for nm in (("loss", -1),) + tuple(("tail", n) for n in problem.tail):
        nid = graph.loss if nm[0] == "loss" else nm[1]
        inputs[nm] = {d for d in graph.nodes[nid].inputs if graph.data[d].producer is not None}
    # interface data: read across top nodes, model outputs, final gradients
    keep = set(graph.outputs) | set(graph.final_data)
    iface = set().union(*inputs.values()) | {d for d in keep if graph.data[d].producer is not None}
    # order: forward nodes as the blocks come, then the backward side topologically
    deps: dict[tuple, set[tuple]] = {nm: set() for nm in names}
    for nm, ins in inputs.items():
        for d in ins:
            src = owner[graph.data[d].producer]
            if src != nm:
                deps[nm].add(src)
    for j in range(L):
        if any(s[0] != "F" or s[1] >= j for s in deps[("F", j)]):
            raise SolverError(f"block {j}'s forward reads a later block: the blocks are not in "
                              "a topological order")
    back = [nm for nm in names if nm[0] in ("B", "tail")]
    key = {nm: min(blocks[nm[1]].bwd, default=10**9) if nm[0] == "B" else nm[1] for nm in back}
    placed: set[tuple] = set(names[:L + 1])
    heap = [(key[nm], nm) for nm in back if deps[nm] <= placed]
    heapq.heapify(heap)
    queued = {nm for _, nm in heap}
    order: list[tuple] = []
    while heap:
        _, nm = heapq.heappop(heap)
        order.append(nm)
        placed.add(nm)
        for other in back:
            if other not in queued and deps[other] <= placed:
                heapq.heappush(heap, (key[other], other))
                queued.add(other)
    if len(order) != len(back):
        raise SolverError("the blocks' backward parts depend on each other in a cycle; the "
                          "hierarchical H-ILP needs a partition whose contraction is acyclic")
    names = names[:L + 1] + order
    tid = {nm: i for i, nm in enumerate(names)}
    data_full = sorted(iface)
    did = {d: i for i, d in enumerate(data_full)}
    produced: dict[tuple, list[int]] = {nm: [] for nm in names}
    for d in data_full:
        produced[owner[graph.data[d].producer]].append(did[d])
    data = [DataNode(i, graph.data[d].name, graph.data[d].kind, graph.data[d].shape,
                     graph.data[d].dtype, graph.data[d].size,
                     tid[owner[graph.data[d].producer]]) for i, d in enumerate(data_full)]
    nodes = []
    for i, nm in enumerate(names):
        ins = tuple(sorted(did[d] for d in inputs[nm]))
        outs = tuple(sorted(produced[nm]))
        if nm[0] in ("F", "B"):
            kind = NodeKind.FWD if nm[0] == "F" else NodeKind.BWD
            nodes.append(ComputeNode(i, f"{nm[0]}{nm[1]}", kind, ins, outs))
        else:
            src = graph.nodes[graph.loss if nm[0] == "loss" else nm[1]]
            nodes.append(ComputeNode(i, src.name, src.kind, ins, outs, src.time, src.overhead))
    top = Graph(nodes, data, [did[d] for d in graph.outputs if d in did])
    return TopGraph(top, [nm[0] for nm in names], [nm[1] if nm[0] in ("F", "B") else -1
                                                   for nm in names],
                    [graph.loss if nm[0] == "loss" else nm[1] if nm[0] == "tail" else -1
                     for nm in names], costs, data_full)


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
            # get rows of their own, with the B.3 credits for inputs freed after the node
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
