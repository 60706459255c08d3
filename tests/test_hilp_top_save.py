"""``hilp-top`` with a save budget, and its menus for the level above.

Truths used: the simulator (the memory after the step before the loss is the save that
``option_from_schedule`` and ``budget_grid`` use) and the MILP's own save bound (the
hierarchical model's ``V[loss, loss]`` bounds the simulated save from above).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.option import pareto_front
from hiremate.ir.schedule import Compute
from hiremate.ir.sequence import sequence_to_schedule
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.partition import SequencePartition
from hiremate.solvers.hilp.hier import top_graph
from hiremate.solvers.hilp.top import HilpTop, simulated_save
from hiremate.solvers.menu import budget_grid, option_from_schedule
from hiremate.testing.synthetic import random_graph
from test_hilp_hier import problem_of
from test_registry import residual_chain


def autodiff_figures(g):
    ad = autodiff_schedule(g)
    sim = simulate(g, ad)
    return sim.peak, simulated_save(g, ad, sim), sim.time


@pytest.mark.parametrize("make", [lambda: residual_chain(6), lambda: random_graph(3, 14)])
@pytest.mark.parametrize("sfrac", [0.3, 0.6])
def test_candidates_keep_the_simulated_save_within_the_save_budget(make, sfrac):
    g = make()
    problem = problem_of(g, SequencePartition(), menu="hilp")
    peak, save, _ = autodiff_figures(g)
    S = int(sfrac * save)
    found, lowest = HilpTop(time_limit=10).compose(problem, peak, S)
    assert found, "a lower save always exists here (checkpoint options keep no phantom)"
    for c in found:
        sim = simulate(g, c.schedule, trace=True)
        assert sim.valid and sim.peak <= peak
        assert simulated_save(g, c.schedule, sim) <= S
    assert lowest is not None and lowest <= min(c.sim.peak for c in found)


def test_a_tighter_save_budget_costs_time():
    g = residual_chain(6)
    problem = problem_of(g, SequencePartition(), menu="hilp")
    peak, save, ad_time = autodiff_figures(g)
    best = {}
    for sfrac in (1.0, 0.5, 0.2):
        found, _ = HilpTop(time_limit=10).compose(problem, peak, int(sfrac * save))
        best[sfrac] = min(c.sim.time for c in found)
    assert best[1.0] == pytest.approx(ad_time)
    assert best[1.0] <= best[0.5] <= best[0.2]
    assert best[0.2] > ad_time


def test_a_save_budget_below_the_model_outputs_has_no_candidate():
    g = residual_chain(4)
    problem = problem_of(g, SequencePartition(), menu="hilp")
    peak, _, _ = autodiff_figures(g)
    found, lowest = HilpTop(time_limit=10, refine_rounds=0).compose(problem, peak, 0)
    assert found == [] and lowest is None


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(5, 14), frac=st.sampled_from([0.7, 1.0]),
       sfrac=st.sampled_from([0.3, 0.6, 1.0]))
def test_the_milp_save_bounds_the_simulated_save(seed, n, frac, sfrac):
    """Property: under a save budget, the MILP's ``V[loss, loss]`` is within it and at least
    the simulated save of the translated schedule (so the simulated filter never bites)."""
    g = random_graph(seed, n)
    problem = problem_of(g, SequencePartition(), menu="hilp")
    peak, save, _ = autodiff_figures(g)
    B, S = int(frac * peak), int(sfrac * save)
    top = top_graph(problem)
    sol = HilpTop(retries=1, time_limit=10).solve_at(problem, top, B, save_budget=S)
    if sol.sim is None:
        return
    assert sol.sim.valid and sol.sim.peak <= B
    hm = sol.model
    loss = top.graph.loss
    milp_save = sol.x[hm.flat.v(loss, loss)] * hm.flat.mem_unit
    schedule = sequence_to_schedule(g, sol.sequence)
    got = simulated_save(g, schedule, simulate(g, schedule))
    assert got <= S
    assert got <= milp_save + 1e-6 * max(S, 1)


def test_menu_gives_the_pareto_front_of_the_budgets_that_have_schedules():
    g = residual_chain(5)
    problem = problem_of(g, SequencePartition(), menu="hilp")
    budgets = budget_grid(g, 2, 3) + [(1, 1)]  # the last one: infeasible, skipped
    opts = HilpTop(time_limit=10, refine_rounds=0).compose_menu(problem, budgets)
    assert opts and opts == pareto_front(list(opts))
    peak, save, ad_time = autodiff_figures(g)
    out_b = sum(g.data[d].size for d in set(g.outputs) if g.data[d].counted)
    assert min(o.phantom for o in opts) <= min(s for _, s in budgets[:-1]) - out_b
    assert min(o.time for o in opts) == pytest.approx(ad_time)
    for o in opts:  # each option is a valid schedule of the graph with the figures it claims
        sched = o.fwd + (Compute(g.loss),) + o.bwd
        assert option_from_schedule(g, sched, o.solver) == o


def test_menu_with_no_feasible_budget_raises():
    g = residual_chain(3)
    problem = problem_of(g, SequencePartition())
    with pytest.raises(InfeasibleBudgetError):
        HilpTop(time_limit=5, refine_rounds=0).compose_menu(problem, [(1, 1), (2, None)])
