"""Context-aware menu refinement of the hierarchical H-ILP (``solvers/hilp/refine.py``).

Truths used: the simulator (every candidate replayed on the full graph; the smallest slack of
a schedule's top-level steps is the budget minus its simulated peak), the flat H-ILP's proven
optimum on small U-shaped graphs (a lower bound of every hierarchical schedule, reached with
refinement where the unrefined menu cannot), and the unrefined result (a refinement round
keeps every earlier candidate, so it is never slower).
"""

from __future__ import annotations

import pytest

from hiremate.errors import ConfigError
from hiremate.partition import PeelPartition, SequencePartition
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.solvers.hilp.flat import CheckmateSolver, HilpSolver
from hiremate.solvers.hilp.hier import top_graph
from hiremate.solvers.hilp.top import HilpTop
from hiremate.solvers.menu import option_from_schedule
from hiremate.solvers.hilp.refine import SOLVER_NAME, block_contexts, local_figures, step_slacks
from test_hier_peel import u_shaped
from test_hilp_hier import problem_of


def coarse_hilp(problem):
    """Each block's menu: the one H-ILP option at the block's store-everything peak (what a
    one-point budget grid gives), so the top level can only keep all or recompute all."""
    for b in problem.blocks:
        peak = simulate(b.graph, autodiff_schedule(b.graph)).peak
        sched = HilpSolver(time_limit=5).solve(b.graph, peak).schedule
        b.options = [option_from_schedule(b.graph, sched, "hilp")]
    return problem


def compose(problem, budget, rounds):
    found, _ = HilpTop(time_limit=10, refine_rounds=rounds, refine_min=3,
                       refine_time=5).compose(problem, budget)
    for c in found:
        sim = simulate(problem.graph, c.schedule)
        assert sim.valid and sim.peak <= budget and sim.time == pytest.approx(c.sim.time)
    return min(found, key=lambda c: c.sim.time) if found else None


def test_refinement_reaches_the_flat_optimum_from_a_one_option_menu():
    """Each block's menu holds only its store-everything option (plus the checkpoint option):
    the hierarchy must recompute the U-Net level's whole block. One round of refinement solves
    that block for the memory the schedule leaves it and reaches the flat optimum."""
    g = u_shaped(3)
    budget = int(0.8 * simulate(g, autodiff_schedule(g)).peak)
    flat = CheckmateSolver(time_limit=30).solve(g, budget)
    assert flat.status == "optimal"
    problem = coarse_hilp(problem_of(g, PeelPartition("sequence", 5)))
    plain = compose(problem, budget, 0)
    refined = compose(problem, budget, 1)
    assert plain.sim.time > flat.simulation.time + 1.0
    assert refined.sim.time == pytest.approx(flat.simulation.time)
    assert SOLVER_NAME in refined.detail["block_solvers"][2]
    assert all(SOLVER_NAME not in s for s in plain.detail["block_solvers"])
    assert all(o.solver != SOLVER_NAME for b in problem.blocks for o in b.options)  # not mutated


def test_menus_without_hilp_options_are_not_refined():
    """The same one-option menus, but made by autodiff (as with TW-Remat menus only): the top
    level runs no block H-ILP, and the result is the unrefined one."""
    g = u_shaped(3)
    budget = int(0.8 * simulate(g, autodiff_schedule(g)).peak)
    problem = problem_of(g, PeelPartition("sequence", 5), menu="store")
    assert {o.solver for b in problem.blocks for o in b.options} == {"autodiff"}
    plain = compose(problem, budget, 0)
    refined = compose(problem, budget, 1)
    assert refined.sim.time == plain.sim.time
    assert all(SOLVER_NAME not in s for s in refined.detail["block_solvers"])


@pytest.mark.parametrize("post,frac,peel,menu", [
    (3, 0.9, False, "hilp"), (2, 0.9, False, "coarse"), (3, 0.8, True, "hilp"),
    (2, 0.8, False, "hilp"), (2, 0.9, True, "hilp")])
def test_refinement_is_never_slower_and_never_below_the_flat_optimum(post, frac, peel, menu):
    g = u_shaped(post)
    budget = int(frac * simulate(g, autodiff_schedule(g)).peak)
    flat = CheckmateSolver(time_limit=30).solve(g, budget)
    part = PeelPartition("sequence", 5) if peel else SequencePartition()
    problem = problem_of(g, part, menu=menu) if menu == "hilp" else coarse_hilp(problem_of(g, part))
    plain = compose(problem, budget, 0)
    refined = compose(problem, budget, 2)
    assert refined.sim.time <= plain.sim.time + 1e-9
    assert refined.sim.time >= flat.simulation.time - 1e-9 * flat.simulation.time


def test_slacks_cover_the_schedule_and_meet_the_simulated_peak():
    """Per top-level step, the budget minus the highest simulated memory while it runs: the
    smallest of them is the budget minus the schedule's simulated peak; the block's context
    takes its figures from the option the schedule used."""
    g = u_shaped(3)
    budget = int(0.8 * simulate(g, autodiff_schedule(g)).peak)
    problem = problem_of(g, PeelPartition("sequence", 5), menu="hilp")
    top = top_graph(problem)
    ht = HilpTop(time_limit=10, refine_rounds=0)
    sol = ht.solve_at(problem, top, budget)
    assert sol.sim.valid and sol.sim.peak <= budget
    from hiremate.ir.sequence import sequence_to_schedule

    sched = sequence_to_schedule(g, sol.sequence)
    slack = step_slacks(problem, top, sol.steps, sched, budget)
    assert len(slack) == len(sol.steps)
    assert min(s for s in slack if s is not None) == budget - simulate(g, sched).peak
    (ctx,) = block_contexts(problem, top, sol.steps, sched, budget, min_nodes=3)
    assert ctx.block == 2 and min(ctx.slack_fwd, ctx.slack_phantom, ctx.slack_bwd) >= 0
    used = problem.blocks[2].options[ctx.option]
    assert (ctx.fwd_peak, ctx.held, ctx.bwd_peak) == local_figures(problem.blocks[2], used)
    peak, save = ctx.budgets([])[-1]
    assert save == ctx.held + ctx.slack_phantom
    assert peak == min(ctx.fwd_peak + ctx.slack_fwd, ctx.bwd_peak + ctx.slack_bwd)


def test_refinement_rounds_must_be_a_whole_number():
    with pytest.raises(ConfigError, match="refine_rounds"):
        HilpTop(refine_rounds=-1)
    with pytest.raises(ConfigError, match="refine_rounds"):
        HilpTop(refine_rounds=1.5)


def test_a_refinement_round_that_times_out_keeps_the_earlier_schedules(monkeypatch):
    """The refined top level finds nothing in its time limit: the first round's candidates
    are returned."""
    from hiremate.solvers.hilp import top as mod

    g = u_shaped(3)
    budget = int(0.8 * simulate(g, autodiff_schedule(g)).peak)
    problem = coarse_hilp(problem_of(g, PeelPartition("sequence", 5)))
    real = HilpTop.solve_at
    refined_calls = []

    def flaky(self, problem, top, abstract, start_from=None, mem_unit=None, save_budget=None,
              chains=()):
        if any(o.solver == SOLVER_NAME for b in problem.blocks for o in b.options):
            refined_calls.append(abstract)
            assert start_from is not None  # the refined search starts from the best schedule
            return mod.TopSolution(abstract, "time_limit", float("inf"), 0.0, 0.0, [], [], None)
        return real(self, problem, top, abstract, start_from, mem_unit, save_budget,
                    chains=chains)

    monkeypatch.setattr(HilpTop, "solve_at", flaky)
    best = compose(problem, budget, 1)
    assert refined_calls, "no refinement round ran"
    assert best is not None and best.sim.peak <= budget


def assert_solves(m, y, objective: float) -> None:
    """``y`` satisfies every row, bound and integrality of MILP ``m``, at ``objective``."""
    import numpy as np

    act = m.A @ y
    assert np.all(act >= m.row_lo - 1e-6) and np.all(act <= m.row_hi + 1e-6)
    assert np.all(y >= m.col_lo - 1e-9) and np.all(y <= m.col_hi + 1e-9)
    assert np.allclose(y[m.integer], np.round(y[m.integer]), atol=1e-6)
    assert float(m.c @ y) == pytest.approx(objective, rel=1e-6)


def test_a_solution_carries_over_to_a_menu_with_more_options():
    """The warm start of a refined top level: the earlier solution, mapped onto the model with
    the larger menus, satisfies every row and bound of that model and has the same objective."""
    from dataclasses import replace

    from hiremate.ir.blocks import TopProblem
    from hiremate.solvers.hilp.hier import build_hier_model, carry_solution

    g = u_shaped(3)
    budget = int(0.8 * simulate(g, autodiff_schedule(g)).peak)
    problem = coarse_hilp(problem_of(g, PeelPartition("sequence", 5)))
    sol = HilpTop(time_limit=10).solve_at(problem, top_graph(problem), budget)
    assert sol.model is not None and sol.x is not None
    richer = problem_of(g, PeelPartition("sequence", 5), menu="hilp")
    # (options with a phantom only: an option without one would replace the checkpoint option
    # that the earlier solution may use, and then there is nothing to carry over)
    blocks = [replace(b, options=list(b.options) + [o for o in r.options if o.phantom])
              for b, r in zip(problem.blocks, richer.blocks)]
    new = build_hier_model(top_graph(TopProblem(g, blocks, problem.tail)), budget)
    assert new.milp.shape[1] > sol.model.milp.shape[1]
    y = carry_solution(sol.model, sol.x, new)
    assert y is not None
    assert_solves(new.milp, y, sol.objective)
    other = build_hier_model(top_graph(TopProblem(g, blocks, problem.tail)), budget + 64)
    assert carry_solution(sol.model, sol.x, other) is None  # another memory unit: no warm start


def test_a_solution_carries_over_to_a_higher_budget_with_the_same_memory_unit():
    """The warm start of a retry upwards: with one memory unit, a solution under a lower
    budget satisfies the model under a higher one; under a lower budget it is not offered."""

    from hiremate.solvers.hilp.hier import build_hier_model, carry_solution

    g = u_shaped(3)
    budget = int(0.8 * simulate(g, autodiff_schedule(g)).peak)
    problem = coarse_hilp(problem_of(g, PeelPartition("sequence", 5)))
    top = top_graph(problem)
    sol = HilpTop(time_limit=10).solve_at(problem, top, budget, mem_unit=2 * budget)
    assert sol.model is not None and sol.model.flat.mem_unit == 2 * budget
    higher = build_hier_model(top, budget + budget // 10, 2 * budget)
    y = carry_solution(sol.model, sol.x, higher)
    assert y is not None
    assert_solves(higher.milp, y, sol.objective)
    lower = build_hier_model(top, budget - budget // 10, 2 * budget)
    assert carry_solution(sol.model, sol.x, lower) is None


def test_retries_upwards_never_return_a_slower_schedule(monkeypatch):
    """Each retry at a higher abstract budget is warm-started from the fastest schedule that
    fitted before its round, so even a try stopped at once by its time limit returns one at
    least as fast as that."""
    g = u_shaped(3)
    full = simulate(g, autodiff_schedule(g)).peak
    problem = coarse_hilp(problem_of(g, PeelPartition("sequence", 5)))
    real = HilpTop.solve_at
    hinted = []

    def low_first(self, problem, top, abstract, start_from=None, mem_unit=None,
                  save_budget=None, chains=()):
        # the first try at a lower abstract budget, so that there is room for retries
        sol = real(self, problem, top, abstract if start_from is not None or abstract < full
                   else int(0.85 * abstract), start_from, mem_unit, save_budget,
                   chains=chains)
        if start_from is not None:
            hinted.append((start_from.abstract_budget, abstract, start_from.sim.time,
                           sol.sim.time if sol.sim is not None else None))
        return sol

    monkeypatch.setattr(HilpTop, "solve_at", low_first)
    found, _ = HilpTop(time_limit=10, retries=3, refine_rounds=0).compose(problem, full)
    assert hinted and all(a <= b for a, b, _, _ in hinted)
    assert all(t is not None and t <= h * (1 + 1e-9) for _, _, h, t in hinted)
    assert len(found) >= 2


def test_the_search_does_not_depend_on_its_workers(monkeypatch):
    """A round's abstract budgets depend on the earlier rounds only: one thread or two give the
    same tries and the same candidates."""
    g = u_shaped(3)
    full = simulate(g, autodiff_schedule(g)).peak
    problem = coarse_hilp(problem_of(g, PeelPartition("sequence", 5)))
    real = HilpTop.solve_at
    tries: dict[int, list[int]] = {1: [], 2: []}

    def low_first(self, problem, top, abstract, start_from=None, mem_unit=None,
                  save_budget=None, chains=()):
        tries[self.workers].append(abstract)
        return real(self, problem, top, abstract if abstract < full else int(0.85 * abstract),
                    start_from, mem_unit, save_budget, chains=chains)

    monkeypatch.setattr(HilpTop, "solve_at", low_first)
    found = {w: HilpTop(time_limit=10, retries=5, refine_rounds=0, workers=w).compose(
        problem, full)[0] for w in (1, 2)}
    assert len(tries[1]) >= 3 and sorted(tries[1]) == sorted(tries[2])
    assert [c.schedule for c in found[1]] == [c.schedule for c in found[2]]
