"""H-ILP backends: the one asked for runs, hilp-top solves the same on HiGHS, CP-SAT and CBC,
and the LP lower bound is a bound only when the LP was solved.

Truths used: HiGHS's optimum of the same model (the backends must agree), exact integer
arithmetic for the memory rows under the gcd unit, and the simulator (every translated
schedule is replayed on the full graph).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from hiremate.errors import ConfigError
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.partition import HPartition
from hiremate.solvers.hilp import backends, flat
from hiremate.solvers.hilp.backends import MilpResult, integer_objective
from hiremate.solvers.hilp.hier import build_hier_model, top_graph
from hiremate.solvers.hilp.model import build_model, gcd_unit
from hiremate.solvers.hilp.top import HilpTop
from hiremate.solvers.hilp.topgraph import gcd_unit_top
from hiremate.testing.synthetic import random_graph
from test_hilp_hier import problem_of
from test_registry import residual_chain

#: CP-SAT's objective is rounded to 2**30 steps of the largest time; with at most a few
#: thousand run variables the optimum it finds is within this of the exact one
TIME_TOLERANCE = 1e-6


def _instance(name: str):
    if name == "random":
        g = random_graph(5, 24)
        problem = problem_of(g, HPartition(max_top=4, max_sub=4), "hilp")
        frac = 0.85
    else:
        g = residual_chain(4, size=96)
        problem = problem_of(g, HPartition(max_top=4, max_sub=4), "hilp")
        frac = 0.6
    ad = simulate(g, autodiff_schedule(g)).peak
    return problem, top_graph(problem), int(ad * frac)


@pytest.mark.parametrize("name", ["random", "residual"])
def test_hilp_top_has_the_same_optimum_on_highs_cpsat_and_cbc(name):
    problem, top, abstract = _instance(name)
    found = {}
    for backend in ("highs", "cpsat", "pulp"):
        solver = HilpTop(backend=backend, mip_gap=1e-9, retries=1, pulp_solver="CBC",
                         time_limit=60.0)
        sol = solver.solve_at(problem, top, abstract)
        assert sol.status == "optimal", (backend, sol.status)
        assert sol.sim is not None and sol.sim.valid and sol.sim.peak <= abstract
        assert sol.sim.time == pytest.approx(sol.objective, rel=1e-9)
        found[backend] = sol.objective
    assert found["cpsat"] == pytest.approx(found["highs"], rel=TIME_TOLERANCE)
    assert found["pulp"] == pytest.approx(found["highs"], rel=1e-9)


def test_hilp_top_rejects_an_unknown_backend_at_configuration():
    with pytest.raises(ConfigError, match="unknown backend 'gurobi'"):
        HilpTop(backend="gurobi")


def test_the_cpsat_memory_unit_makes_every_coefficient_an_integer():
    problem, top, abstract = _instance("random")
    unit = gcd_unit_top(top)
    assert HilpTop(backend="cpsat").memory_unit(top, abstract) == unit
    assert HilpTop(backend="highs").memory_unit(top, abstract) == abstract
    assert backends.integral(build_hier_model(top, abstract, unit).milp)
    assert not backends.integral(build_hier_model(top, abstract, abstract).milp)
    # sizes that are all multiples of 96 bytes give a unit of (a multiple of) 96
    g = residual_chain(4, size=96)
    top96 = top_graph(problem_of(g, HPartition(max_top=4, max_sub=4)))
    assert gcd_unit_top(top96) % 96 == 0


def test_integer_objective_is_near_exact_and_keeps_nonzero_costs():
    rng = np.random.default_rng(0)
    c = np.concatenate([rng.random(50) * 1e-3, [0.0, 1e-15, 7.5]])
    lo, hi = np.zeros(len(c)), np.ones(len(c))
    ci, scale, error = integer_objective(c, lo, hi)
    assert ci.dtype == np.int64
    assert ci[50] == 0 and ci[51] >= 1  # zero stays zero, a tiny cost stays a cost
    dev = np.abs(ci / scale - c)
    assert dev[c >= 1 / scale].max() <= 0.5 / scale + 1e-15  # rounded to the nearest step
    assert dev.max() <= 1 / scale  # a cost below half a step is one step
    assert error <= len(c) / scale and error < 7.5 * 1e-7
    x = rng.integers(0, 2, len(c)).astype(float)
    assert abs(c @ x - (ci @ x) / scale) <= error + 1e-12
    # large variable ranges shrink the scale so that the objective stays far within int64
    ci2, scale2, _ = integer_objective(c, lo, np.full(len(c), 1e9))
    assert float(np.abs(ci2).astype(float) @ np.full(len(c), 1e9)) < 2.0 ** 62


def test_cpsat_reports_the_exact_objective_and_a_valid_bound():
    g = random_graph(4, 8, max_fanin=2)
    budget = int(simulate(g, autodiff_schedule(g)).peak * 0.8)
    highs = backends.solve_milp(build_model(g, budget).milp, "highs", mip_gap=1e-9)
    assert highs.status == "optimal" and highs.objective > g.total_time()  # it recomputes
    milp = build_model(g, budget, None, gcd_unit(g)).milp
    cp = backends.solve_milp(milp, "cpsat", mip_gap=0.0)
    assert cp.backend == "cpsat" and cp.status == "optimal"
    assert cp.objective == pytest.approx(float(milp.c @ cp.x), rel=1e-12)
    assert cp.objective == pytest.approx(highs.objective, rel=TIME_TOLERANCE)
    assert cp.bound <= highs.objective + 1e-9


# -- lower_bound --------------------------------------------------------------------------------
def _lp_case():
    g = random_graph(1, 30, max_fanin=2)
    return g, int(simulate(g, autodiff_schedule(g)).peak * 0.7)


def test_lower_bound_is_none_when_the_lp_stops_at_its_time_limit():
    g, budget = _lp_case()
    assert flat.lower_bound(g, budget, time_limit=0.0) is None
    lb = flat.lower_bound(g, budget)
    assert lb is not None and math.isfinite(lb) and lb >= g.total_time() - 1e-6


def test_lower_bound_ignores_a_point_the_lp_stopped_at(monkeypatch):
    """A relaxation that stopped with a primal point ("feasible") bounds nothing."""
    g, budget = _lp_case()

    def stopped(milp, backend, time_limit, relax):
        return MilpResult("feasible", np.zeros(milp.shape[1]), 1.0, 1.0, time_limit, "highs")

    monkeypatch.setattr(flat, "solve_milp", stopped)
    assert flat.lower_bound(g, budget) is None


def test_a_batch_of_problems_solves_as_each_alone_in_this_process_and_in_a_fresh_one(
        monkeypatch):
    """The moment bound's LPs and MILPs go to HiGHS as one batch, in a fresh interpreter when
    CP-SAT is loaded (forced here): the same results as :func:`solve_milp` one at a time."""
    g = random_graph(3, 8)
    peak = simulate(g, autodiff_schedule(g)).peak
    milps = [build_model(g, int(peak * f)).milp for f in (0.7, 0.9)]
    alone = [backends.solve_milp(m, "highs", relax=relax, work_limit=50)
             for relax in (True, False) for m in milps]
    here = (backends.solve_highs_batch(milps, relax=True, work_limit=50)
            + backends.solve_highs_batch(milps, relax=False, work_limit=50))
    monkeypatch.setattr(backends, "_loaded", lambda module: module.startswith("ortools"))
    fresh = (backends.solve_highs_batch(milps, relax=True, work_limit=50)
             + backends.solve_highs_batch(milps, relax=False, work_limit=50))
    for a, b, c in zip(alone, here, fresh):
        assert a.status == b.status == c.status
        assert a.objective == pytest.approx(b.objective) and b.objective == pytest.approx(
            c.objective)


# -- HiGHS's objective scale --------------------------------------------------------------------
def test_objective_scale_makes_a_typical_cost_one():
    assert backends.objective_scale(np.array([0.0, 2e-5, 6e-5, 0.0])) == pytest.approx(1 / 4e-5)
    assert backends.objective_scale(np.zeros(3)) == 1.0  # nothing to scale
    assert backends.objective_scale(np.array([1.0, np.inf])) == 1.0


@pytest.mark.parametrize("seed", [1, 4, 8])
def test_highs_solves_the_scaled_objective_to_the_unscaled_optimum(monkeypatch, seed):
    """HiGHS sees the costs scaled to about 1 (:func:`objective_scale`) and reports the result in
    the model's own unit, with the stopping rule of the unscaled model (the relative gap and an
    absolute gap of ``HIGHS_ABS_GAP`` in the model's unit): the same optimum as solving the
    unscaled costs, an objective equal to ``c @ x`` and a bound below it."""
    g = random_graph(seed, 10, max_fanin=2)
    milp = build_model(g, int(simulate(g, autodiff_schedule(g)).peak * 0.8)).milp
    milp = replace(milp, c=milp.c * 1e-4)  # op times of a tenth of a millisecond, in seconds
    assert backends.objective_scale(milp.c) > 1e3
    scaled = backends.solve_milp(milp, "highs", mip_gap=1e-9)
    assert scaled.status == "optimal"
    assert scaled.objective == pytest.approx(float(milp.c @ scaled.x), rel=1e-9)
    assert scaled.bound <= scaled.objective * (1 + 1e-9)
    monkeypatch.setattr(backends, "objective_scale", lambda c: 1.0)
    plain = backends.solve_milp(milp, "highs", mip_gap=1e-9)
    assert plain.status == "optimal"
    gap = backends.HIGHS_ABS_GAP
    assert abs(scaled.objective - plain.objective) <= gap + 1e-9 * plain.objective
