"""Deterministic solving: the same graph and configuration give the same schedule at any
machine load, with one worker or two, run after run.

Why these tests can fail: the MILPs below are not solved by their warm start alone (the flat
one needs its cuts and sub-MIP heuristics, the top-level one its search over the blocks'
options), so a solver stopped by the wall clock would return whatever incumbent it had reached
when its time ran out; with a CPU-burning neighbour the second solve reaches less in the same
seconds. Only limits counted in work (branch-and-bound nodes, deterministic time, a number of
block solves) on one thread with fixed seeds give the same answer at both loads. The last
tests check that a limit never leaves a schedule worse than the warm start it was given.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys

import numpy as np
import pytest

from hiremate.api import solve_graph
from hiremate.config import load_config
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.ir.tracker import memory_floor
from hiremate.solvers.hilp import backends, flat, top
from hiremate.solvers.hilp.backends import MilpResult
from hiremate.solvers.hilp.flat import HilpSolver
from hiremate.testing.synthetic import random_graph
from test_registry import residual_chain

QUIET = {"progress": False, "cache": False, "menu_peaks": 2, "menu_saves": 2, "n_options": 4}


@contextlib.contextmanager
def busy(n: int = 1):
    """``n`` processes burning a CPU core each while the block runs (the machine's load)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _budget(g, frac: float) -> int:
    lo, hi = memory_floor(g), simulate(g, autodiff_schedule(g)).peak
    return int(lo + frac * (hi - lo))


def test_flat_hilp_gives_the_same_schedule_beside_a_busy_process():
    g = random_graph(7, 10)
    b = _budget(g, 0.75)
    first = HilpSolver().solve(g, b)
    with busy():
        second = HilpSolver().solve(g, b)
    assert first.schedule == second.schedule
    assert first.simulation.time == second.simulation.time


def test_hilp_top_gives_the_same_schedule_at_any_load_and_n_jobs():
    g = residual_chain(4)
    cfg = load_config("hilp", flat_max_nodes=0, n_jobs=1, **QUIET)
    first = solve_graph(g, 0.5, cfg)
    assert first.report["solver"] == "hilp-top"
    with busy():
        second = solve_graph(g, 0.5, cfg.replace(n_jobs=2))
    assert first.schedule == second.schedule


def test_a_work_limited_stop_is_a_solution_and_the_wall_clock_cap_warns(caplog):
    g = random_graph(7, 10)
    model = HilpSolver().build(g, _budget(g, 0.75))
    res = backends.solve_milp(model.milp, "highs", work_limit=1, mip_gap=0.0)
    assert res.has_solution and res.limit in ("work", None)
    with caplog.at_level("WARNING", logger=backends.__name__):
        capped = backends.solve_milp(model.milp, "highs", time_limit=1e-4)
    assert capped.limit == "time" and "wall-clock cap" in caplog.text


def test_flat_never_returns_worse_than_its_warm_start(monkeypatch):
    g = random_graph(7, 10)  # its warm start is faster than recomputing everything
    b = _budget(g, 0.6)
    start = HilpSolver().solve(g, b)
    real = flat.solve_milp

    def slow_incumbent(milp, backend, *args, **kwargs):  # a limit stopped at recompute-all
        if kwargs.get("relax"):
            return real(milp, backend, *args, **kwargs)
        model = HilpSolver().build(g, b)
        x = flat.assignment(model, g, flat.recompute_phases(g))
        return MilpResult("feasible", x, float(milp.c @ x), -math.inf, 0.0, backend, "work")

    monkeypatch.setattr(flat, "solve_milp", slow_incumbent)
    res = HilpSolver().solve(g, b)
    slowest = simulate(g, flat.phases_to_schedule(g, flat.recompute_phases(g))).time
    assert res.status == "hint" and res.simulation.time < slowest
    assert res.simulation.time >= start.simulation.time


def test_hilp_top_never_returns_worse_than_its_plan(monkeypatch):
    """The backend finds nothing within its limit: the plain plan (every top node once)
    is the answer, not a failure."""
    g = residual_chain(4)
    cfg = load_config("hilp", flat_max_nodes=0, n_jobs=1, **QUIET)
    real = top.HilpTop._milp

    def stalled(self, milp, hint=None, work_limit=None):
        if hint is None:  # completing the plan's point: the real backend
            return real(self, milp, None, work_limit)
        return MilpResult("unknown", None, math.inf, -math.inf, 0.0, self.backend, "work")

    monkeypatch.setattr(top.HilpTop, "_milp", stalled)
    res = solve_graph(g, 1.0, cfg)
    assert res.report["solver"] == "hilp-top"
    assert res.sim.time == pytest.approx(g.total_time())
    assert np.isfinite(res.sim.time)
