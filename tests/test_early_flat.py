"""The gated flat H-ILP started early, beside the hierarchy (:mod:`hiremate.composer.early`):
the same schedule as when it runs after the gate, started after the hierarchy's menus,
cancelled when the gate skips it, never
started where it cannot pay or cannot be cancelled; and HiGHS solves that stop on request
(:mod:`hiremate.solvers.hilp.cancel`)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

import hiremate
import hiremate.composer.early as early
from hiremate.api import solve_graph
from hiremate.config import load_config
from hiremate.errors import SolverError
from hiremate.solvers.hilp import backends
from hiremate.solvers.hilp.cancel import SolveCancelled, cancellable
from hiremate.solvers.hilp.model import Milp
from hiremate.testing.synthetic import random_graph

QUIET = {"cache": False, "calibrate": 0, "progress": False}


class _SetAfter(threading.Event):
    """An event that reads as set from its ``n``-th check on: HiGHS checks it at every
    interrupt point, so the solve is stopped in the middle, at the same point every run."""

    def __init__(self, n: int):
        super().__init__()
        self.checks, self.n = 0, n

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks >= self.n or super().is_set()


def _knapsack(items: int = 60) -> Milp:
    rng = np.random.default_rng(0)
    weights = rng.integers(20, 200, items).astype(float)
    values = weights + rng.integers(-10, 10, items)
    return Milp(c=-values, A=sp.csr_matrix(weights[None, :]),
                row_lo=np.array([-np.inf]), row_hi=np.array([weights.sum() / 3]),
                col_lo=np.zeros(items), col_hi=np.ones(items),
                integer=np.ones(items, dtype=bool))


def test_a_cancelled_highs_solve_raises_instead_of_returning():
    milp = _knapsack()
    plain = backends._solve_highs(milp, 60, 1e-9, None, False, 10_000, 0)
    assert plain.status in ("optimal", "feasible")
    stop = _SetAfter(3)
    with cancellable(stop), pytest.raises(SolveCancelled):
        backends._solve_highs(milp, 60, 1e-9, None, False, 10_000, 0)
    assert stop.checks >= 3  # HiGHS asked, and stopped when told to
    already = threading.Event()
    already.set()
    with cancellable(already), pytest.raises(SolveCancelled, match="before it started"):
        backends._solve_highs(milp, 60, 1e-9, None, False, 10_000, 0)
    # outside the context the same solve runs to its end again
    assert backends._solve_highs(milp, 60, 1e-9, None, False, 10_000, 0).objective == \
        plain.objective


def test_only_an_in_process_highs_solve_can_be_cancelled(monkeypatch):
    assert backends.can_cancel("highs")
    assert not backends.can_cancel("cpsat") and not backends.can_cancel("pulp")
    monkeypatch.setattr(backends, "_loaded", lambda module: True)  # CP-SAT loaded: subprocess
    assert not backends.can_cancel("highs")


def _gate_runs_graph():
    # FastSA fits; the other paths leave 4.5 % to the bound, so a threshold of 0 runs the MILP
    return random_graph(3, 12), 0.85


def test_started_early_it_gives_the_schedule_it_gives_after_the_gate(monkeypatch):
    monkeypatch.setattr(early, "spare_core", lambda n_jobs: n_jobs != 1)
    graph, fraction = _gate_runs_graph()
    after = solve_graph(graph, fraction, "hiremate", flat_gap=0.0, n_jobs=1, **QUIET)
    order: list[str] = []
    import hiremate.composer.flat as composer_flat
    import hiremate.composer.levels as levels

    real_levels, real_flat = levels.solve_levels, composer_flat.flat_candidate
    monkeypatch.setattr(levels, "solve_levels",
                        lambda *a, **k: (real_levels(*a, **k), order.append("menus"))[0])
    monkeypatch.setattr(composer_flat, "flat_candidate",
                        lambda name, *a, **k: (order.append(name), real_flat(name, *a, **k))[1])
    beside = solve_graph(graph, fraction, "hiremate", flat_gap=0.0, n_jobs=2, **QUIET)
    assert order.index("menus") < order.index("hilp")  # started once the menus were made
    assert after.report["flat_gate"]["early"] is False
    assert beside.report["flat_gate"] == {**after.report["flat_gate"], "early": True}
    assert beside.schedule == after.schedule
    assert beside.report["candidates"] == after.report["candidates"]
    sim = hiremate.simulate(graph, beside.schedule)
    assert sim.valid and sim.peak <= beside.report["budget"]


def test_where_the_gate_skips_it_the_early_milp_is_cancelled(monkeypatch):
    """Forced to start although the flat heuristics are near the bound: the gate skips it,
    cancels it, and the schedule is the one solved without it."""
    started: list[early.EarlyFlatHilp] = []

    def always(graph, budget, cfg, candidates, bound):
        started.append(early.EarlyFlatHilp(graph, budget, cfg.solver_params.get("hilp", {})))
        return started[-1]

    graph = random_graph(3, 12)
    plain = {"flat_gap_columns": None}  # 5 % on this small MILP too: the gate skips it
    alone = solve_graph(graph, 0.9, "hiremate", n_jobs=1, **plain, **QUIET)
    monkeypatch.setattr(early, "plan_early_flat_hilp", always)
    res = solve_graph(graph, 0.9, "hiremate", n_jobs=2, **plain, **QUIET)
    assert res.report["flat_gate"]["ran"] is False and res.report["flat_gate"]["early"] is True
    assert res.schedule == alone.schedule and "hilp" not in res.report["candidates"]
    (milp,) = started
    assert milp.started  # after the hierarchy's menus
    assert milp._cancel.is_set()  # the gate cancelled it (it may have finished before: tiny)
    milp._thread.join(timeout=60)
    assert not milp._thread.is_alive()


def test_the_result_of_a_cancelled_early_milp_is_an_error():
    graph, fraction = _gate_runs_graph()
    cfg = load_config("hiremate")
    budget = int(fraction * hiremate.simulate(graph, hiremate.autodiff_schedule(graph)).peak)
    milp = early.EarlyFlatHilp(graph, budget, cfg.solver_params.get("hilp", {}))
    milp.cancel()  # before it started: it never starts, and HiGHS never runs
    with pytest.raises(SolverError, match="cancelled"):
        milp.result()
    assert not milp.started
    stop = threading.Event()
    stop.set()  # the caller's event, set before the thread's solve reaches HiGHS
    shared = early.EarlyFlatHilp(graph, budget, cfg.solver_params.get("hilp", {}), cancel=stop)
    shared._thread.start()
    with pytest.raises(SolverError, match="cancelled"):
        shared.result()


def test_it_does_not_start_where_it_cannot_pay(monkeypatch):
    graph, fraction = _gate_runs_graph()
    cfg = load_config("hiremate", flat_gap=0.0, n_jobs=1)
    assert not early.spare_core(1)
    res = solve_graph(graph, fraction, "hiremate", flat_gap=0.0, n_jobs=2, **QUIET)
    flat = [c for c in res.report["candidates"] if c in ("twremat", "fastsa")]
    assert flat  # the flat heuristics fitted, so the checks below are about the gap and cores
    from hiremate.composer.flat import Paths, flat_path

    found = Paths()
    budget = res.report["budget"]
    flat_path(graph, budget, cfg, found, hold_hilp=True)
    best = min(c.sim.time for c in found.candidates)
    # one core: nothing beside the hierarchy
    assert early.plan_early_flat_hilp(graph, budget, cfg, found.candidates, best) is None
    monkeypatch.setattr(early, "spare_core", lambda n_jobs: True)
    two = load_config("hiremate", flat_gap=0.05, n_jobs=2)
    # the flat heuristics within flat_gap of the bound: the gate is sure to skip the MILP
    assert early.plan_early_flat_hilp(graph, budget, two, found.candidates, best) is None
    # no flat heuristic fitted: the gate defers it, warm from the hierarchy
    assert early.plan_early_flat_hilp(graph, budget, two, [], best / 2) is None
    # a backend that cannot be cancelled here
    monkeypatch.setattr(backends, "_loaded", lambda module: True)
    assert early.plan_early_flat_hilp(graph, budget, two, found.candidates, best / 2) is None
