"""The window search (:mod:`hiremate.solvers.hilp.window`): the flat H-ILP re-solved over a
sliding window of phases around a schedule, and its place in the default preset (``refine``).

What it returns must be valid, within the budget, strictly faster than where it started and the
same in two runs (tests/test_polish.py's property test, which takes every polisher); it must run
in the executor like eager; and on a chain where the default's
schedule stops short of what the whole-graph MILP finds it must close that gap."""

from __future__ import annotations

import pytest
import torch

import hiremate
from hiremate.api import solve_graph
from hiremate.config import load_config
from hiremate.errors import ConfigError, InfeasibleBudgetError
from hiremate.ir.tracker import memory_floor
from hiremate.registry import make_solver
from hiremate.runtime.executor import RematModule
from hiremate.solvers.hilp.flat import phases_to_schedule, recompute_phases
from test_memory_pins import fuzz_graph
from test_polish import _start  # TW-Remat's schedule, or None
from test_presets_compare import FAST, _chain, _graph
from test_solvers_random_order import check_runs, graph as dropout_graph


def _lowest(graph) -> int:
    """The peak of full recomputation, a budget the flat H-ILP's starts always meet."""
    return hiremate.simulate(graph, phases_to_schedule(graph, recompute_phases(graph))).peak


@pytest.fixture(scope="module")
def chain16():
    """A chain of 16 Linear layers at 0.4 of its autodiff peak (FLOP costs): the default
    preset without the window search stops 1.8 % above what the whole-graph H-ILP finds."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _chain(16)
    graph = _graph(model)
    return model, graph, solve_graph(graph, 0.4, "hiremate", refine=[], **FAST)


def test_the_default_refines_its_best_schedule_window_by_window(chain16):
    model, graph, plain = chain16
    default = solve_graph(graph, 0.4, "hiremate", **FAST)
    assert default.report["solver"] == plain.report["solver"] + "+hilp-window"
    assert default.sim.time < plain.sim.time / 1.015
    assert default.report["refine"][0]["refined"] == pytest.approx(default.sim.time)
    assert default.sim.peak <= default.report["budget"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        x = torch.randn(16, 32)
    ref, out = model(x), RematModule(model, graph, default.schedule)(x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    for a, b in zip(grads, torch.autograd.grad(ref.square().sum(), list(model.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_window_search_finds_what_the_skipped_whole_graph_milp_finds(chain16):
    """The gate skips the flat H-ILP on this chain (2.7 % above the moment bound, within its
    threshold); run anyway (``flat_gap=0``), it finds what the windows find."""
    _, graph, plain = chain16
    ungated = solve_graph(graph, 0.4, "hiremate", refine=[], flat_gap=0.0, **FAST)
    assert ungated.sim.time < plain.sim.time / 1.015
    out = make_solver("hilp-window").polish(graph, plain.report["budget"], plain.schedule)
    assert out is not None
    assert hiremate.simulate(graph, out).time <= ungated.sim.time * (1 + 1e-9)


def test_window_search_schedules_run_like_eager():
    """On a graph with two dropouts, from TW-Remat's schedule and as a flat solver: the
    executor gives eager's outputs, gradients and generator state."""
    graph = dropout_graph()
    ad, low = hiremate.simulate(graph, hiremate.autodiff_schedule(graph)), _lowest(graph)
    for frac in (0.2, 0.6):
        budget = low + int(frac * (ad.peak - low))
        start = _start(graph, budget)  # none at the tighter budget
        out = start and make_solver("hilp-window", {"window": 4, "stride": 2}).polish(
            graph, budget, start)
        for schedule in filter(None, (out, make_solver("hilp-window").schedule(graph, budget))):
            assert hiremate.simulate(graph, schedule).peak <= budget
            check_runs(schedule, f"hilp-window at {frac}")


def test_window_search_as_a_flat_solver_meets_the_budget_or_says_why():
    graph = fuzz_graph(11, 24, p_random=0.0)
    ad, low = hiremate.simulate(graph, hiremate.autodiff_schedule(graph)), _lowest(graph)
    solver = make_solver("hilp-window")
    budget = low + (ad.peak - low) // 3
    sim = hiremate.simulate(graph, solver.schedule(graph, budget))
    assert sim.valid and sim.peak <= budget
    start = _start(graph, budget)
    if start is not None:
        assert sim.time <= hiremate.simulate(graph, start).time
    for below in (memory_floor(graph) - 1, low - 1):
        with pytest.raises(InfeasibleBudgetError, match="raise the budget to") as info:
            solver.schedule(graph, below)
        assert info.value.min_budget == low


def test_window_search_leaves_large_graphs_and_block_schedules_alone():
    graph = fuzz_graph(3, 20, p_random=0.0)
    sched = hiremate.autodiff_schedule(graph)
    peak = hiremate.simulate(graph, sched).peak
    assert make_solver("hilp-window", {"max_nodes": 5}).polish(graph, peak, sched) is None
    assert make_solver("hilp-window").polish(graph, peak - 1, sched) is None  # over the budget


@pytest.mark.parametrize("params, match", [
    ({"window": 0}, "window must be a positive integer"),
    ({"window": 4, "stride": 6}, "stride"),
    ({"time_limit": 0}, "time_limit"),
    ({"round_gain": 1.0}, "round_gain"),
])
def test_window_search_settings_are_checked(params, match):
    with pytest.raises(ConfigError, match=match):
        make_solver("hilp-window", params)


def test_refine_takes_only_solvers_that_polish():
    assert load_config("hiremate").refine == ["hilp-window"]
    with pytest.raises(ConfigError, match="cannot polish"):
        load_config("hiremate", refine=["twremat"])
    with pytest.raises(ValueError, match="unknown solver"):
        load_config("hiremate", refine=["no-such-solver"])


def test_the_bench_prints_each_run_beside_the_default(capsys):
    """``bench/window_search.py`` (docs/benchmarks.md, "Window search"): one row per chain and
    budget, every run's relative time, and ``-`` for a budget nothing meets."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import window_search

    window_search.main(["--layers", "4", "--budgets", "0.7", "0.05", "--ungated"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| 4 |")]
    assert len(rows) == 2
    plain, default, ungated = (float(cell.split()[0]) for cell in rows[0][3:6])
    assert 1 <= default <= plain and ungated >= 1
    assert rows[1][3:6] == ["-", "-", "-"]
