"""FastSA: simulated annealing over a slotted node sequence (Imanishi et al., 2023).

Why annealing: on general graphs the exact formulations (Checkmate-style ILPs) grow with the
square of the graph, while random local edits of a *sequence* (add a recomputation, remove one,
move a node) are cheap to evaluate with an add-max segment tree (:mod:`fastsa_state`), and they
may also reorder nodes, which fixed-order methods cannot.

The pipeline (paper sections 2.2, 2.2.2, C.1, D.4):

1. the initial sequence is the graph's own order, spread over ``gap`` slots per node;
2. node grouping (Algorithm 1): a forward node whose outputs are no larger than its inputs is
   fused into each of its consumers, so recomputing a whole run of cheap-to-store nodes is one
   mutation; a first annealing runs on grouped nodes and stops as soon as the budget is met;
3. the groups are expanded and a second, colder annealing removes redundant work.

Objective: ``max(budget, M(S)) * C(S)``. Mutations: add a recomputation of a forward node at a
free slot, remove a placed forward node, or move any non-loss node to a free slot (within a
window around its slot, so that moves are mostly valid). Only forward nodes that produce no
model output are ever added or removed: the loss and the backward nodes run exactly once.

Everything is seeded (``random.Random(seed)``) and deterministic.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Iterable

from hiremate.errors import InfeasibleBudgetError
from hiremate.graph import FINAL_KINDS, SOURCE_KINDS, Graph
from hiremate.option import Option, pareto_front
from hiremate.schedule import Schedule
from hiremate.simulator import simulate
from hiremate.solvers.fastsa_state import NOP, NodeTable, SlotState
from hiremate.solvers.hilp_menu import option_from_schedule
from hiremate.solvers.remat_sequence import sequence_to_schedule
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)


@dataclass
class AnnealStats:
    """Counters of one annealing run: attempts (mutations drawn), evaluated (valid ones whose
    objective was computed), accepted, and wall time."""

    attempts: int = 0
    evaluated: int = 0
    accepted: int = 0
    seconds: float = 0.0

    @property
    def attempts_per_s(self) -> float:
        return self.attempts / self.seconds if self.seconds else 0.0

    @property
    def evaluated_per_s(self) -> float:
        return self.evaluated / self.seconds if self.seconds else 0.0


def _data_facts(graph: Graph) -> tuple[list[int], list[bool], list[bool]]:
    keep = set(graph.outputs) | {d.id for d in graph.data if d.kind in FINAL_KINDS}
    sizes = [d.size if d.counted else 0 for d in graph.data]
    kept = [d.id in keep for d in graph.data]
    source = [d.kind in SOURCE_KINDS for d in graph.data]
    return sizes, kept, source


def primitive_table(graph: Graph) -> NodeTable:
    """One table entry per compute node, in id order (entry ``i`` is node ``i``)."""
    _, kept, source = _data_facts(graph)
    table = NodeTable()
    for n in graph.nodes:
        fixed = not n.is_fwd or any(kept[d] for d in n.outputs)
        table.add([d for d in n.inputs if not source[d]], list(n.outputs), n.time, n.overhead,
                  fixed, n.is_bwd, (n.id,))
    return table


def _group_overhead(graph: Graph, members: tuple[int, ...], ins: set[int], outs: set[int],
                    sizes: list[int]) -> int:
    """Peak of the values internal to a group while it runs (paper B.1)."""
    last_use: dict[int, int] = {}
    for k, m in enumerate(members):
        for d in graph.nodes[m].inputs:
            last_use[d] = k
    alive = 0
    peak = 0
    internal_alive: dict[int, int] = {}
    for k, m in enumerate(members):
        node = graph.nodes[m]
        internal = [d for d in node.outputs if d not in outs and d not in ins]
        during = alive + sum(sizes[d] for d in internal) + node.overhead
        peak = max(peak, during)
        for d in internal:
            if d not in internal_alive and last_use.get(d, -1) > k:
                internal_alive[d] = sizes[d]
                alive += sizes[d]
        for d in list(internal_alive):
            if last_use.get(d, -1) <= k:
                alive -= internal_alive.pop(d)
    return peak


def group_nodes(graph: Graph, table: NodeTable, max_members: int = 24
                ) -> tuple[NodeTable, list[int]]:
    """Node grouping (paper Algorithm 1, appendix C.1) over the graph's own order.

    A recomputable forward node whose (counted) outputs are at least as large as its inputs is
    fused into every consumer, provided each consumer reads all its outputs, none is the loss,
    and no group grows beyond ``max_members`` nodes. Returns the grouped table and the grouped
    initial sequence (table indices).
    """
    sizes, _, _ = _data_facts(graph)
    n = len(graph.nodes)
    ins = [set(table.ins[i]) for i in range(n)]
    outs = [set(table.outs[i]) for i in range(n)]
    members = [list(table.members[i]) for i in range(n)]
    cost = list(table.cost)
    alive = [True] * n
    consumers: list[set[int]] = [set() for _ in range(n)]
    readers_of: dict[int, set[int]] = {}
    for i in range(n):
        for d in ins[i]:
            readers_of.setdefault(d, set()).add(i)
    prod_of: dict[int, set[int]] = {}
    for i in range(n):
        for d in outs[i]:
            consumers[i] |= readers_of.get(d, set())
            prod_of.setdefault(d, set()).add(i)
    loss = graph.loss
    for i in range(n):
        if not alive[i] or table.movable_only[i]:
            continue
        if sum(sizes[d] for d in ins[i]) > sum(sizes[d] for d in outs[i]):
            continue
        users = sorted(j for j in consumers[i] if alive[j])
        if not users or loss in users:
            continue
        if any(not outs[i] <= ins[j] for j in users):
            continue
        if any(len(members[i]) + len(members[j]) > max_members for j in users):
            continue
        for j in users:
            ins[j] = ins[i] | (ins[j] - outs[i])
            outs[j] = (outs[i] - ins[j]) | outs[j]
            members[j] = members[i] + members[j]
            cost[j] += cost[i]
            for d in ins[i]:
                for p in prod_of.get(d, ()):
                    consumers[p].add(j)
        for d in outs[i]:
            prod_of[d].discard(i)
        alive[i] = False
    grouped = NodeTable()
    order: list[int] = []
    for i in range(n):
        if not alive[i]:
            continue
        mem = tuple(members[i])
        ov = table.overhead[i] if len(mem) == 1 else _group_overhead(
            graph, mem, ins[i], outs[i], sizes)
        idx = grouped.add(sorted(ins[i]), sorted(outs[i]), cost[i], ov,
                          table.movable_only[i], table.after_loss[i], mem)
        order.append(idx)
    return grouped, order


class FastSA:
    """FastSA as a whole-graph solver and as a menu (bottom) solver.

    ``schedule`` returns the best schedule found; when its simulated peak is above the budget it
    raises :class:`InfeasibleBudgetError` with ``min_budget`` = the lowest peak it reached (not a
    proven minimum). Returned schedules are replayed by ``hiremate.simulate``.
    """

    name = "fastsa"

    def __init__(self, seed: int = 0, iters_grouped: int = 200_000, iters_fine: int = 100_000,
                 time_limit: float = 25.0, gap: int = 3, grouping: bool = True,
                 move_window: int = 64, max_nodes: int = 20_000):
        self.seed = seed
        self.iters_grouped = iters_grouped
        self.iters_fine = iters_fine
        self.time_limit = time_limit
        self.gap = gap
        self.grouping = grouping
        self.move_window = move_window
        self.max_nodes = max_nodes
        self.last_stats: list[AnnealStats] = []

    def applicable(self, graph: Graph) -> bool:
        return 0 < len(graph) <= self.max_nodes

    # -- annealing ---------------------------------------------------------------------------
    def anneal(self, state: SlotState, budget: int, iters: int, temp0: float, temp1: float,
               rng: random.Random, stop_when_feasible: bool, deadline: float) -> AnnealStats:
        """Run ``iters`` mutations (or until ``deadline``); the state keeps the final sequence."""
        table = state.table
        seq = state.seq
        T = state.T
        can_add, can_remove = state.can_add, state.can_remove
        add, remove = state.add, state.remove
        pool = [x for x in range(len(table)) if not table.movable_only[x]]
        fixed = table.movable_only
        loss_slot = state.loss_slot
        rand = rng.random
        randrange = rng.randrange
        exp = math.exp
        window = self.move_window
        stats = AnnealStats()
        start = time.perf_counter()
        f = max(budget, state.peak) * state.cost
        log_ratio = math.log(temp1 / temp0) if temp0 > 0 and temp1 > 0 else 0.0
        temp = temp0
        npool = len(pool)
        for it in range(iters):
            if it & 1023 == 0:
                temp = temp0 * exp(log_ratio * it / iters)
                if time.perf_counter() > deadline:
                    break
                if stop_when_feasible and state.peak <= budget:
                    break
            stats.attempts += 1
            r = rand()
            if r < 0.34:  # add a (re)computation
                if not npool:
                    continue
                x = pool[randrange(npool)]
                t = randrange(T)
                if seq[t] != NOP or not can_add(x, t):
                    continue
                add(x, t)
                undo = (remove, x, t)
            elif r < 0.67:  # remove a computation
                t = randrange(T)
                x = seq[t]
                if x == NOP or fixed[x] or not can_remove(x, t):
                    continue
                remove(x, t)
                undo = (add, x, t)
            else:  # move a node to a free slot nearby
                t1 = randrange(T)
                x = seq[t1]
                if x == NOP or t1 == loss_slot:
                    continue
                t2 = t1 + randrange(-window, window + 1)
                if t2 < 0 or t2 >= T or seq[t2] != NOP:
                    continue
                if not can_add(x, t2) or not can_remove(x, t1, t2):
                    continue
                add(x, t2)
                remove(x, t1)
                stats.evaluated += 1
                g = max(budget, state.peak) * state.cost
                if g <= f or rand() < exp((f - g) / temp):
                    f = g
                    stats.accepted += 1
                else:
                    add(x, t1)
                    remove(x, t2)
                continue
            stats.evaluated += 1
            g = max(budget, state.peak) * state.cost
            if g <= f or rand() < exp((f - g) / temp):
                f = g
                stats.accepted += 1
            else:
                undo[0](undo[1], undo[2])
        stats.seconds = time.perf_counter() - start
        return stats

    def _state(self, graph: Graph, table: NodeTable, order: list[int]) -> SlotState:
        sizes, kept, _ = _data_facts(graph)
        loss_idx = next(i for i in order if table.members[i] == (graph.loss,))
        return SlotState(table, order, len(graph.data), sizes, kept, loss_idx, self.gap)

    def solve(self, graph: Graph, budget: int) -> tuple[list[int], int, float]:
        """Anneal; return the compute sequence (node ids), its peak and time (simulated)."""
        rng = random.Random(self.seed)
        deadline = time.perf_counter() + self.time_limit
        base = primitive_table(graph)
        self.last_stats = []
        if self.grouping:
            table, order = group_nodes(graph, base)
        else:
            table, order = base, list(range(len(graph.nodes)))
        state = self._state(graph, table, order)
        f0 = max(budget, state.peak) * state.cost
        temp0 = 1e-3 * f0 if f0 > 0 else 1.0
        temp1 = 1e-4 * temp0
        st = self.anneal(state, budget, self.iters_grouped, temp0, temp1, rng, True, deadline)
        self.last_stats.append(st)
        # ungroup: expand every placed group into its members, then anneal colder
        flat = [m for x in state.order() for m in table.members[x]]
        fine = self._state(graph, base, flat)
        t_fine = temp1 if st.attempts < self.iters_grouped else temp0 * 1e-2
        st2 = self.anneal(fine, budget, self.iters_fine, t_fine, 1e-4 * t_fine, rng, False,
                          max(deadline, time.perf_counter() + 0.1 * self.time_limit))
        self.last_stats.append(st2)
        # the graph's own order (store-all with eager frees) is a candidate too: annealing ends
        # where its random walk stops, not at the best state it visited, so without it FastSA
        # could refuse a budget that the unmodified sequence meets
        candidates = [flat, fine.order(), list(range(len(graph.nodes)))]
        best: tuple | None = None
        for seq in candidates:
            res = simulate(graph, sequence_to_schedule(graph, seq))
            if not res.valid:
                log.warning("FastSA produced an invalid sequence: %s", res.error)
                continue
            key = (max(res.peak, budget), res.time, res.peak)
            if best is None or key < best[0]:
                best = (key, seq, res.peak, res.time)
        if best is None:
            raise RuntimeError("FastSA: no valid sequence (a bug)")
        return best[1], best[2], best[3]

    # -- solver protocol ---------------------------------------------------------------------
    def schedule(self, graph: Graph, budget: int) -> Schedule:
        seq, peak, _ = self.solve(graph, budget)
        if peak > budget:
            raise InfeasibleBudgetError(
                f"FastSA did not fit {graph!r} in {fmt_bytes(budget)}: the best sequence it "
                f"found peaks at {fmt_bytes(peak)}; raise the budget, give it more iterations "
                "(iters_grouped, time_limit) or another seed",
                min_budget=peak,
            )
        return sequence_to_schedule(graph, seq)

    def menu(self, graph: Graph, budgets: Iterable[int]) -> list[Option]:
        """One option per budget that FastSA meets (budgets are whole-subgraph peaks),
        Pareto-filtered."""
        options = []
        for b in budgets:
            seq, peak, _ = self.solve(graph, b)
            if peak <= b:
                options.append(option_from_schedule(graph, sequence_to_schedule(graph, seq),
                                                    self.name))
        return pareto_front(options)


FASTSA_SOLVERS = {"fastsa": FastSA}
