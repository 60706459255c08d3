"""A lower bound on the time of any schedule within a budget, cheap on any graph size.

Why: the LP relaxation of the flat H-ILP is the usual bound, but its size grows with the square
of the graph, so on the larger models it does not finish and they had no bound at all, and a
gap to the HiRemate paper's figures could not be told apart from a gap to what the graph
allows.

The argument (a relaxation of the schedule at one moment): take a schedule that runs every node
and runs them *first* in the graph's order (H-ILP's schedules and every phase-form schedule),
within ``budget`` as :func:`hiremate.ir.simulator.simulate` counts memory. While node ``k`` runs
for the first time, every value produced by a node before ``k`` and read by a node after ``k``
(or kept to the end) is either in memory or made again after ``k``, by running its producer
again. What must be in memory anyway (:func:`hiremate.ir.tracker.first_run_floors`: ``k``'s
inputs, outputs and overhead, the model outputs made before ``k``) leaves ``budget -
mandatory`` for the rest; so the producers run again cost at least the cheapest set whose
values, left out, bring the rest within that room: a knapsack, bounded below by its fractional
relaxation (producers taken in increasing order of time per byte). Each moment gives a bound
on the extra runs, the largest of them bounds the schedule's time above running every node
once. The bound ignores what a rerun itself needs (its inputs alive, perhaps rerun too), so it
can be loose where recomputation cascades (convolution chains; docs/results-history.md compares it
with a proven optimum); it is exact when the budget leaves room for everything.
:mod:`hiremate.solvers.hilp.moment_bound` adds those needs, with an LP per moment (the IR has
no solver), and is the bound the benchmarks and the solve report give.

A solver that reorders independent nodes (FastSA) is outside that class and can in principle
go below the bound, as it can go below :func:`hiremate.ir.tracker.memory_floor`.
"""

from __future__ import annotations

import math

import numpy as np

from hiremate.ir.graph import Graph
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.ir.tracker import counted_sizes, first_run_floors


def recompute_time_bound(graph: Graph, budget: int) -> float:
    """A lower bound on the simulated time of every schedule of ``graph`` that runs every node,
    first in the graph's order, and peaks at most ``budget`` bytes (see the module's doc):
    autodiff's time plus the largest, over the nodes' first runs, fractional-knapsack cost of
    what cannot stay in memory then. ``math.inf`` when no such schedule fits ``budget`` (the
    mandatory memory of some node's first run exceeds it)."""
    base_time = simulate(graph, autodiff_schedule(graph)).time
    extra = _largest_moment_cost(graph, int(budget))
    return base_time + extra


def moment_spans(graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The values that may be out of memory at some first run and made again, as arrays
    ``(producer, stop, bytes, data id)``: ``stop`` is the last node that reads the value (past
    the last node for a value kept to the end). A value is at stake at node ``k``'s first run
    when ``producer < k < stop``. Model outputs are never freed, so they are mandatory (in
    :func:`~hiremate.ir.tracker.first_run_floors`) instead."""
    n = len(graph.nodes)
    sizes = counted_sizes(graph)
    outputs = set(graph.outputs)
    finals = set(graph.final_data)
    last_read = [-1] * len(graph.data)
    for node in graph.nodes:
        for d in node.inputs:
            last_read[d] = max(last_read[d], node.id)
    spans = [(d.producer, n if d.id in finals else last_read[d.id], sizes[d.id], d.id)
             for d in graph.data
             if d.producer is not None and sizes[d.id] > 0 and d.id not in outputs]
    spans = [s for s in spans if s[1] > s[0]]
    if not spans:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    producer, stop, weight, ids = (np.array(col, dtype=np.int64) for col in zip(*spans))
    return producer, stop, weight, ids


def moment_knapsack_costs(graph: Graph, budget: int) -> np.ndarray | None:
    """Per node, the fractional-knapsack cost of its first run (the module's doc): a lower
    bound on the time of the reruns after it. None when some first run cannot fit ``budget``
    whatever is freed."""
    nodes = graph.nodes
    n = len(nodes)
    producer, stop, weight, ids = moment_spans(graph)
    times = np.array([node.time for node in nodes], dtype=np.float64)
    weight_f = weight.astype(np.float64)
    costs = np.zeros(n)
    for node, mandatory in zip(nodes, first_run_floors(graph)):
        k = node.id
        if mandatory > budget:
            return None
        live = (producer < k) & (stop > k)
        if node.inputs:
            live &= ~np.isin(ids, np.fromiter(node.inputs, dtype=np.int64))
        if not live.any():
            continue
        held = np.bincount(producer[live], weights=weight_f[live], minlength=n)
        excess = held.sum() - (budget - mandatory)
        if excess <= 0:
            continue
        chosen = np.flatnonzero(held > 0)
        order = chosen[np.argsort(times[chosen] / held[chosen], kind="stable")]
        dropped = np.cumsum(held[order])
        full = int(np.searchsorted(dropped, excess))  # producers dropped whole: order[:full]
        cost = float(times[order[:full]].sum())
        before = float(dropped[full - 1]) if full else 0.0
        if full < len(order):  # the last one in part
            cost += times[order[full]] * (excess - before) / held[order[full]]
        costs[k] = cost
    return costs


def _largest_moment_cost(graph: Graph, budget: int) -> float:
    costs = moment_knapsack_costs(graph, budget)
    if costs is None:
        return math.inf
    return float(costs.max(initial=0.0))
