"""Points of the hierarchical H-ILP from plain plans and rk-Rotor's block chains
(:mod:`hiremate.solvers.hilp.starts`), and the top-level search that takes the chains as floors
under its MILPs' results.

Truths used: the simulator (a start's schedule is replayed on the full graph) and rk-Rotor's
own simulated schedules (a start fixes the MILP's choices to the chain's, so its objective is
that schedule's time).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiremate.ir.sequence import sequence_to_schedule
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.partition import SequencePartition
from hiremate.solvers.chain.rk_rotor import BlockOp
from hiremate.solvers.chain.rk_rotor_top import RkRotorTop
from hiremate.solvers.hilp import top as hilp_top
from hiremate.solvers.hilp.backends import solve_milp
from hiremate.solvers.hilp.hier import (
    build_hier_model, lowest_budget_met, solution_sequence, top_graph,
)
from hiremate.solvers.hilp.starts import chain_stages, chain_start, plan_start
from hiremate.solvers.hilp.top import HilpTop
from hiremate.solving import solve_graph
from hiremate.testing.synthetic import random_graph
from test_hilp_hier import FAST, problem_of
from test_registry import residual_chain


def _solve(milp):
    return solve_milp(milp, "highs", 60.0, 1e-4, None, work_limit=200)


def _tight(g, problem, fraction: float) -> int:
    """A budget ``fraction`` of the way from rk-Rotor's least-memory schedule to autodiff."""
    _, low = RkRotorTop(slots=100).compose(problem, 1)  # its least-memory schedule's peak
    high = simulate(g, autodiff_schedule(g)).peak
    return int(low + fraction * (high - low))


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6), n=st.integers(10, 16),
       fraction=st.sampled_from([0.0, 0.3, 0.7]))
def test_a_chain_start_is_rk_rotors_schedule_in_the_milp(seed, n, fraction):
    """Each rk-Rotor schedule within the budget that has a start: the start is a point of the
    MILP at the budget, its schedule is valid on the full graph, within the budget, and as fast
    as rk-Rotor's (the MILP's objective is the simulated time of its schedule)."""
    g = random_graph(seed, n)
    problem = problem_of(g, SequencePartition(), menu="hilp")
    budget = _tight(g, problem, fraction)
    cands, _ = RkRotorTop(slots=100).compose(problem, budget)
    top = top_graph(problem, True)
    hm = build_hier_model(top, budget, float(budget))
    for cand in cands:
        x = chain_start(hm, cand.detail["ops"], _solve)
        if x is None:
            continue
        seq, _ = solution_sequence(hm, x)
        sim = simulate(g, sequence_to_schedule(g, seq))
        assert sim.valid, sim.error
        assert sim.peak <= budget
        assert sim.time == pytest.approx(float(hm.milp.c @ x), rel=1e-6, abs=1e-12)
        assert sim.time <= cand.sim.time * (1 + 1e-9) + 1e-12


def test_the_chain_start_fits_where_no_plain_plan_does():
    """At rk-Rotor's least-memory budget on a chain of residual blocks, neither plain plan
    (every block once, fastest or lightest options) fits, rk-Rotor's schedule gives a start,
    and the top-level search stopped at its first node returns a schedule no slower than it."""
    g = residual_chain(8, size=1000)
    problem = problem_of(g, SequencePartition(), menu="hilp")
    budget = _tight(g, problem, 0.0)
    cands, _ = RkRotorTop(slots=100).compose(problem, budget)
    assert cands
    fastest = min(cands, key=lambda c: c.sim.time)
    hm = build_hier_model(top_graph(problem, True), budget, float(budget))
    assert plan_start(hm, _solve) is None
    assert chain_start(hm, fastest.detail["ops"], _solve) is not None
    found, _ = HilpTop(work_limit=1, retries=1).compose(
        problem, budget, chains=[fastest.detail["ops"]])
    assert found
    assert min(c.sim.time for c in found) <= fastest.sim.time * (1 + 1e-9)


def test_operations_out_of_the_models_form_have_no_stages():
    """A recomputation out of index order within a stage, or a forward that keeps only its
    outputs on a block with no standalone option, is not a plan of the model."""
    g = residual_chain(3)
    problem = problem_of(g, SequencePartition())  # store-all menus, no checkpoint options
    hm_plain = build_hier_model(top_graph(problem, False), 10**9, 1e9)
    L = len(problem.blocks)
    store = ([BlockOp("Fn", i, 0) for i in range(1, L + 1)] + [BlockOp("Loss", L + 1)]
             + [BlockOp("B", i, 0) for i in range(L, 0, -1)])
    assert chain_stages(hm_plain, store) is not None
    alone = [oc.standalone for oc in (cs[0] for cs in hm_plain.top.costs)]
    j = alone.index(False)  # a block whose only option keeps a phantom
    assert chain_stages(hm_plain, [BlockOp("Fe", i) if i == j + 1 else op
                                   for i, op in enumerate(store, 1)]) is None
    assert chain_stages(hm_plain, [BlockOp("Fe", 1) if alone[0] else store[0]]
                        + store[1:]) is not None
    swapped = (store[:L + 1] + [BlockOp("B", L, 0), BlockOp("Fn", 2, 0), BlockOp("Fn", 1, 0)]
               + store[L + 2:])
    assert chain_stages(hm_plain, swapped) is None


def test_no_round_above_a_fit_its_work_limit_stopped():
    """The search tries higher abstract budgets above a fitting schedule that leaves room only
    when that schedule's MILP was solved to optimality."""
    proved = hilp_top._Search(1000)
    proved.fit(1000, 900, proved=True)
    assert proved.next_budgets() == [1050, 1100]
    stopped = hilp_top._Search(1000)
    stopped.fit(1000, 900, proved=False)
    assert stopped.next_budgets() == []


def test_no_round_below_an_overflow_proved_optimal_down_to_where_its_solution_holds():
    """Between a fit and an overflow whose MILP was solved to optimality, the search tries only
    below the lowest budget that still admits the overflow's solution: above it a MILP would
    find the same objective again. The check can fail: without that budget, the thirds."""
    plain = hilp_top._Search(1000)
    plain.fit(1000, 900)
    plain.over(1090, 1010)
    assert plain.next_budgets() == [1030, 1060]
    known = hilp_top._Search(1000)
    known.fit(1000, 900)
    known.over(1090, 1010, same_from=1015)  # within RETRY_ROOM of the fit: done
    assert known.next_budgets() == []
    known.over(1090, 1010, same_from=1060)
    assert known.next_budgets() == [1020, 1040]


def _violation(hm, x) -> float:
    """How far ``x`` breaks the bounds of ``hm``'s MILP (0: it meets them all)."""
    m = hm.milp
    ax = m.A @ x
    return float(max(0.0, (ax - m.row_hi).max(), (m.row_lo - ax).max(), (x - m.col_hi).max(),
                     (m.col_lo - x).max()))


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6), n=st.integers(8, 14), fraction=st.sampled_from([0.3, 0.8]))
def test_the_lowest_budget_met_admits_the_solution_and_one_below_does_not(seed, n, fraction):
    """:func:`lowest_budget_met` against the models themselves: a MILP's solution at a budget
    is a point of the model (same memory unit) at the budget it names, and of none a byte
    lower, where its memory would exceed the bound."""
    g = random_graph(seed, n)
    problem = problem_of(g, SequencePartition())
    budget = _tight(g, problem, fraction)
    top = top_graph(problem, True)
    hm = build_hier_model(top, budget, float(budget))
    res = _solve(hm.milp)
    if not res.has_solution:
        return
    low = lowest_budget_met(hm, res.x)
    assert low <= budget
    solved = _violation(hm, res.x)  # the backend's own tolerance, on any row
    assert _violation(build_hier_model(top, low, float(budget)), res.x) <= solved + 1e-12
    assert _violation(build_hier_model(top, low - 1, float(budget)), res.x) > solved


def test_hilp_top_gets_rk_rotors_chains(monkeypatch):
    """With the default top composers (hilp-top first in the configuration), rk-Rotor runs
    first and hilp-top's compose gets its schedules' operations, fastest first."""
    seen: list = []
    original = HilpTop.compose

    def spy(self, problem, budget, save_budget=None, chains=()):
        seen.append(list(chains))
        return original(self, problem, budget, save_budget, chains)

    monkeypatch.setattr(HilpTop, "compose", spy)
    g = residual_chain(8, size=1000)
    budget = int(0.6 * simulate(g, autodiff_schedule(g)).peak)
    solve_graph(g, budget, "hiremate", flat_max_nodes=0, **FAST)
    assert seen and seen[0]
    assert all(isinstance(op, BlockOp) for op in seen[0][0])


def test_chains_leave_a_search_solved_to_optimality_as_it_was():
    """The chains are floors, not the backend's start: where the MILPs are solved to
    optimality, the search with them returns the same schedules as without."""
    g = residual_chain(6, size=1000)
    problem = problem_of(g, SequencePartition(), menu="hilp")
    budget = _tight(g, problem, 0.5)
    cands, _ = RkRotorTop(slots=100).compose(problem, budget)
    chains = [c.detail["ops"] for c in sorted(cands, key=lambda c: c.sim.time)]
    assert chains
    plain, _ = HilpTop(retries=2).compose(problem, budget)
    chained, _ = HilpTop(retries=2).compose(problem, budget, chains=chains)
    assert all(c.detail["status"] == "optimal" for c in plain)
    assert [c.schedule for c in chained] == [c.schedule for c in plain]
