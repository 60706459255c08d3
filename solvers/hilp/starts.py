"""Feasible points of the hierarchical H-ILP (:mod:`hiremate.solvers.hilp.hier`) built from
plain plans: the start of its branch and bound, and the floor under its result, so that a
search stopped by its work limit never returns a schedule worse than the plan.

Two kinds of plan: every top node once, in order, with each block's fastest or least-memory
option (:func:`plan_start`, the backend's start), and a block chain's sequence of operations as
rk-Rotor returns it (:func:`chain_start`, a floor only), whose recomputations let it meet
budgets where every plan of the first kind keeps too much. Why the second: at a tight budget
the first kind fits nothing, and a MILP stopped by its work limit may then return nothing, or
a schedule slower than rk-Rotor's for the same blocks. Each plan fixes the model's ``R`` and
``Ro`` columns; the rest of the point (liveness, deletions, memory) is completed by the
backend on the model so fixed, which leaves it no choice that changes the objective.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable

import numpy as np

from hiremate.solvers.hilp.hier import HierModel

#: a stage's steps: (top node, option or None for the loss and tail nodes), in running order
Stage = list[tuple[int, int | None]]


def plan_start(hm: HierModel, solve: Callable) -> np.ndarray | None:
    """Every top node once, in index order (store-everything at the top level), each block
    with its fastest option; where that does not fit the abstract budget, each block with its
    least-memory option (a standalone one, e.g. the checkpoint option, which keeps only the
    block's outputs). None when neither plan fits the model."""
    top = hm.top
    T = len(top.graph.nodes)

    def total(oc) -> float:
        return oc.fwd_time + oc.bwd_time

    fastest = [min(range(len(cs)), key=lambda o: (total(cs[o]), o)) for cs in top.costs]
    lightest = [min(range(len(cs)), key=lambda o: (not cs[o].standalone, cs[o].phantom,
                                                   total(cs[o]), o)) for cs in top.costs]
    for choice in ([fastest] if fastest == lightest else [fastest, lightest]):
        stages = [[(k, choice[top.block[k]] if top.kind[k] in ("F", "B") else None)]
                  for k in range(T)]
        x = _complete(hm, stages, solve)
        if x is not None:
            return x
    return None


def chain_start(hm: HierModel, ops: Iterable[Any], solve: Callable) -> np.ndarray | None:
    """The point of ``ops``, a block chain's operations (rk-Rotor's ``BlockOp``: ``Fn(i, o)``,
    ``Fe(i)``, ``Fc(i)``, ``B(i, o)``, ``Loss``; blocks numbered from 1 in the top graph's
    order), or None when they are not a plan of this model's form (:func:`chain_stages`) or
    it does not fit the model's budget."""
    stages = chain_stages(hm, ops)
    return None if stages is None else _complete(hm, stages, solve)


def chain_stages(hm: HierModel, ops: Iterable[Any]) -> list[Stage] | None:
    """``ops`` as the model's stages: stage ``t`` runs top node ``t`` for the first time,
    after the recomputations since the previous first run, which must be of distinct nodes in
    increasing index order (the model runs a stage's nodes in that order). ``Fe`` and ``Fc``
    (a forward that keeps nothing but its outputs) run the block's fastest standalone option;
    a block without one has no such forward here. Tail nodes, which a chain does not name, run
    once, in their own stages. None where the operations do not fit that form."""
    top = hm.top
    T = len(top.graph.nodes)
    fwd = {j: top.fwd_node(j) for j in range(len(top.costs))}
    bwd = {top.block[k]: k for k in range(T) if top.kind[k] == "B"}
    light = {}
    for j, cs in enumerate(top.costs):
        alone = [o for o, oc in enumerate(cs) if oc.standalone]
        if alone:
            light[j] = min(alone, key=lambda o: (cs[o].fwd_time, o))
    stages: list[Stage] = []
    pending: Stage = []
    for op in ops:
        j = op.block - 1
        if op.kind == "Loss":
            step = (top.kind.index("loss"), None)
        elif op.kind in ("Fe", "Fc"):
            if j not in light:
                return None
            step = (fwd[j], light[j])
        elif op.kind == "Fn":
            step = (fwd[j], int(op.option))
        else:
            step = (bwd[j], int(op.option))
        k = step[0]
        if k < len(stages):  # run before: a recomputation, in this stage's order
            if pending and pending[-1][0] >= k:
                return None
            pending.append(step)
            continue
        while len(stages) < k and top.kind[len(stages)] == "tail":
            stages.append([(len(stages), None)])
        if len(stages) != k:
            return None  # a node first run out of the model's order
        stages.append(pending + [step])
        pending = []
    while len(stages) < T and top.kind[len(stages)] == "tail":
        stages.append([(len(stages), None)])
    return stages if len(stages) == T and not pending else None


def _complete(hm: HierModel, stages: list[Stage], solve: Callable) -> np.ndarray | None:
    """The model's point whose ``R`` and ``Ro`` are ``stages``' (the rest completed by
    ``solve``), or None when it does not fit."""
    top, flat = hm.top, hm.flat
    T = len(top.graph.nodes)
    lo, hi = hm.milp.col_lo.copy(), hm.milp.col_hi.copy()
    rt, rk = np.tril_indices(T)
    lo[flat.r(rt, rk)] = hi[flat.r(rt, rk)] = 0.0
    chosen: dict[tuple[int, int], int] = {}
    for t, stage in enumerate(stages):
        for k, o in stage:
            lo[flat.r(t, k)] = hi[flat.r(t, k)] = 1.0
            if o is not None:
                chosen[(t, k)] = o
    for (k, o), first in hm.ro.items():  # Ro[t, k, o], t = k .. T-1
        on = np.array([float(chosen.get((t, k)) == o) for t in range(k, T)])
        lo[first:first + T - k] = hi[first:first + T - k] = on
    res = solve(replace(hm.milp, col_lo=lo, col_hi=hi))
    return res.x if res.has_solution else None


#: the share of a top-level MILP's work limit that it spends looking for its first schedule when
#: no plan fits its budget (:func:`from_cold`); 1, the whole limit, by default: a first schedule
#: can lie deep in the tree, and the shares tried traded a schedule the whole search finds for
#: a faster refusal (docs/design.md, "Each top-level MILP starts from a feasible point")
COLD_SHARE = 1.0


def cold_work(work: float, integral_work: bool, share: float = COLD_SHARE) -> float:
    """The work a MILP without a starting point gets for its first schedule: ``share`` of
    ``work``, in whole units where the backend counts nodes, at least one."""
    cold = work * share
    return float(max(1, round(cold))) if integral_work else cold


def from_cold(solve: Callable[[np.ndarray | None, float], Any], work: float,
              integral_work: bool, share: float = COLD_SHARE) -> Any:
    """A MILP with no starting point, in two parts whose sum is its ``work``: the first schedule
    within :func:`cold_work` (a search that finds none by then ends there: ``unknown``), then
    the rest of the work from that schedule, unless the first part already proved it optimal.
    Why: a branch and bound that must also find its first point may spend its whole work limit
    finding none at a budget nothing meets, while the solve that is no better than a refusal
    takes minutes. ``solve(start, work)`` solves the MILP from ``start`` within ``work``."""
    first = cold_work(work, integral_work, share)
    if first >= work:
        return solve(None, work)
    res = solve(None, first)
    if not res.has_solution or res.status == "optimal":
        return res
    return solve(res.x, work - first)
