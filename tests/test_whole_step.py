"""The whole step: what the solvers are shown, and how many solves the walk takes when a
schedule still overflows the budget.

Each retry is a whole solve (minutes on GPT-96), so the walk must not creep down by the last
overflow alone. These tests drive :func:`solve_whole_step` with a stand-in solver whose
schedules overflow by a set amount, so that the walk's choices are what is checked.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import hiremate
from hiremate.composer import whole_step
from hiremate.composer.step_view import last_needed
from hiremate.config import load_config
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.graph import DataKind, Graph
from hiremate.ir.simulator import step_peak
from hiremate.testing.synthetic import random_graph


def _with_random_ops(graph: Graph, per_state: int, randoms: int = 3) -> Graph:
    """``graph`` with its first ``randoms`` forward nodes drawing random numbers, each
    generator state ``per_state`` bytes."""
    payload = graph.to_dict()
    for node in [n for n in payload["nodes"] if n["kind"] == "fwd"][:randoms]:
        node["random"] = True
    payload["meta"]["rng_state_bytes"] = per_state
    return Graph.from_dict(payload)


def _has_states(graph: Graph) -> bool:
    return any(d.name.startswith("generator_state_") for d in graph.data)


def _walk(monkeypatch, per_state: int, budget: int, held: list[int]):
    """Run the walk at ``budget`` with a stand-in solver that finds nothing when the states
    are counted, and whose k-th schedule without them peaks at the budget it was asked for,
    where ``held[k]`` bytes of generator states are held (nothing after the list); return
    what the walk reserved in each solve and the full reserve (every state at once)."""
    graph = _with_random_ops(random_graph(5, 12), per_state)
    asked: list[int] = []

    def solve(g, nbytes, cfg, cache):
        if _has_states(g):
            raise InfeasibleBudgetError("the states do not fit", min_budget=None)
        asked.append(nbytes)
        return SimpleNamespace(schedule=(), report={}, others=[])

    def report(g, result, nbytes, loss):
        k = len(asked) - 1
        return asked[-1] + (held[k] if k < len(held) else 0)

    monkeypatch.setattr(whole_step, "whole_step_report", report)
    monkeypatch.setattr(whole_step, "simulate", lambda g, s: SimpleNamespace(peak=asked[-1]))
    whole_step.solve_whole_step(graph, budget, load_config("hiremate"), None, solve, 0)
    return [budget - a for a in asked], whole_step.rng_state_reserve(graph)


def test_the_solvers_see_the_whole_step_and_solve_once():
    """The first solve is of the step's view: output gradients that may not be freed, the
    loss's memory on the loss node, and each random op's generator state made by the loss
    node and read by the last backward node that may need the op rerun. When its schedule
    fits, that is the only solve."""
    graph = _with_random_ops(random_graph(5, 12), 5_000)
    seen: list[Graph] = []

    def solve(g, nbytes, cfg, cache):
        seen.append(g)
        return SimpleNamespace(schedule=hiremate.autodiff_schedule(g), report={}, others=[])

    result = whole_step.solve_whole_step(graph, 10**9, load_config("hiremate"), None, solve,
                                         777)
    assert len(seen) == 1 and result.report["whole_step_solves"] == 1
    assert hiremate.simulate(graph, result.schedule).valid
    assert result.report["predicted_peak"] == step_peak(graph, result.schedule, 777)
    view = seen[0]
    tangents = {d.id for d in graph.data if d.kind is DataKind.TANGENT}
    assert tangents and tangents <= set(view.final_data)  # held until the backward returns
    assert view.nodes[view.loss].overhead == graph.nodes[graph.loss].overhead + 777
    needed = last_needed(graph)
    states = [d for d in view.data if d.name.startswith("generator_state_")]
    assert len(states) == len(needed) > 0
    for op, d in zip(sorted(needed), states):
        assert d.size == 5_000 and d.producer == graph.loss
        assert view.users(d.id) == (needed[op],)  # the last node that may need a rerun
        assert view.nodes[op].overhead == graph.nodes[op].overhead + 5_000  # an interrupted one


def test_a_cheap_full_reserve_is_taken_from_the_first_walk_solve(monkeypatch):
    """When the states view finds nothing and reserving every state costs at most 2 % of the
    budget, the walk's first solve reserves them, and the walk ends there."""
    budget = 48_000_000
    reserves, full = _walk(monkeypatch, 100_000, budget, [200_000, 220_000, 250_000])
    assert full <= whole_step.CHEAP_RESERVE * budget
    assert reserves == [full]


def test_a_dear_reserve_is_approached_by_halves(monkeypatch):
    """When the states would cost much of the budget, the first retry moves by the overflow
    (at least one state) and the later ones at least halfway to the full reserve, so small
    overflows cannot make the walk creep."""
    budget = 1_000_000
    held = [1_000 * k for k in range(1, 400)]  # each schedule holds a little more than the last
    per_state = 20_000
    reserves, full = _walk(monkeypatch, per_state, budget, held)
    assert full > whole_step.CHEAP_RESERVE * budget
    assert reserves[1] == max(held[0], per_state)  # the first retry is not hastened
    for before, after in zip(reserves[1:], reserves[2:]):
        assert after >= (before + full) // 2
    assert len(reserves) <= 3 + (full - reserves[1]).bit_length()


def test_an_overflow_past_the_full_reserve_is_an_error(monkeypatch):
    """A schedule that overflows even with everything reserved ends the walk with an error
    that names the budget that always works."""
    with pytest.raises(InfeasibleBudgetError, match="raise the budget"):
        _walk(monkeypatch, 1_000, 1_000_000, [10**9] * 64)


def test_a_budget_below_one_that_failed_is_not_solved_again(monkeypatch):
    """Once the solvers fail at some budget, the walk never solves at that budget or a lower
    one again (an exact solver's proof of infeasibility is its slowest solve, and a lower
    budget only fails the same way); it ends with the error naming what always works."""
    graph = _with_random_ops(random_graph(5, 12), 10_000)
    floor, held = 900_000, 30_000  # the solvers' lowest; what each schedule holds unseen
    asked: list[int] = []
    failed: list[int] = []

    def solve(g, nbytes, cfg, cache):
        if _has_states(g):
            raise InfeasibleBudgetError("the states do not fit", min_budget=None)
        assert not any(nbytes <= f for f in failed), (nbytes, failed)
        asked.append(nbytes)
        if nbytes < floor:
            failed.append(nbytes)
            raise InfeasibleBudgetError("below the floor", min_budget=floor)
        return SimpleNamespace(schedule=(), report={}, others=[])

    monkeypatch.setattr(whole_step, "whole_step_report", lambda g, r, n, loss: asked[-1] + held)
    monkeypatch.setattr(whole_step, "simulate", lambda g, s: SimpleNamespace(peak=asked[-1]))
    budget = floor + 20_000
    with pytest.raises(InfeasibleBudgetError) as info:
        whole_step.solve_whole_step(graph, budget, load_config("hiremate"), None, solve, 0)
    assert failed, "the walk never reached the floor"
    assert info.value.min_budget == floor + whole_step.rng_state_reserve(graph)
    # at the budget, below it (fails), at the floor (overflows); the next try is skipped
    assert len(asked) == 3, asked


def test_the_report_times_the_whole_walk(monkeypatch):
    """``solve_time`` is the walk's, not its last solve's (each solve's own report times only
    itself), and ``whole_step_solves`` counts the solves: the tables users read take it."""
    import time

    graph = _with_random_ops(random_graph(5, 12), 100_000)  # dear states: not reserved
    asked: list[int] = []

    def solve(g, nbytes, cfg, cache):
        asked.append(nbytes)
        time.sleep(0.05)
        return SimpleNamespace(schedule=(), report={"solve_time": 0.05}, others=[])

    monkeypatch.setattr(whole_step, "whole_step_report",
                        lambda g, r, n, loss: asked[-1] + (5_000 if len(asked) == 1 else 0))
    monkeypatch.setattr(whole_step, "simulate", lambda g, s: SimpleNamespace(peak=asked[-1]))
    result = whole_step.solve_whole_step(graph, 1_000_000, load_config("hiremate"), None, solve,
                                         0)
    assert len(asked) == 2 and result.report["whole_step_solves"] == 2
    assert result.report["solve_time"] >= 0.1


def _overflowing_solves(monkeypatch, walk_finds: bool):
    """Solve the whole step with a stand-in solver: the states view's winner overflows the step
    and a slower candidate of the same solve fits it; each walk solve's winner overflows
    (``walk_finds`` False: then the walk's next solve finds nothing) or fits, faster than
    that candidate. Returns the result and the budgets solved."""
    from hiremate.ir.blocks import Candidate

    graph = _with_random_ops(random_graph(5, 12), 100_000)  # dear states: not reserved
    budget = 1_000_000
    asked: list[int] = []

    def sim(time):
        return SimpleNamespace(time=time, peak=0, valid=True)

    def solve(g, nbytes, cfg, cache):
        asked.append(nbytes)
        if len(asked) == 1:  # the states view: its slower candidate fits the step
            slow = Candidate(("slow",), sim(2.0), "slow-source")
            return SimpleNamespace(schedule=("fast",), sim=sim(1.0), others=[slow],
                                   report={"solver": "fast-source"})
        if len(asked) > 2 and not walk_finds:
            raise InfeasibleBudgetError("nothing fits", min_budget=None)
        return SimpleNamespace(schedule=("walk",), sim=sim(1.5), others=[],
                               report={"solver": "walk-source"})

    def report(g, result, nbytes, loss):
        fits = result.schedule == ("slow",) or (walk_finds and result.schedule == ("walk",))
        return nbytes if fits else nbytes + 5_000

    monkeypatch.setattr(whole_step, "whole_step_report", report)
    monkeypatch.setattr(whole_step, "step_peak", lambda g, s, loss: report(g, SimpleNamespace(
        schedule=s), budget, loss))
    monkeypatch.setattr(whole_step, "simulate", lambda g, s: SimpleNamespace(peak=asked[-1]))
    monkeypatch.setattr(whole_step, "without_random_reruns", lambda *a: None)
    monkeypatch.setattr(whole_step, "_finished", lambda g, r, *a: r)
    result = whole_step.solve_whole_step(graph, budget, load_config("hiremate"), None, solve, 0)
    return result, asked


def test_an_overflowing_solve_keeps_a_candidate_that_fits_the_step(monkeypatch):
    """When a solve's winner overflows the step but a slower candidate of the same solve fits
    (a polish that reruns a random op in the forward keeps its state there, which the view
    counts only from the loss), the walk goes on; when it finds nothing, that candidate is
    the answer instead of an error (OPT from configs at 0.5 raised after three solves)."""
    result, asked = _overflowing_solves(monkeypatch, walk_finds=False)
    assert len(asked) >= 3
    assert result.schedule == ("slow",) and result.report["solver"] == "slow-source"
    assert result.report["step_overflow_winner"] == "fast-source"


def test_the_walk_replaces_the_kept_candidate_when_faster(monkeypatch):
    result, asked = _overflowing_solves(monkeypatch, walk_finds=True)
    assert len(asked) == 2 and result.schedule == ("walk",)


@pytest.mark.parametrize("below_by_more_than_the_states", [True, False])
def test_a_budget_far_below_what_the_solvers_meet_is_not_walked(monkeypatch,
                                                                below_by_more_than_the_states):
    """When the solvers' lowest peak with the generator states counted, less every state, is
    still above the budget, the walk without the states cannot end otherwise: the error comes
    after the one solve, naming that lowest peak. Nearer the budget the walk still runs."""
    graph = _with_random_ops(random_graph(5, 12), 10_000)
    full = whole_step.rng_state_reserve(graph)
    floor = 900_000  # the lowest peak the stand-in solvers meet, with or without the states
    calls: list[bool] = []

    def solve(g, nbytes, cfg, cache):
        calls.append(_has_states(g))
        raise InfeasibleBudgetError("below the floor", min_budget=floor)

    budget = floor - full - 1 if below_by_more_than_the_states else floor - full // 2
    with pytest.raises(InfeasibleBudgetError) as info:
        whole_step.solve_whole_step(graph, budget, load_config("hiremate"), None, solve, 0)
    if below_by_more_than_the_states:
        assert calls == [True] and info.value.min_budget == floor
    else:
        assert calls[0] and len(calls) >= 2 and not calls[1]
