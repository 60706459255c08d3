"""A top-level MILP with no starting point (:func:`hiremate.solvers.hilp.starts.from_cold`,
``hilp-top``'s ``cold_share``): its first schedule within a share of its work limit, the rest of
the work from that schedule.

Why it exists: at a budget that nothing meets, the hierarchical H-ILP of ALBERT spent its whole
work limit (minutes) finding no schedule before the solve could refuse the budget; a share
makes the refusal fast, at the risk of missing a first schedule that lies deeper (the default is
the whole limit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from hiremate.errors import ConfigError
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.partition import HPartition
from hiremate.solvers.hilp import top as top_module
from hiremate.solvers.hilp.hier import top_graph
from hiremate.solvers.hilp.starts import cold_work, from_cold
from hiremate.solvers.hilp.top import HilpTop
from test_hilp_hier import check_sound, problem_of
from test_registry import residual_chain


@dataclass
class FakeResult:
    status: str
    x: np.ndarray | None = None

    @property
    def has_solution(self) -> bool:
        return self.x is not None


def recording(outcomes: list[FakeResult]):
    """A ``solve(start, work)`` that returns ``outcomes`` in turn and records its calls."""
    calls: list[tuple] = []

    def solve(start, work):
        calls.append((None if start is None else start.tolist(), work))
        return outcomes[len(calls) - 1]

    return solve, calls


def test_cold_work_is_a_whole_share_of_the_nodes_and_at_least_one():
    assert cold_work(2000, integral_work=True, share=0.1) == 200
    assert cold_work(2000, integral_work=True, share=0.25) == 500
    assert cold_work(4, integral_work=True, share=0.1) == 1
    assert cold_work(1, integral_work=True) == 1
    assert cold_work(20.0, integral_work=False, share=0.1) == pytest.approx(2.0)


def test_a_cold_search_that_finds_nothing_stops_at_its_share():
    solve, calls = recording([FakeResult("unknown")])
    res = from_cold(solve, 2000, integral_work=True, share=0.1)
    assert res.status == "unknown"
    assert calls == [(None, 200)]


def test_a_first_schedule_is_improved_with_the_rest_of_the_work():
    first = FakeResult("feasible", np.array([1.0, 0.0]))
    better = FakeResult("optimal", np.array([0.0, 1.0]))
    solve, calls = recording([first, better])
    assert from_cold(solve, 2000, integral_work=True, share=0.1) is better
    assert calls == [(None, 200), ([1.0, 0.0], 1800)]


def test_a_first_part_that_proves_optimality_is_the_answer():
    done = FakeResult("optimal", np.array([1.0]))
    solve, calls = recording([done])
    assert from_cold(solve, 2000, integral_work=True, share=0.1) is done
    assert calls == [(None, 200)]


def test_a_limit_too_small_to_split_runs_once_whole():
    """A menu MILP stopped at its root (work 1) is not solved twice; nor is any MILP under the
    default share, the whole limit."""
    for work, share in ((1, 0.1), (2000, None)):
        solve, calls = recording([FakeResult("feasible", np.array([1.0]))])
        from_cold(solve, work, integral_work=True, **({} if share is None else {"share": share}))
        assert calls == [(None, work)]


def test_cold_share_outside_its_range_is_refused():
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="cold_share"):
            HilpTop(cold_share=bad)


def test_a_cold_top_milp_reaches_the_optimum_of_the_whole_solve(monkeypatch):
    """With no plan as its start (forced here), the two-part solve of a small top level finds
    the schedule of the solve without the split: optimal both, the same objective, sound."""
    g = residual_chain(6, size=64)
    problem = problem_of(g, HPartition(max_top=4, max_sub=4), menu="hilp")
    top = top_graph(problem)
    budget = int(0.7 * simulate(g, autodiff_schedule(g)).peak)
    monkeypatch.setattr(top_module, "plan_start", lambda hm, solve: None)
    whole = HilpTop(retries=1, cold_share=1).solve_at(problem, top, budget)
    parts = []
    real = HilpTop._milp

    def counted(self, milp, hint=None, work_limit=None):
        parts.append((hint is not None, work_limit))
        return real(self, milp, hint, work_limit)

    monkeypatch.setattr(HilpTop, "_milp", counted)
    split = HilpTop(retries=1, work_limit=50, cold_share=0.1).solve_at(problem, top, budget)
    assert parts[0] == (False, 5)
    assert whole.status == "optimal" and split.status == "optimal"
    assert split.objective == pytest.approx(whole.objective, rel=1e-6)
    check_sound(problem, budget, split)
