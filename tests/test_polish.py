"""The polish stage: FastSA's annealing started from another solver's schedule
(:mod:`hiremate.solvers.fastsa.polish`) and its place in the default preset; the property test
also holds the window search (``hilp-window``, tests/test_hilp_window.py), which polishes too.

A polished schedule must be valid, within the budget, strictly faster than where it started, the
same in two runs, keep random nodes' first runs in the graph's order, and run in the executor
with eager's outputs, gradients and RNG state."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiremate
from hiremate.api import solve_graph
from hiremate.config import load_config
from hiremate.errors import ConfigError, InfeasibleBudgetError
from hiremate.ir.schedule import Compute
from hiremate.ir.sequence import sequence_to_schedule
from hiremate.registry import make_solver
from hiremate.testing.synthetic import random_graph
from test_memory_pins import fuzz_graph  # module level: its @given must not nest
from test_solvers_random_order import check_runs, graph as dropout_graph

PARAMS = {"polish_iters": 20_000, "polish_time_limit": 120.0}


def _start(graph, budget):
    """A schedule within ``budget`` to polish (TW-Remat's), or None."""
    try:
        return make_solver("twremat").schedule(graph, budget)
    except InfeasibleBudgetError:
        return None


#: the polishers and their settings (the window search's windows small, as its graphs here)
POLISHERS = [("fastsa", PARAMS), ("hilp-window", {"window": 6, "stride": 3})]


@pytest.mark.parametrize("name, params", POLISHERS, ids=[n for n, _ in POLISHERS])
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 100_000), n=st.integers(4, 40), frac=st.sampled_from([0.5, 0.7, 0.9]),
       p_random=st.sampled_from([0.0, 0.3]))
def test_polish_is_valid_faster_and_deterministic(name, params, seed, n, frac, p_random):
    graph = fuzz_graph(seed, n, p_random=p_random)
    ad = hiremate.simulate(graph, hiremate.autodiff_schedule(graph))
    budget = int(frac * ad.peak)
    start = _start(graph, budget)
    if start is None:
        return
    before = hiremate.simulate(graph, start)
    out = make_solver(name, params).polish(graph, budget, start)
    again = make_solver(name, params).polish(graph, budget, start)
    assert out == again  # seeded and iteration-limited: the same result
    if out is None:
        return
    sim = hiremate.simulate(graph, out)
    assert sim.valid, sim.error
    assert sim.peak <= budget
    assert sim.time < before.time


def test_polish_refuses_a_start_over_the_budget():
    graph = fuzz_graph(7, 20)
    sched = hiremate.autodiff_schedule(graph)
    peak = hiremate.simulate(graph, sched).peak
    assert make_solver("fastsa", PARAMS).polish(graph, peak - 1, sched) is None


def _wasteful(graph):
    """Autodiff's order with every forward node but the loss run a second time before the
    loss: valid, and slower than it need be at its own peak."""
    seq = [op.node for op in hiremate.autodiff_schedule(graph) if isinstance(op, Compute)]
    at = seq.index(graph.loss)
    again = [n for n in seq[:at] if graph.nodes[n].is_fwd]
    return sequence_to_schedule(graph, seq[:at] + again + seq[at:])


def test_polished_dropout_schedules_run_like_eager():
    graph = dropout_graph()
    start = _wasteful(graph)
    before = hiremate.simulate(graph, start)
    assert before.valid, before.error
    for temps in ([1e-3], [1e-2, 1e-1]):  # hot runs move the random nodes' copies around
        solver = make_solver("fastsa", {**PARAMS, "polish_temps": temps})
        out = solver.polish(graph, before.peak, start)
        assert out is not None, "nothing removed from a schedule that computes twice"
        sim = hiremate.simulate(graph, out)
        assert sim.peak <= before.peak and sim.time < before.time
        check_runs(tuple(out), f"polish at {temps}")


def test_default_preset_polishes_and_reports():
    graph = random_graph(11, 30)
    res = solve_graph(graph, 0.95, "hiremate", cache=False, calibrate=0, n_jobs=1,
                      progress=False, flat_max_nodes=0)
    facts = res.report["polish"]
    assert facts and all(f["by"] == "fastsa" for f in facts)
    assert len({f["from"] for f in facts}) == len(facts) <= 3
    for f in facts:
        assert f["polished"] is None or f["polished"] < f["time"]
    best = min(c["time"] for c in res.report["candidates"].values())
    assert res.report["predicted_time"] == best


def test_polish_key_is_checked():
    with pytest.raises(ConfigError, match="polish"):
        load_config("hiremate", polish=["twremat"])
    with pytest.raises(ConfigError):
        load_config("hiremate", polish_from=0)
    with pytest.raises(ConfigError):
        make_solver("fastsa", {"polish_temps": [0.0]})


def test_flat_rewarm_starts_the_flat_hilp_from_the_hierarchys_schedule(monkeypatch):
    """``flat_rewarm``: a flat H-ILP that proved nothing runs again warm-started from the faster
    schedules of the other paths, so it is never slower than the best of them; it does not run
    when its own schedule was proven optimal or nothing beats it."""
    from hiremate.composer.flat import Candidate, Paths, rewarm_flat
    from hiremate.solvers.hilp.flat import phases_to_schedule, recompute_phases

    graph = random_graph(3, 12)
    autodiff = hiremate.autodiff_schedule(graph)
    budget = hiremate.simulate(graph, autodiff).peak
    slow = phases_to_schedule(graph, recompute_phases(graph))
    assert load_config("hiremate").flat_rewarm
    # one branch-and-bound node: only the warm start can make the MILP's schedule this fast
    cfg = load_config("hiremate", solver_params={"hilp": {"work_limit": 1, "max_nodes": 90}})

    def paths(own_optimal: bool, other) -> Paths:
        found = Paths()
        found.candidates.append(Candidate(slow, hiremate.simulate(graph, slow), "hilp",
                                          {"optimal": own_optimal}))
        found.candidates.append(Candidate(other, hiremate.simulate(graph, other), "hilp-top"))
        return found

    import hiremate.composer.flat as composer_flat

    given_hints = []
    real = composer_flat.flat_candidate

    def spy(name, params, graph, budget, hints=()):
        given_hints.append(list(hints))
        return real(name, params, graph, budget, hints=hints)

    monkeypatch.setattr(composer_flat, "flat_candidate", spy)
    found, report = paths(False, autodiff), {}
    rewarm_flat(graph, budget, cfg, found, report)
    assert given_hints == [[autodiff]]  # the faster schedule, and only it
    rewarmed = [c for c in found.candidates if c.source == "hilp:rewarm"]
    assert len(rewarmed) == 1 and "flat_rewarm" in report
    assert rewarmed[0].sim.valid and rewarmed[0].sim.peak <= budget
    assert rewarmed[0].sim.time <= hiremate.simulate(graph, autodiff).time * (1 + 1e-9)
    for found in (paths(True, autodiff), paths(False, slow)):  # proven, or nothing better
        report = {}
        rewarm_flat(graph, budget, cfg, found, report)
        assert not report and all(c.source != "hilp:rewarm" for c in found.candidates)


def test_flat_hilp_waits_for_the_hierarchy_when_no_flat_heuristic_fits(monkeypatch):
    """With ``flat_rewarm``, a flat H-ILP whose only warm start would be full recomputation
    (no other flat solver fits the budget) is deferred: it runs once, after the hierarchy,
    warm-started from the other paths' fastest schedules, never slower than the best of them.
    When a flat heuristic fits, it runs first, cold, as before. (Without ``flat_gap``: with it,
    the flat H-ILP always waits, tests/test_flat_gate.py.)"""
    import hiremate.composer.flat as composer_flat

    graph = random_graph(3, 12)
    calls = []
    real = composer_flat.flat_candidate

    def spy(name, params, graph, budget, hints=()):
        calls.append((name, list(hints)))
        return real(name, params, graph, budget, hints=hints)

    monkeypatch.setattr(composer_flat, "flat_candidate", spy)
    alone = load_config("hiremate", flat=["hilp"], flat_gap=None)  # nothing fits before it
    res = solve_graph(graph, 0.85, alone, cache=False, calibrate=0, n_jobs=1)
    assert [name for name, _ in calls] == ["hilp"]  # once, and warm
    assert calls[0][1] and res.report["hierarchical_path"]
    deferred = res.report["flat_deferred"]
    assert deferred["warm_starts"] == len(calls[0][1])
    others = [c["time"] for src, c in res.report["candidates"].items()
              if src != "hilp" and "+" not in src]
    assert deferred["time"] is not None and deferred["time"] <= min(others) * (1 + 1e-9)

    calls.clear()
    with_twremat = load_config("hiremate", flat=["hilp", "twremat"], flat_gap=None)
    res = solve_graph(graph, 1.0, with_twremat, cache=False, calibrate=0, n_jobs=1)
    assert [name for name, _ in calls][:2] == ["twremat", "hilp"] and calls[1][1] == []
    assert "flat_deferred" not in res.report
