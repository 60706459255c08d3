"""Polishing a schedule that another solver found: FastSA's annealing started from it.

Why: the hierarchy's schedules are built from menus (each subgraph's options chosen at a few
budgets, then joined), so they keep small inefficiencies at the joins that no option could see
(a value recomputed inside one subgraph and held by the next, a recomputation that could move
past the peak). Annealing over the whole graph's node sequence, started from such a schedule,
removes them cheaply; a cold start (FastSA alone) usually lands elsewhere, and the annealing
cannot reach the structured schedules that the MILPs find.

Each run starts from the fastest in-budget sequence found so far (the given schedule at first),
at one temperature (a fraction of the starting objective) and seed, and cools by three orders
of magnitude over ``polish_iters_per_node`` mutations per compute node (``polish_iters`` at
most) with no grouping; runs are tried for every seed and
temperature in turn. Runs are iteration-limited and seeded, so the result depends on the inputs
only (``polish_time_limit`` is a safety cap far above the usual run, logged when it decides).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from hiremate.ir.graph import Graph
from hiremate.ir.schedule import Compute, Schedule
from hiremate.ir.sequence import sequence_to_schedule
from hiremate.ir.simulator import simulate

log = logging.getLogger(__name__)


def polish(solver: Any, graph: Graph, budget: int, schedule: Schedule, table: Any
           ) -> Schedule | None:
    """A schedule of ``graph`` within ``budget`` faster than ``schedule`` (simulated), or None
    when the annealing found none (or ``schedule`` itself is invalid or over the budget).
    ``solver``: the :class:`~hiremate.solvers.fastsa.solver.FastSA` whose annealing and
    settings run; ``table``: its table of the graph's own nodes (no grouping)."""
    sequence = [op.node for op in schedule if isinstance(op, Compute)]
    if any(op.option is not None for op in schedule if isinstance(op, Compute)):
        return None  # a schedule of blocks, not of the graph's own nodes
    start = simulate(graph, sequence_to_schedule(graph, sequence))
    if not start.valid or start.peak > budget:
        return None
    best_time, best_seq = start.time, sequence
    # mutations per run: in proportion to the graph (a small one settles sooner), capped
    iters = min(solver.polish_iters, solver.polish_iters_per_node * len(graph.nodes))
    deadline = time.perf_counter() + solver.polish_time_limit
    runs = 0
    trials = [(seed, scale) for seed in range(solver.seed, solver.seed + solver.polish_seeds)
              for scale in solver.polish_temps]
    for seed, scale in trials:
        if time.perf_counter() > deadline:
            log.warning("FastSA polish stopped by its polish_time_limit (%gs) after %d of %d "
                        "runs: the result depends on the machine's load; raise "
                        "polish_time_limit or lower polish_iters", solver.polish_time_limit,
                        runs, len(trials))
            break
        runs += 1
        state = solver._state(graph, table, best_seq)
        temp = scale * max(budget, state.peak) * state.cost
        if temp <= 0:
            continue
        stats = solver.anneal(state, budget, iters, temp, 1e-3 * temp,
                              random.Random(seed), False, deadline)
        for seq in (state.order(), stats.best):
            if seq is None:
                continue
            res = simulate(graph, sequence_to_schedule(graph, seq))
            if res.valid and res.peak <= budget and res.time < best_time:
                best_time, best_seq = res.time, list(seq)
    if best_seq is sequence:
        return None
    log.info("FastSA polish: %.6g -> %.6g in %d runs", start.time, best_time, runs)
    return sequence_to_schedule(graph, best_seq)
