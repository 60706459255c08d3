"""A tighter lower bound on the time of in-order schedules: the moment bound with reruns' needs.

Why: :func:`hiremate.ir.time_bound.recompute_time_bound` prices a value that cannot stay in
memory at its producer's time alone. On convolutional graphs that is far too cheap: the output of
a ReLU or a normalisation is cheap to make again, but only if its input is still there, and that
input is as large. The cut bound then sat well below schedules that were in fact optimal, so a
gap to it said nothing about the solvers (docs/results.md, issue 18).

The argument, at the first run of node ``k`` in a schedule that runs every node, first in the
graph's order, within ``budget``: every value made before ``k`` and read after it is either in
memory while ``k`` runs (``x_v = 1``) or made again after ``k`` by running its producer again
(``r_p = 1``). A producer run again after ``k`` needs its own inputs then; each of those made
before ``k`` is likewise in memory during ``k`` or made again after it, and so on. The values in
memory fit in what ``k``'s own run leaves (:func:`~hiremate.ir.tracker.first_run_floors`). So
the reruns after ``k`` cost at least the optimum of

    min sum_p time_p r_p   s.t.  sum_v bytes_v x_v <= room_k,
                                  x_v + r_producer(v) >= 1       (v read after k),
                                  x_u + r_producer(u) >= r_p     (u an input of p, made before k),
                                  x, r in {0, 1}.

Its LP relaxation is solved at the moments where the cut bound's knapsack (a relaxation of this
problem, so never stronger) is dearest, and the problem itself, with a node limit, at the
moments whose LP value is highest; the MILP's dual bound at its limit is still a bound. The
largest moment, added to autodiff's time, bounds the schedule's time. With the closure rows
dropped the LP is exactly the cut bound's fractional knapsack.

One moment sees only the reruns after it, so on a chain at a tight budget, where every
backward step needs reruns of its own, the largest moment is far below the optimum. On small
graphs (:data:`WINDOW_NODES`) the moments are therefore also taken together
(:func:`window_time_bound`): a rerun is placed in the window between two consecutive first
runs, a value held at a moment was held at the one before, made again between them, or made
or read by the node between; the MILP over every window, stopped at a node limit, gives its
dual bound.

Like the cut bound it holds for the schedules H-ILP searches (every node run, first in order).
FastSA reorders independent nodes, so its schedules can go below it.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from hiremate.ir.graph import Graph
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.ir.time_bound import moment_knapsack_costs, moment_spans
from hiremate.ir.tracker import counted_sizes, first_run_floors
from hiremate.solvers.hilp.backends import solve_highs_batch
from hiremate.solvers.hilp.model import Milp

#: first runs whose LP is solved, those of the highest knapsack cost: on the paper's models the
#: largest moment was always among the first sixteen, and all of them take minutes on GPT-96
MOMENTS = 64
#: moments whose problem is solved as a MILP (the highest LP values), and the node limit of
#: each: enough to close most of the integrality gap on the zoo's graphs in seconds
EXACT_MOMENTS = 8
EXACT_NODES = 200
#: graphs of at most this many compute nodes also get :func:`window_time_bound` over every
#: moment (its MILP grows with nodes times values; on larger graphs it stops far from its end)
WINDOW_NODES = 40
#: a bound proven to the LP's tolerances is lowered by this much, relative, so that it stays
#: a bound
_TOLERANCE = 1e-7


def moment_time_bound(graph: Graph, budget: int, moments: int | None = MOMENTS,
                      exact_moments: int = EXACT_MOMENTS, exact_nodes: int = EXACT_NODES,
                      window_nodes: int = WINDOW_NODES) -> float:
    """A lower bound on the simulated time of every schedule of ``graph`` that runs every node,
    first in the graph's order, within ``budget`` bytes (the module's doc): autodiff's time plus
    the largest, over the nodes' first runs, cost of what must be made again after it.
    ``math.inf`` when no such schedule fits. At least :func:`recompute_time_bound`'s value.

    ``moments``: the LP is solved at that many first runs, those of the highest knapsack cost
    (all when None). Fewer are faster and still a bound, perhaps a weaker one. Graphs of at
    most ``window_nodes`` compute nodes also get :func:`window_time_bound` over every moment."""
    knapsack = moment_knapsack_costs(graph, int(budget))
    if knapsack is None:
        return math.inf
    base = simulate(graph, autodiff_schedule(graph)).time
    problems = _Moments(graph, int(budget))
    best = knapsack.copy()
    pressed = np.flatnonzero(knapsack > 0)
    if moments is not None:
        pressed = pressed[np.argsort(-knapsack[pressed], kind="stable")[:moments]]
    _raise(best, pressed, problems, integer=False, nodes=1)
    worst = [k for k in np.argsort(-best, kind="stable")[:exact_moments] if best[k] > 0]
    _raise(best, np.array(worst, dtype=np.int64), problems, integer=True, nodes=exact_nodes)
    extra = float(best.max(initial=0.0))
    if extra > 0 and len(graph.nodes) <= window_nodes:
        extra = max(extra, _window_extra(graph, int(budget), 0, len(graph.nodes) - 1,
                                         problems.floors, exact_nodes))
    return base + extra


def window_time_bound(graph: Graph, budget: int, first: int = 0, last: int | None = None,
                      nodes: int = EXACT_NODES) -> float:
    """A lower bound on the time of every in-order schedule of ``graph`` within ``budget``
    (the module's doc), from the first runs ``first`` to ``last`` taken together: the MILP's
    dual bound after ``nodes`` branch-and-bound nodes. Window ``w`` holds the reruns between
    the first runs of ``w`` and ``w + 1`` (after ``last`` for the last one). ``math.inf`` when
    no such schedule fits."""
    last = len(graph.nodes) - 1 if last is None else last
    floors = first_run_floors(graph)
    if any(floors[w] > budget for w in range(first, last + 1)):
        return math.inf
    base = simulate(graph, autodiff_schedule(graph)).time
    return base + _window_extra(graph, int(budget), first, last, floors, nodes)


def _window_extra(graph: Graph, budget: int, first: int, last: int, floors: list[int],
                  nodes: int) -> float:
    """The windows' bound on the time of the reruns (:func:`window_time_bound`)."""
    milp, scale = _Windows(graph, budget, first, last, floors).build()
    if milp is None:
        return 0.0
    res = solve_highs_batch([milp], relax=False, work_limit=nodes)[0]
    value = res.objective if res.status == "optimal" else res.bound
    return max(0.0, value * (1 - _TOLERANCE) * scale) if math.isfinite(value) else 0.0


def _assemble(rows: list[tuple[dict[int, float], float, float]], times: np.ndarray,
              upper: np.ndarray, integer: bool) -> tuple[Milp, float]:
    """The MILP ``min times.x`` over ``0 <= x <= upper`` with ``rows`` (each its coefficients
    by column, and its bounds), its objective divided by the returned scale (the dearest
    time: HiGHS's tolerances are absolute, and node times are microseconds)."""
    n = len(times)
    scale = float(times.max()) if n and times.max() > 0 else 1.0
    coef, at_row, at_col = [], [], []
    for r, (row, _, _) in enumerate(rows):
        for c, v in row.items():
            at_row.append(r)
            at_col.append(c)
            coef.append(v)
    A = sp.csr_matrix((coef, (at_row, at_col)), shape=(len(rows), n))
    milp = Milp(c=times / scale, A=A, row_lo=np.array([lo for _, lo, _ in rows], dtype=float),
                row_hi=np.array([hi for _, _, hi in rows], dtype=float),
                col_lo=np.zeros(n), col_hi=upper, integer=np.full(n, integer))
    return milp, scale


def _raise(best: np.ndarray, moments: np.ndarray, problems: _Moments, integer: bool,
           nodes: int) -> None:
    """``best[k]`` raised to the bound of moment ``k``'s problem, for each ``k`` of
    ``moments``: the LP's optimum, or the MILP's dual bound after ``nodes`` nodes (an LP
    stopped before its optimum bounds nothing, and leaves ``best[k]`` as it was)."""
    if not len(moments):
        return
    built = [problems.build(int(k), integer) for k in moments]
    results = solve_highs_batch([milp for milp, _ in built], relax=not integer,
                                work_limit=nodes)
    for k, (_, scale), res in zip(moments, built, results):
        if res.status == "optimal":
            value = res.objective
        elif integer:
            value = res.bound
        else:
            continue
        if math.isfinite(value):
            best[k] = max(best[k], value * (1 - _TOLERANCE) * scale)


class _Moments:
    """The problem of each first run, built from the graph's facts computed once."""

    def __init__(self, graph: Graph, budget: int):
        self.graph = graph
        self.budget = budget
        self.sizes = counted_sizes(graph)
        self.floors = first_run_floors(graph)
        self.outputs = set(graph.outputs)
        self.producer, self.stop, _, self.ids = moment_spans(graph)
        self.times = np.array([node.time for node in graph.nodes], dtype=np.float64)

    def build(self, k: int, integer: bool) -> tuple[Milp, float]:
        """Node ``k``'s problem and its objective's scale (:func:`_assemble`)."""
        graph, sizes = self.graph, self.sizes
        node = graph.nodes[k]
        free = set(node.inputs)  # in memory during k anyway
        at_stake = (self.producer < k) & (self.stop > k)
        live = [int(v) for v in self.ids[at_stake] if int(v) not in free]
        value_col: dict[int, int] = {v: i for i, v in enumerate(live)}
        producers: list[int] = []
        producer_col: dict[int, int] = {}

        def add_producer(p: int) -> None:
            if p not in producer_col:
                producer_col[p] = len(producers)
                producers.append(p)

        for v in live:
            add_producer(graph.data[v].producer)
        needs: list[tuple[int, int]] = []  # (rerun producer, value it reads)
        i = 0
        while i < len(producers):  # the closure: inputs of every producer that may rerun
            p = producers[i]
            i += 1
            for u in dict.fromkeys(graph.nodes[p].inputs):
                made_by = graph.data[u].producer
                if made_by is None or sizes[u] == 0 or u in free or u in self.outputs:
                    continue  # a source, not counted, or held anyway
                value_col.setdefault(u, len(value_col))
                needs.append((p, u))
                add_producer(made_by)
        n_values = len(value_col)
        room = self.budget - self.floors[k]
        rows: list[tuple[dict[int, float], float, float]] = [(  # the values held fit the room
            {j: sizes[u] / room if room > 0 else float(sizes[u]) for u, j in value_col.items()},
            -np.inf, 1.0 if room > 0 else 0.0)]
        for v in live:  # read after k: held, or its producer runs again
            rows.append(({value_col[v]: 1.0,
                          n_values + producer_col[graph.data[v].producer]: 1.0}, 1.0, np.inf))
        for p, u in needs:  # a rerun's input: held, or made again too
            rows.append(({value_col[u]: 1.0,
                          n_values + producer_col[graph.data[u].producer]: 1.0,
                          n_values + producer_col[p]: -1.0}, 0.0, np.inf))
        times = np.concatenate([np.zeros(n_values), self.times[producers]])
        return _assemble(rows, times, np.ones(len(times)), integer)


class _Windows:
    """The MILP of consecutive first runs ``first..last`` taken together: ``x[v, w]``, value
    ``v`` in memory while ``w`` runs; ``r[p, w]``, producer ``p`` run again in window ``w``."""

    def __init__(self, graph: Graph, budget: int, first: int, last: int, floors: list[int]):
        self.graph, self.budget, self.first, self.last = graph, budget, first, last
        self.floors = floors
        self.sizes = counted_sizes(graph)
        self.outputs = set(graph.outputs)
        self.cols: dict[tuple[str, int, int], int] = {}
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def _col(self, kind: str, item: int, window: int) -> int:
        return self.cols.setdefault((kind, item, window), len(self.cols))

    def _held_anyway(self, u: int, w: int) -> bool:
        """A source, not counted, a model output, or read or made by node ``w`` itself."""
        graph = self.graph
        return (graph.data[u].producer is None or self.sizes[u] == 0 or u in self.outputs
                or u in graph.nodes[w].inputs or u in graph.nodes[w].outputs)

    def build(self) -> tuple[Milp | None, float]:
        graph, first, last = self.graph, self.first, self.last
        finals = set(graph.final_data)
        readers: list[list[int]] = [[] for _ in graph.data]
        for node in graph.nodes:
            for d in node.inputs:
                readers[d].append(node.id)
        end = len(graph.nodes)
        for w in range(first, last + 1):  # read after w: held, or made again before its reader
            for d in graph.data:
                if d.producer is None or d.producer >= w or self._held_anyway(d.id, w):
                    continue
                later = [j for j in readers[d.id] if j > w]
                if not later and d.id not in finals:
                    continue
                reader = min(later, default=end)
                row = {self._col("x", d.id, w): 1.0}
                for window in range(w, min(reader - 1, last) + 1):
                    row[self._col("r", d.producer, window)] = 1.0
                self.rows.append((row, 1.0, np.inf))
        done: set[tuple[str, int, int]] = set()
        while len(done) < len(self.cols):  # every rerun's inputs, every held value's past
            for key in [k for k in self.cols if k not in done]:
                done.add(key)
                kind, item, w = key
                if kind == "r":  # an input of a rerun in window w: held during w, or made in w
                    for u in dict.fromkeys(graph.nodes[item].inputs):
                        if not self._held_anyway(u, w):
                            self.rows.append(({self._col("x", u, w): 1.0,
                                               self._col("r", graph.data[u].producer, w): 1.0,
                                               self.cols[key]: -1.0}, 0.0, np.inf))
                elif w > first and graph.data[item].producer < w - 1 \
                        and item not in graph.nodes[w - 1].inputs:
                    # held during w: held during w - 1, or made again between them
                    self.rows.append(({self.cols[key]: 1.0,
                                       self._col("x", item, w - 1): -1.0,
                                       self._col("r", graph.data[item].producer, w - 1): -1.0},
                                      -np.inf, 0.0))
        if not self.cols:
            return None, 1.0
        for w in range(first, last + 1):  # what is held fits beside w's own run
            room = self.budget - self.floors[w]
            row = {c: self.sizes[item] / max(room, 1) for (kind, item, window), c
                   in self.cols.items() if kind == "x" and window == w}
            if row:
                self.rows.append((row, -np.inf, 1.0 if room > 0 else 0.0))
        n = len(self.cols)
        times = np.zeros(n)
        upper = np.ones(n)
        for (kind, item, w), c in self.cols.items():
            if kind == "r":
                times[c] = graph.nodes[item].time
                upper[c] = 1.0 if item <= w else 0.0  # not run yet: cannot run again
        return _assemble(self.rows, times, upper, integer=True)
