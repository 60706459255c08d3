"""``flat_gap``: the whole-graph H-ILP waits for the other paths and their polish, and runs only
where their best schedule is more than ``flat_gap`` above the moment bound
(:func:`hiremate.composer.flat.gated_flat_hilp`). Where it is skipped, the schedule returned is
within that fraction of the bound, so no flat MILP could have been faster by more."""

from __future__ import annotations

import pytest

import hiremate
import hiremate.composer.flat as composer_flat
from hiremate.api import solve_graph
from hiremate.config import load_config
from hiremate.errors import ConfigError
from hiremate.solvers.hilp.moment_bound import moment_time_bound
from hiremate.testing.synthetic import random_graph

FAST = {"cache": False, "calibrate": 0, "n_jobs": 1, "progress": False}


def _spied(monkeypatch) -> list[tuple[str, int]]:
    """Records each flat solver run (name, warm starts given)."""
    calls: list[tuple[str, int]] = []
    real = composer_flat.flat_candidate

    def spy(name, params, graph, budget, hints=()):
        calls.append((name, len(hints)))
        return real(name, params, graph, budget, hints=hints)

    monkeypatch.setattr(composer_flat, "flat_candidate", spy)
    return calls


def test_the_default_preset_gates_the_flat_hilp():
    assert load_config("hiremate").flat_gap == 0.05
    assert load_config("hilp").flat_gap is None  # a preset of the flat H-ILP alone runs it


def test_a_small_gap_skips_the_flat_hilp(monkeypatch):
    graph = random_graph(3, 12)
    calls = _spied(monkeypatch)
    # the others reach 1.8 % of the bound; flat_gap alone, not scaled down on this small MILP
    res = solve_graph(graph, 0.9, "hiremate", flat_gap_columns=None, **FAST)
    assert "hilp" not in [name for name, _ in calls]
    gate = res.report["flat_gate"]
    assert gate["ran"] is False and gate["gap"] <= gate["threshold"] == 0.05
    assert res.report["hierarchical_path"] and res.report["polish"]  # the trial polish is final
    sim = hiremate.simulate(graph, res.schedule)
    assert sim.valid and sim.peak <= res.report["budget"]


def test_on_a_small_milp_the_threshold_shrinks_with_its_columns(monkeypatch):
    """The default's ``flat_gap_columns``: the same graph and budget as above, whose MILP has a
    few thousand columns, so a gap of 1.8 % is above its threshold and the MILP runs."""
    from hiremate.solvers.hilp.flat import HilpSolver

    graph = random_graph(3, 12)
    cfg = load_config("hiremate")
    res = solve_graph(graph, 0.9, "hiremate", **FAST)
    columns = HilpSolver().build(graph, res.report["budget"]).stats["cols"]
    assert columns < cfg.flat_gap_columns
    gate = res.report["flat_gate"]
    assert gate["threshold"] == pytest.approx(cfg.flat_gap * columns / cfg.flat_gap_columns,
                                              abs=1e-6)
    assert gate["gap"] > gate["threshold"] and gate["ran"] is True
    assert "hilp" in res.report["candidates"]
    # at or above that size, the threshold is flat_gap itself
    big = cfg.replace(flat_gap_columns=columns)
    assert composer_flat.gate_threshold(graph, res.report["budget"], big) == cfg.flat_gap
    sim = hiremate.simulate(graph, res.schedule)
    assert sim.valid and sim.peak <= res.report["budget"]


def test_when_the_milp_runs_the_trial_polish_is_kept(monkeypatch):
    """The gate's trial polish starts from the fastest sources before the MILP; the final one
    starts from them with the MILP's schedules among them, which can push a source out (one
    start here). The trial's schedules stay candidates: running the MILP never loses them."""
    import hiremate.composer.solve as composer_solve

    graph = random_graph(2, 10)
    polishes: list[list] = []
    real = composer_solve._polish

    def spy(*args, **kwargs):
        polishes.append(real(*args, **kwargs))
        return polishes[-1]

    monkeypatch.setattr(composer_solve, "_polish", spy)
    res = solve_graph(graph, 0.9, "hiremate", flat_gap=0.0, polish_from=1, **FAST)
    assert res.report["flat_gate"]["ran"] is True and len(polishes) == 2
    trial, final = polishes
    # the MILP's schedule displaced the trial's start, and the trial's polish was the fastest
    assert trial and not {c.source for c in trial} & {c.source for c in final}
    assert res.report["solver"] in {c.source for c in trial}
    for c in trial:
        assert res.report["candidates"][c.source]["time"] <= c.sim.time
    assert res.sim.time <= min(c.sim.time for c in trial + final)


def test_a_hilp_without_a_milp_keeps_the_plain_threshold(monkeypatch):
    """A user's solver registered as ``hilp`` has no MILP whose columns could be counted."""
    import hiremate.registry as registry

    class NoMilp:
        def __init__(self, **params):  # takes the preset's hilp parameters, and ignores them
            self.params = params

        def applicable(self, graph):
            return True

        def schedule(self, graph, budget):
            return hiremate.autodiff_schedule(graph)

    monkeypatch.setitem(registry._SOLVERS, "hilp", NoMilp)
    cfg = load_config("hiremate")
    assert composer_flat.gate_threshold(random_graph(3, 12), 10**6, cfg) == cfg.flat_gap


def test_a_gap_above_the_threshold_runs_it_after_the_hierarchy(monkeypatch):
    graph = random_graph(3, 12)
    order: list[str] = []
    calls = _spied(monkeypatch)
    import hiremate.composer.solve as composer_solve

    real_hier = composer_solve._hierarchical_path

    def hier(*args, **kwargs):
        order.append("hierarchy")
        return real_hier(*args, **kwargs)

    monkeypatch.setattr(composer_solve, "_hierarchical_path", hier)
    real_flat = composer_flat.flat_candidate

    def flat(name, *args, **kwargs):
        order.append(name)
        return real_flat(name, *args, **kwargs)

    monkeypatch.setattr(composer_flat, "flat_candidate", flat)
    # FastSA fits; the others leave 4.5 % to the bound, above a threshold of 0
    res = solve_graph(graph, 0.85, "hiremate", flat_gap=0.0, **FAST)
    gate = res.report["flat_gate"]
    assert gate["gap"] > 0 and gate["ran"] is True
    assert order.index("hilp") > order.index("hierarchy")
    assert calls[:3] == [("twremat", 0), ("fastsa", 0), ("hilp", 0)]  # cold, as without the gate
    assert "hilp" in res.report["candidates"]


def test_where_no_flat_heuristic_fits_it_runs_warm_from_the_hierarchy(monkeypatch):
    graph = random_graph(3, 12)
    calls = _spied(monkeypatch)
    res = solve_graph(graph, 0.8, "hiremate", **FAST)
    assert res.report["flat_gate"]["ran"] is True
    assert [name for name, _ in calls] == ["twremat", "fastsa", "hilp"] and calls[-1][1] > 0
    assert res.report["flat_deferred"]["warm_starts"] == calls[-1][1]


def test_where_nothing_else_fits_it_runs(monkeypatch):
    """No flat heuristic fits and the hierarchy finds nothing (made to, here: the graph where
    that happens on its own, below, takes its MILP 40 s): the gap is unknown, and the flat
    H-ILP runs, cold."""
    import hiremate.composer.solve as composer_solve

    graph = random_graph(3, 12)
    calls = _spied(monkeypatch)

    def nothing(*args, after_menus=None, **kwargs):
        if after_menus is not None:
            after_menus()
    monkeypatch.setattr(composer_solve, "_hierarchical_path", nothing)
    res = solve_graph(graph, 0.8, "hiremate", flat_gap_columns=None, **FAST)
    assert res.report["flat_gate"] == {"gap": None, "threshold": 0.05, "ran": True,
                                      "early": False}
    assert calls == [("twremat", 0), ("fastsa", 0), ("hilp", 0)]
    assert res.report["solver"].startswith("hilp")


@pytest.mark.slow
def test_where_nothing_else_fits_on_its_own_it_runs(monkeypatch):
    graph = random_graph(11, 20)
    calls = _spied(monkeypatch)
    # the plain threshold: the rule under test does not depend on how the gate is scaled
    res = solve_graph(graph, 0.8, "hiremate", flat_gap_columns=None, **FAST)
    assert res.report["flat_gate"] == {"gap": None, "threshold": 0.05, "ran": True,
                                      "early": False}
    assert [name for name, _ in calls][-1] == "hilp" and res.report["solver"].startswith("hilp")


# the seed-7 graphs' MILPs take a minute or two each, the others 10-17 s: one case in the
# default run, the rest for the full run
SLOW = pytest.mark.slow


@pytest.mark.parametrize("seed,n,fraction", [
    pytest.param(3, 12, 0.8, marks=SLOW), (3, 12, 0.9), pytest.param(7, 14, 0.8, marks=SLOW),
    pytest.param(7, 14, 0.9, marks=SLOW), pytest.param(5, 16, 0.9, marks=SLOW)])
def test_a_skipped_flat_hilp_costs_at_most_the_gap(seed, n, fraction):
    """Gated (the default's 5 %) against the flat H-ILP always run first (``flat_gap`` null): the
    gated schedule is at most 5 % slower, and when the MILP was skipped it is within 5 % of the
    moment bound, below which no schedule of the MILP's kind lies."""
    graph = random_graph(seed, n)
    gated = solve_graph(graph, fraction, "hiremate", **FAST)
    always = solve_graph(graph, fraction, "hiremate", flat_gap=None, **FAST)
    assert "flat_gate" not in always.report
    assert gated.sim.time <= always.sim.time * 1.05 * (1 + 1e-9)
    gate = gated.report["flat_gate"]
    if not gate["ran"]:
        bound = moment_time_bound(graph, gated.report["budget"])
        assert gated.sim.time <= bound * (1 + gate["threshold"]) * (1 + 1e-9)


@pytest.mark.parametrize("bad", [-0.1, True, "0.05", [0.05]])
def test_flat_gap_is_checked(bad):
    with pytest.raises(ConfigError, match="flat_gap"):
        load_config("hiremate", flat_gap=bad)


@pytest.mark.parametrize("bad", [0, -5, True, 1.5e4, "16000"])
def test_flat_gap_columns_is_checked(bad):
    with pytest.raises(ConfigError, match="flat_gap_columns must be a positive number"):
        load_config("hiremate", flat_gap_columns=bad)
    assert isinstance(ConfigError("x"), ValueError)


def test_where_the_flat_hilp_runs_no_start_is_polished_twice(monkeypatch):
    """The gate's trial polish and the final polish share their starts (the polish is
    deterministic): each (polisher, start schedule) is annealed once."""
    from hiremate.solvers.fastsa.solver import FastSA

    starts: list[tuple] = []
    real = FastSA.polish

    def counted(self, graph, budget, schedule):
        starts.append(tuple(schedule))
        return real(self, graph, budget, schedule)

    monkeypatch.setattr(FastSA, "polish", counted)
    res = solve_graph(random_graph(3, 12), 0.85, "hiremate", flat_gap=0.0, **FAST)
    assert res.report["flat_gate"]["ran"] is True and "hilp" in res.report["candidates"]
    assert starts and len(starts) == len(set(starts))
    # the final polish started from the MILP's schedule too, which the trial did not have
    assert any(f["from"] == "hilp" for f in res.report["polish"])


def test_the_large_graph_work_limit_holds_unless_nothing_else_fits(monkeypatch):
    """The deferred whole-graph H-ILP keeps ``large_above``'s work limit where other schedules
    exist (their polish recovers what its branch-and-bound nodes add), and runs with its whole
    ``work_limit`` where it alone can fit the budget."""
    from hiremate.composer.flat import Paths, deferred_flat_hilp
    from hiremate.ir.blocks import Candidate
    from hiremate.ir.simulator import autodiff_schedule, simulate

    seen: list[dict] = []

    def spy(name, params, graph, budget, hints=()):
        seen.append(params)
        return None, None, "spied"

    monkeypatch.setattr(composer_flat, "flat_candidate", spy)
    graph = random_graph(3, 12)
    cfg = load_config("hiremate")
    assert cfg.solver_params["hilp"]["large_work_limit"] == 1
    sched = autodiff_schedule(graph)
    other = Candidate(sched, simulate(graph, sched), "hilp-top", {})
    for found, limited in ((Paths(), False), (Paths(candidates=[other]), True)):
        deferred_flat_hilp(graph, 10**9, cfg, found, {})
        assert ("large_above" in seen[-1]) is limited
        assert seen[-1]["work_limit"] == cfg.solver_params["hilp"]["work_limit"]
