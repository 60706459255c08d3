"""Rotor's DPs: the paper's toy example and counter-example, exhaustive search, graph level."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from chain_exhaustive import exhaustive_chain  # noqa: E402

from hiremate.errors import InfeasibleBudgetError, SolverError  # noqa: E402
from hiremate.ir.schedule import Compute  # noqa: E402
from hiremate.ir.simulator import autodiff_schedule, simulate  # noqa: E402
from hiremate.testing.synthetic import chain_graph, random_graph  # noqa: E402
from hiremate.solvers.chain.model import (  # noqa: E402
    Chain, graph_chain, ops_to_schedule, parse_ops, simulate_chain, store_all_ops,
)
from hiremate.solvers.chain.rotor import (  # noqa: E402
    CHAIN_SOLVERS, Rotor, RotorPersistent, persistent_min_budget, solve_persistent, solve_weak,
)

# Table 2 of the Rotor paper (MB, ms); stage 7 is the loss
TOY = Chain.from_paper(
    x=[7.63, 9.54, 10.68, 11.06, 10.68, 9.54, 7.63, 0.0],
    xbar=[9.54, 10.68, 11.08, 10.66, 9.54, 7.63, 0.0],
    uf=[1.60, 2.20, 2.44, 2.51, 2.10, 1.43, 0.0],
    ub=[3.05, 4.48, 5.09, 4.93, 4.21, 3.34, 0.0],
    ob=[20.01, 27.64, 30.99, 30.99, 27.64, 19.08, 0.0],
)


def test_toy_example_section_3_2():
    store = simulate_chain(TOY, store_all_ops(TOY))
    assert store.makespan == pytest.approx(37.4, abs=0.05)
    assert store.peak == pytest.approx(107.0, abs=0.05)
    for solve in (solve_persistent, solve_weak):
        sol = solve(TOY, 90.0)
        assert sol.makespan == pytest.approx(47.4, abs=0.05)
        assert sol.peak == pytest.approx(86.8, abs=0.05)
        assert sol.peak <= 90.0
    # the paper's sequence (its first F_all^3 only serves as a^3: F_e^3 F_all^4 here)
    paper = parse_ops("Fck1 Fe2 Fe3 Fall4 Fall5 Fall6 Fall7 B7 B6 B5 B4 Fck1 Fe2 Fall3 B3 "
                      "Fall1 Fall2 B2 B1")
    res = simulate_chain(TOY, paper)
    assert res.valid and res.makespan == pytest.approx(47.42) and res.peak == pytest.approx(86.75)


def random_chain(rng: random.Random, stages: int) -> Chain:
    L = stages
    x = [rng.randint(0, 3)] + [rng.randint(1, 8) for _ in range(L)] + [0]
    xbar = [x[k] + rng.choice([0, 0, rng.randint(1, 5)]) for k in range(1, L + 1)] + [0]
    return Chain.from_paper(
        x, xbar, [rng.randint(1, 6) for _ in range(L)] + [0],
        [rng.randint(1, 6) for _ in range(L)] + [0],
        [rng.choice([0, rng.randint(0, 4)]) for _ in range(L)] + [0],
        [rng.choice([0, rng.randint(0, 4)]) for _ in range(L)] + [0],
        kept_after_loss=rng.choice([0, 0, rng.randint(1, 3)]),
    )


def _budgets(rng, chain):
    top = simulate_chain(chain, store_all_ops(chain)).peak
    lo = math.ceil(persistent_min_budget(chain))
    return sorted({lo, rng.randint(lo, max(lo, int(top))), max(lo, int(top))})


def _check_against_exhaustive(seed: int, max_stages: int) -> None:
    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(1, max_stages))
    for budget in _budgets(rng, chain):
        slots = max(int(budget - chain.x[0]), 1)  # one slot per unit: no rounding
        for solve, persistent in ((solve_persistent, True), (solve_weak, False)):
            want, _ = exhaustive_chain(chain, budget, persistent=persistent)
            sol = solve(chain, budget, slots=slots)
            assert sol.makespan == pytest.approx(want), (seed, budget, persistent, str(sol))
            assert sol.peak <= budget


@pytest.mark.parametrize("seed", range(12))
def test_dps_match_exhaustive_search(seed):
    _check_against_exhaustive(seed, 5)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 140))
def test_dps_match_exhaustive_search_length_6(seed):
    _check_against_exhaustive(seed, 6)


def test_min_budget_is_tight():
    for seed in range(6):
        chain = random_chain(random.Random(seed), 4)
        lo = persistent_min_budget(chain)
        assert solve_persistent(chain, lo).peak <= lo + 1e-9
        assert math.isinf(exhaustive_chain(chain, lo - 0.5, persistent=True)[0])
        with pytest.raises(ValueError):
            solve_persistent(chain, lo - 0.5)


def counter_example(n: int) -> Chain:
    """Section 4.1, Figure 4: L = n + 2, k = n - 2."""
    L, k = n + 2, n - 2
    x = [0, 1] + [3] * (L - 2) + [4, 0]
    return Chain.from_paper(x, x[1:], [k, 2] + [0] * (L - 1), [0] * (L + 1))


@pytest.mark.parametrize("n", [5, 6, 8])
def test_counter_example_section_4_1(n):
    chain = counter_example(n)
    persistent = solve_persistent(chain, 15, slots=15)
    weak = solve_weak(chain, 15, slots=15)
    assert persistent.makespan == 3 * n - 2      # T1 = T2 = 3n - 2
    assert weak.makespan == 2 * n + 2            # T0 = 2n + 2
    assert max(persistent.peak, weak.peak) <= 15


@pytest.mark.slow
def test_counter_example_exhaustive():
    chain = counter_example(5)
    assert exhaustive_chain(chain, 15, persistent=True)[0] == 13
    assert exhaustive_chain(chain, 15, persistent=False)[0] == 12


# -- graph level -------------------------------------------------------------------------------
def _chain_case(sizes, times):
    g = chain_graph(sizes, times)
    gc, why = graph_chain(g)
    assert gc is not None, why
    return g, gc


def test_graph_chain_store_all_matches_simulator():
    g, gc = _chain_case([100, 200, 300, 150, 250], [1, 2, 3, 1, 2])
    sched = ops_to_schedule(gc, store_all_ops(gc.chain))
    res = simulate(g, sched)
    chain_res = simulate_chain(gc.chain, store_all_ops(gc.chain))
    assert res.valid, res.error
    assert res.time == pytest.approx(g.total_time())
    assert res.peak == chain_res.peak


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(1, 500), min_size=1, max_size=9),
       seed=st.integers(0, 10**6), frac=st.floats(0, 1))
def test_rotor_graph_schedules_are_valid(sizes, seed, frac):
    rng = random.Random(seed)
    g, gc = _chain_case(sizes, [rng.uniform(0.5, 3) for _ in sizes])
    top = simulate(g, ops_to_schedule(gc, store_all_ops(gc.chain))).peak
    for solver in (RotorPersistent(), Rotor()) if len(sizes) <= 5 else (RotorPersistent(),):
        lo = solver.min_budget(g)
        budget = int(lo + frac * max(top - lo, 0))
        sched = solver.schedule(g, budget)
        res = simulate(g, sched)
        assert res.valid, res.error
        assert res.peak <= budget
        sol = solver.solve_chain(gc.chain, budget)
        assert res.time == pytest.approx(sol.makespan) and res.peak == sol.peak
        with pytest.raises(InfeasibleBudgetError) as info:
            solver.schedule(g, lo - 1)
        assert info.value.min_budget == lo
    # with the store-everything budget (and exact one-byte slots) nothing is recomputed
    res = simulate(g, RotorPersistent(slots=top).schedule(g, top))
    assert res.time == pytest.approx(g.total_time())


def test_rotor_beats_nothing_it_should_not():
    # more memory never makes the optimal persistent makespan worse
    g, gc = _chain_case([50, 80, 120, 60, 90, 70, 40, 100], [1, 2, 1.5, 1, 3, 1, 2, 1])
    solver = RotorPersistent()
    lo = solver.min_budget(g)
    times = [simulate(g, solver.schedule(g, b)).time for b in range(lo, lo + 400, 40)]
    assert all(a >= b - 1e-9 for a, b in zip(times, times[1:]))


def test_not_applicable_to_general_graphs():
    g = random_graph(3, 8, max_fanin=3)
    assert not Rotor().applicable(g)
    with pytest.raises(SolverError):
        RotorPersistent().schedule(g, 10**9)
    assert set(CHAIN_SOLVERS) >= {"rotor", "rotor-persistent", "checkpoint-sequential",
                                  "autodiff"}
    assert Compute(0) in autodiff_schedule(g)
