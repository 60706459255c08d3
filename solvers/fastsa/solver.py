"""FastSA: simulated annealing over a slotted node sequence (Imanishi et al., 2023).

Why annealing: on general graphs the exact formulations (Checkmate-style ILPs) grow with the
square of the graph, while random local edits of a *sequence* (add a recomputation, remove one,
move a node) are cheap to evaluate incrementally (:mod:`hiremate.solvers.fastsa.state`: a few range changes of
the memory profile, judged before they are applied), and they may also reorder nodes, which
fixed-order methods cannot.

The pipeline (FastSA paper, sections 2.2, 2.2.2, C.1, D.4):

1. the initial sequence is the graph's own order, spread over ``gap`` slots per node;
2. node grouping (Algorithm 1): a forward node whose outputs are no larger than its inputs is
   fused into each of its consumers, so recomputing a whole run of cheap-to-store nodes is one
   mutation; a first annealing runs on grouped nodes and stops as soon as the budget is met;
3. the groups are expanded and a second, colder annealing removes redundant work.

Objective: ``max(budget, M(S)) * C(S)``. Mutations: add a recomputation of a forward node at a
free slot, remove a placed forward node, or move any non-loss node to a free slot (within a
window around its slot, so that moves are mostly valid). Only forward nodes that produce no
model output are ever added or removed: the loss and the backward nodes run exactly once.
Random nodes must first run in the graph's order (the simulator's rule, which the executor
needs): they are never fused into a group, and the first copy of each is pinned where the
initial order puts it (recomputations may only come after it).

Everything is seeded (``random.Random(seed)``) and deterministic. For speed, the
acceptance threshold is drawn before a mutation is evaluated, so most rejections come from a
cheap exact lower bound and a rejected mutation is never applied (see :meth:`FastSA.anneal`).
With numba installed (``pip install hiremate[fast]``) the loop runs compiled
(:mod:`hiremate.solvers.fastsa.kernel`); it takes the same path for a seed.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Iterable

from hiremate.errors import ConfigError, InfeasibleBudgetError, SolverError
from hiremate.ir.graph import FINAL_KINDS, SOURCE_KINDS, Graph
from hiremate.ir.option import Option, pareto_front
from hiremate.ir.schedule import Schedule
from hiremate.ir.simulator import simulate
from hiremate.ir.tracker import MemoryTracker
from hiremate.solvers.fastsa import accel as fastsa_accel
from hiremate.solvers.fastsa.state import NOP, NodeTable, SlotState, proposal_sets
from hiremate.solvers.menu import option_from_schedule
from hiremate.ir.sequence import sequence_to_schedule
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)


@dataclass
class AnnealStats:
    """Counters of one annealing run.

    ``attempts``: mutations drawn; ``evaluated``: drawn mutations that were valid and whose
    accept/reject decision was made (exactly: either from the new objective, or because a lower
    bound of it already exceeded the accepted threshold); ``bounded``: those of ``evaluated``
    rejected from the bound alone; ``accepted``; ``seconds``: wall time of the run;
    ``cpu_seconds``: this process's CPU time over the run (less sensitive to a shared machine);
    ``best``: the cheapest sequence within the budget the run visited (table indices), if any.
    """

    attempts: int = 0
    evaluated: int = 0
    accepted: int = 0
    bounded: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    best: list[int] | None = None

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
    """Peak of the values internal to a group while it runs (paper B.1): the members replayed
    by the simulator's tracker, each internal value freed after its last read in the group,
    with the group's inputs and outputs left out (the annealer's state counts those)."""
    last_use: dict[int, int] = {}
    internal: dict[int, int] = {}
    for k, m in enumerate(members):
        node = graph.nodes[m]
        for d in node.inputs:
            last_use[d] = k
        for d in node.outputs:
            internal[d] = 0 if d in outs or d in ins else sizes[d]
    tracker = MemoryTracker(graph, alive=(), sizes=internal)
    for k, m in enumerate(members):
        tracker.compute(m)
        for d in graph.nodes[m].outputs:
            if last_use.get(d, -1) <= k:
                tracker.delete(d)
        for d in graph.nodes[m].inputs:
            if last_use[d] == k and d in internal:
                tracker.delete(d)
    return tracker.peak


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
        if not alive[i] or table.movable_only[i] or graph.nodes[i].random:
            continue  # a random node keeps its own group: its first run stays in place
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
    raises :class:`InfeasibleBudgetError` whose ``min_budget`` is a budget a solve meets (not a
    proven minimum; :meth:`met_budget`). Returned schedules are replayed by
    ``hiremate.simulate``.

    ``accelerate``: ``"auto"`` runs the annealing loop in the numba kernel
    (:mod:`hiremate.solvers.fastsa.kernel`, ``pip install hiremate[fast]``) when numba is installed, else in
    Python; ``"python"`` always in Python (the reference); ``"numba"`` requires numba. Both
    take the same path for a seed.
    """

    name = "fastsa"

    def __init__(self, seed: int = 0, iters_grouped: int = 200_000, iters_fine: int = 100_000,
                 time_limit: float = 25.0, gap: int = 3, grouping: bool = True,
                 move_window: int = 64, max_nodes: int = 20_000, accelerate: str = "auto",
                 polish_iters: int = 1_000_000, polish_temps: Iterable[float] = (1e-3, 3e-3, 1e-2),
                 polish_seeds: int = 2, polish_time_limit: float = 600.0,
                 polish_iters_per_node: int = 5000):
        if accelerate not in ("auto", "numba", "python"):
            raise ConfigError(f"FastSA(accelerate={accelerate!r}): use 'auto' (numba when "
                              "installed), 'numba' or 'python'")
        if accelerate == "numba" and not fastsa_accel.available():
            raise ConfigError("FastSA(accelerate='numba') needs numba, which is not installed: "
                              "pip install 'hiremate[fast]' (or accelerate='auto' to fall back "
                              "to Python)")
        self.seed = seed
        self.iters_grouped = iters_grouped
        self.iters_fine = iters_fine
        self.time_limit = time_limit
        self.gap = gap
        self.grouping = grouping
        self.move_window = move_window
        self.max_nodes = max_nodes
        self.accelerate = accelerate
        self.polish_iters = int(polish_iters)
        self.polish_temps = tuple(float(t) for t in polish_temps)
        self.polish_seeds = int(polish_seeds)
        self.polish_time_limit = float(polish_time_limit)
        self.polish_iters_per_node = int(polish_iters_per_node)
        if (min(self.polish_iters, self.polish_seeds, self.polish_iters_per_node) < 0
                or any(t <= 0 for t in self.polish_temps)):
            raise ConfigError("FastSA: polish_iters, polish_iters_per_node and polish_seeds must "
                              "be >= 0 and "
                              f"polish_temps positive, got {polish_iters}, {polish_seeds}, "
                              f"{polish_temps}")
        self.last_stats: list[AnnealStats] = []

    def applicable(self, graph: Graph) -> bool:
        return 0 < len(graph) <= self.max_nodes

    # -- annealing ---------------------------------------------------------------------------
    def anneal(self, state: SlotState, budget: int, iters: int, temp0: float, temp1: float,
               rng: random.Random, stop_when_feasible: bool, deadline: float) -> AnnealStats:
        """Run ``iters`` mutations (or until ``deadline``); the state keeps the final sequence.

        Metropolis with the threshold drawn first: a mutation from objective ``f`` to ``g`` is
        accepted iff ``g <= f + temp * E`` with ``E ~ Exp(1)`` (``E = -ln(1 - u)``), the same
        law as ``g <= f or u < exp((f - g) / temp)``. Knowing the largest accepted ``g`` before
        evaluating lets a mutation be rejected from a lower bound of its new objective before
        the exact one is computed: for an add, from its cost alone (it lowers memory only
        before its slot, by at most its outputs' bytes); otherwise from
        :meth:`SlotState.peak_bound` (the new memory at the current peak slot). The exact new
        peak comes from :meth:`SlotState.peak_with`; a rejected mutation is never applied.
        Every decision is exact: the bound only rejects what the exact objective would.

        Proposals: add a pool node at a uniform slot among those after the first production of
        each of its inputs (and after the loss for backward work; it must be free); remove the
        node of a uniform slot among those holding a removable node; move the node of a
        uniform occupied slot (not the loss) to a uniform slot within ``move_window`` and after
        its inputs' first productions (it must be free).
        """
        pool, needed, slots_of, removable, placed = proposal_sets(state)
        log_ratio = math.log(temp1 / temp0) if temp0 > 0 and temp1 > 0 else 0.0
        if self.accelerate != "python" and fastsa_accel.usable(state, rng):
            stats = AnnealStats()
            start, cpu_start = time.perf_counter(), time.process_time()
            res = fastsa_accel.anneal(state, budget, iters, temp0, log_ratio, rng,
                                      stop_when_feasible, deadline, self.move_window, pool,
                                      needed, slots_of, removable, placed)
            stats.attempts, stats.evaluated = res.attempts, res.evaluated
            stats.accepted, stats.bounded, stats.best = res.accepted, res.bounded, res.best
            stats.seconds = time.perf_counter() - start
            stats.cpu_seconds = time.process_time() - cpu_start
            return stats
        table = state.table
        seq = state.seq
        T = state.T
        can_add, can_remove = state.can_add, state.can_remove
        add_deltas, remove_deltas = state.add_deltas, state.remove_deltas
        commit_add, commit_remove = state.commit_add, state.commit_remove
        peak_bounds, peak_with = state.peak_bounds, state.peak_with
        move_begin, move_abort = state.move_begin, state.move_abort
        commit_move = state.commit_move
        cost = table.cost
        out_bytes = state.out_bytes
        first_slot, first_cache = state.first_slot, state.first_cache
        pin = state.pin
        fixed = table.movable_only
        rpos = {t: i for i, t in enumerate(removable)}
        ppos = {t: i for i, t in enumerate(placed)}

        def drop(lst: list[int], pos: dict[int, int], t: int) -> None:
            i = pos.pop(t)
            last = lst.pop()
            if last != t:
                lst[i] = last
                pos[last] = i

        rand = rng.random
        log = math.log
        exp = math.exp
        window = self.move_window
        stats = AnnealStats()
        attempts = evaluated = accepted = bounded = 0
        start = time.perf_counter()
        cpu_start = time.process_time()
        f = max(budget, state.peak) * state.cost
        # the cheapest state within the budget that the walk visits (it may walk out again)
        best: list[int] | None = seq[:] if state.peak <= budget else None
        best_cost = state.cost if best is not None else math.inf
        temp = temp0
        npool = len(pool)
        for it in range(iters):
            if it & 1023 == 0:
                temp = temp0 * exp(log_ratio * it / iters)
                if time.perf_counter() > deadline:
                    break
                if stop_when_feasible and state.peak <= budget:
                    break
            attempts += 1
            r = rand()
            if r < 0.34:  # add a (re)computation
                if not npool:
                    continue
                x = pool[int(rand() * npool)]
                # a uniform slot after the first production of every input of x
                lo = first_cache[x]
                if lo < 0:
                    lo = first_slot(x)
                if lo >= T:
                    continue
                t = lo + int(rand() * (T - lo))
                if seq[t] != NOP:
                    continue
                evaluated += 1
                g_max = f - temp * log(1.0 - rand())
                c_new = state.cost + cost[x]
                # an add lowers memory only on slots before t, by at most its outputs' bytes
                m = state.peak if t <= state.peak_at else state.peak - out_bytes[x]
                if (budget if budget > m else m) * c_new > g_max:
                    bounded += 1
                    continue
                deltas = add_deltas(x, t)
                adding = True
            elif r < 0.67:  # remove a computation
                if not removable:
                    continue
                t = removable[int(rand() * len(removable))]
                x = seq[t]
                deltas = remove_deltas(x, t)  # None: invalid
                if deltas is None:
                    continue
                evaluated += 1
                g_max = f - temp * log(1.0 - rand())
                c_new = state.cost - cost[x]
                adding = False
            else:  # move a node to a free slot nearby
                if not placed:
                    continue
                t1 = placed[int(rand() * len(placed))]
                x = seq[t1]
                # a uniform slot of the window that is after the inputs' first productions
                a = first_cache[x]
                if a < 0:
                    a = first_slot(x)
                if a < t1 - window:
                    a = t1 - window
                b = t1 + window + 1
                if b > T:
                    b = T
                t2 = a + int(rand() * (b - a))
                if seq[t2] != NOP or not can_remove(x, t1, t2):
                    continue
                evaluated += 1
                g_max = f - temp * log(1.0 - rand())
                deltas = move_begin(x, t1, t2)
                c = state.cost
                m, ub = peak_bounds(deltas, True)
                if (budget if budget > m else m) * c > g_max:
                    bounded += 1
                    move_abort(x, t2)
                    continue
                if (budget if budget > ub else ub) * c > g_max:
                    m = peak_with(deltas)
                    if (budget if budget > m else m) * c > g_max:
                        move_abort(x, t2)
                        continue
                    commit_move(x, t1, t2, deltas, False, True)
                    state.peak, state.peak_at = m, state.new_at
                elif m == ub:  # the bounds meet: the peak stays at its slot, same value
                    commit_move(x, t1, t2, deltas, False, True)
                    state.peak = m
                else:
                    commit_move(x, t1, t2, deltas, True, True)
                m = state.peak
                f = (budget if budget > m else m) * c
                if m <= budget and state.cost < best_cost:
                    best_cost, best = state.cost, seq[:]
                accepted += 1
                i = ppos.pop(t1)
                placed[i] = t2
                ppos[t2] = i
                if t1 in rpos:
                    i = rpos.pop(t1)
                    removable[i] = t2
                    rpos[t2] = i
                if not fixed[x]:
                    copies = slots_of[x]
                    copies[copies.index(t1)] = t2
                continue
            m, ub = peak_bounds(deltas)
            if (budget if budget > m else m) * c_new > g_max:
                bounded += 1
                continue
            # the exact peak is needed only when the upper bound does not already accept;
            # ``known``: the new peak (m) and its slot (state.new_at) are known
            if m == ub:  # the bounds meet: the new peak is m, at the same slot
                known = True
                state.new_at = state.peak_at
            elif (budget if budget > ub else ub) * c_new > g_max:
                known = True
                m = peak_with(deltas)
                if (budget if budget > m else m) * c_new > g_max:
                    continue
            else:
                known = False
            accepted += 1
            if adding:
                commit_add(x, t, deltas, not known)
                copies = slots_of.setdefault(x, [])
                copies.append(t)
                for u in copies:
                    if u not in rpos and u != pin[x]:
                        rpos[u] = len(removable)
                        removable.append(u)
                ppos[t] = len(placed)
                placed.append(t)
            else:
                commit_remove(x, t, deltas, not known)
                copies = slots_of[x]
                copies.remove(t)
                drop(removable, rpos, t)
                drop(placed, ppos, t)
                if len(copies) == 1 and needed[x] and copies[0] in rpos:
                    drop(removable, rpos, copies[0])
            if known:
                state.peak, state.peak_at = m, state.new_at
            m = state.peak
            f = (budget if budget > m else m) * c_new
            if m <= budget and state.cost < best_cost:
                best_cost, best = state.cost, seq[:]
        stats.attempts, stats.evaluated, stats.accepted = attempts, evaluated, accepted
        stats.best = [x for x in best if x != NOP] if best is not None else None
        stats.bounded = bounded
        stats.seconds = time.perf_counter() - start
        stats.cpu_seconds = time.process_time() - cpu_start
        return stats

    def _state(self, graph: Graph, table: NodeTable, order: list[int]) -> SlotState:
        sizes, kept, _ = _data_facts(graph)
        loss_idx = next(i for i in order if table.members[i] == (graph.loss,))
        state = SlotState(table, order, len(graph.data), sizes, kept, loss_idx, self.gap)
        # random nodes first run in the graph's order (the simulator's rule): their first
        # copies stay where the initial order (the graph's) puts them
        placed = set(order)
        state.pin_first_copies(x for x in range(len(table)) if x in placed and any(
            graph.nodes[m].random for m in table.members[x]))
        return state

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
        # candidates: where each annealing stopped, the cheapest in-budget state each visited
        # (a walk can leave the budget again near its end), and the graph's own order
        # (store-all with eager frees), so FastSA never refuses a budget that order meets
        candidates = [flat, fine.order(), list(range(len(graph.nodes)))]
        if st.best is not None:
            candidates.append([m for x in st.best for m in table.members[x]])
        if st2.best is not None:
            candidates.append(st2.best)
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
            raise SolverError("FastSA found no valid sequence (a bug in hiremate; please "
                              "report it)")
        return best[1], best[2], best[3]

    # -- solver protocol ---------------------------------------------------------------------
    def schedule(self, graph: Graph, budget: int) -> Schedule:
        seq, peak, _ = self.solve(graph, budget)
        if peak > budget:
            met = self.met_budget(graph, peak)
            raise InfeasibleBudgetError(
                f"FastSA did not fit {graph!r} in {fmt_bytes(budget)}: the best sequence it "
                f"found peaks at {fmt_bytes(peak)}, and a solve at {fmt_bytes(met)} ({met} "
                "bytes) fits; raise the budget to that, give it more iterations "
                "(iters_grouped, time_limit) or another seed",
                min_budget=met,
            )
        return sequence_to_schedule(graph, seq)

    def met_budget(self, graph: Graph, peak: int, tries: int = 2) -> int:
        """A budget at or above ``peak`` that a solve meets. The peak a failed solve reached is
        not one: a solve at that budget weighs memory against time differently and may stop
        above it. Solving at each peak reached in turn stops where a solve fits; after
        ``tries`` solves (each a whole anneal, so few), the graph's own order's peak is
        returned, which every solve meets (that order is always a candidate, and an in-budget
        candidate beats every other)."""
        for _ in range(tries):
            _, again, _ = self.solve(graph, peak)
            if again <= peak:
                return peak
            peak = again
        return simulate(graph, sequence_to_schedule(graph, list(range(len(graph.nodes))))).peak

    def polish(self, graph: Graph, budget: int, schedule: Schedule) -> Schedule | None:
        """A faster schedule within ``budget``, annealed from ``schedule``, or None
        (:mod:`hiremate.solvers.fastsa.polish`)."""
        from hiremate.solvers.fastsa.polish import polish

        return polish(self, graph, budget, schedule, primitive_table(graph))

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
