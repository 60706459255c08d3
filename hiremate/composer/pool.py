"""Schedules found at other budgets, kept per graph and configuration and offered again.

Every solve of a graph finds a few schedules (one per flat solver and top-level composer); the
one returned is the fastest within the budget, and the rest used to be thrown away. A schedule
found at budget 0.7 whose peak is 0.55 of autodiff's is also a schedule for budget 0.6, and a
time-limited MILP at 0.6 may well return something slower. So every solve records its
candidates here, and every later solve of the same graph with the same configuration adds the
recorded ones that fit its budget to its own candidates.

Two properties follow. A solve never returns a schedule slower than one already known to fit,
and once the pool holds every budget's candidates (a sweep solves all its budgets first, see
:mod:`hiremate.sweep.presolve`), the returned schedule is the fastest pool member within the
budget, so its peak can only go down as the budget does.

The pool is the Pareto front in (peak, time) of what was recorded, re-simulated with the graph
at hand (a capture's measured times differ from the last one's): a dominated schedule can never
be the fastest within any budget. It lives in the
:class:`~hiremate.composer.menu_cache.MenuCache` next to the menus, keyed by the graph (without
times) and the result-deciding configuration; with the cache disabled there is no pool. An
entry is JSON data, never code: each schedule read back is checked step by step and simulated
before it is offered. Two processes recording at once may lose one's entries (last write wins):
the pool is an accelerator, and losing an entry costs only a re-solve.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from hiremate.composer.menu_cache import decode_pool, encode_pool
from hiremate.ir.graph import Graph
from hiremate.ir.schedule import Schedule
from hiremate.ir.simulator import SimulationResult, simulate

log = logging.getLogger(__name__)

POOL_LIMIT = 64  # schedules kept per graph and configuration (the front rarely gets near)


def pool_key(graph_key: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "schedule-pool", "graph": graph_key, "config": config}


def peak_time_front(entries: list[tuple[Schedule, SimulationResult, str]]
                 ) -> list[tuple[Schedule, SimulationResult, str]]:
    """The entries no other entry beats on both peak and time (first of equal ones kept), by
    increasing peak."""
    front: list[tuple[Schedule, SimulationResult, str]] = []
    seen: set[Schedule] = set()
    for entry in sorted(entries, key=lambda e: (e[1].peak, e[1].time)):
        if entry[0] in seen:
            continue
        if front and front[-1][1].time <= entry[1].time:
            continue  # a lower-or-equal-peak schedule is at least as fast
        front.append(entry)
        seen.add(entry[0])
    return front


class SchedulePool:
    """The recorded schedules of one graph under one configuration (see the module doc)."""

    def __init__(self, graph: Graph, cache: Any, key: dict[str, Any]):
        self.graph = graph
        self.cache = cache
        self.key = key

    def _load(self) -> list[tuple[Schedule, SimulationResult, str]]:
        stored = self.cache.get(self.key, decode=decode_pool) if self.cache.enabled else None
        out = []
        for sched, source in stored or ():
            sim = simulate(self.graph, sched)
            if sim.valid:
                out.append((sched, sim, source))
        return out

    def fitting(self, budget: int) -> list[tuple[Schedule, SimulationResult, str]]:
        """Recorded schedules valid on this graph whose simulated peak is within ``budget``."""
        return [e for e in self._load() if e[1].peak <= budget]

    def record(self, found: Iterable[tuple[Schedule, SimulationResult, str]]) -> int:
        """Add ``found`` (schedule, simulation, source) to the pool; returns the pool's size."""
        if not self.cache.enabled:
            return 0
        new = [e for e in found if e[1].valid]
        if not new:
            return 0
        front = peak_time_front(self._load() + new)
        if len(front) > POOL_LIMIT:  # keep the spread of peaks, from lowest to fastest
            last = len(front) - 1
            front = [front[round(i * last / (POOL_LIMIT - 1))] for i in range(POOL_LIMIT)]
        self.cache.put(self.key, encode_pool([(s, sim.peak, sim.time, src)
                                              for s, sim, src in front]))
        return len(front)
