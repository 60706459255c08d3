"""The hierarchical glue and the whole solve on synthetic graphs (fast; the zoo is in
test_hrockmate_zoo.py): blocks, translation back to full-graph schedules, infeasible budgets,
cache, parallel menus, reports. Every schedule is checked with ``hiremate.simulate``."""

from __future__ import annotations

import json
import time
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hiremate
from hiremate.ir.simulator import step_peak
from hiremate.api import solve_graph
from hiremate.config import load_config
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.graph import DataKind
from hiremate.ir.blocks import TopProblem, flatten, make_blocks
from hiremate.composer.menus import store_all_option
from hiremate.composer.step_view import step_view
from hiremate.composer.menu_cache import MenuCache
from hiremate.ir.graph import graph_key
from hiremate.partition import HPartition, SequencePartition
from hiremate.ir.schedule import Compute, recomputations
from hiremate.testing.synthetic import random_graph
from test_partition_sequence import masked_layers, with_constants
from test_registry import residual_chain
from test_memory_pins import fuzz_graph  # module level: its @given must not nest

FAST = {"progress": False, "n_jobs": 1, "cache": False,
        "solver_params": {"hilp": {"time_limit": 2.0}, "rk-rotor": {"slots": 100}}}


def hier(**kw):
    """The default preset forced onto its hierarchical path, with Rockmate's two levels (the
    sequence partitioner's chain of blocks, each flattened) and no polish nor refinement, so
    that the winner is a composer's schedule: what these tests count (tests/test_polish.py,
    tests/test_hilp_window.py and tests/test_sequence_path.py cover the rest)."""
    return load_config("hiremate", flat_max_nodes=0,
                       **{**FAST, "partitioner": "sequence", "partitioner_params": {},
                          "middle": [], "middle_flat": [], "total_options": None,
                          "polish": [], "refine": [], "sequence_top": [], **kw})


def deep(**kw):
    """The default preset as shipped (H-Partition, every level solved), hierarchical path."""
    return load_config("hiremate", flat_max_nodes=0, **{**FAST, **kw})


def check(graph, result):
    sim = hiremate.simulate(graph, result.schedule)
    assert sim.valid, sim.error
    assert sim.peak <= result.report["budget"]
    # the whole step: what the simulator counts, plus what autograd holds (output gradients)
    whole = step_peak(graph, result.schedule, result.report["loss_bytes"])
    assert sim.peak <= whole == result.report["predicted_peak"] <= result.report["budget"]
    assert sim.time == pytest.approx(result.report["predicted_time"])
    return sim


# -- blocks ---------------------------------------------------------------------------------------
def test_identical_blocks_share_a_key_and_extract_valid_graphs():
    g = residual_chain(5)
    blocks, tail = make_blocks(g, SequencePartition().partition(g))
    # the model input brings no dependency, so the first residual block splits into three
    # single nodes; the last block differs (its output is the model's)
    assert len(blocks) == 7 and len(tail) <= 1
    assert len({b.key for b in blocks[3:6]}) == 1
    assert len({b.key for b in blocks}) == 5
    covered = sorted([n for b in blocks for n in b.fwd + b.bwd] + tail)
    assert covered == sorted(n.id for n in g.nodes if n.id != g.loss)
    for b in blocks:
        sub = b.graph
        assert sub.nodes[sub.loss].is_loss
        # every gradient that leaves the block is required at the end of its sub-schedule
        for d in sub.data:
            if d.kind is DataKind.INPUT_GRAD:
                full = g.data[b.data_map[d.id]]
                assert full.kind in (DataKind.GRAD, DataKind.INPUT_GRAD)
        opt = store_all_option(sub)
        assert opt.fwd and opt.bwd


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(3, 40), part=st.sampled_from(["seq", "hp"]))
def test_store_all_blocks_flatten_to_a_valid_schedule_without_recomputation(seed, n, part):
    """Property: blocks' store-all options run in chain order (forwards, loss, backwards in
    reverse), with the tail nodes where ready, give a valid schedule of the full graph that runs
    every node once: the translation loses nothing."""
    g = random_graph(seed, n)
    p = SequencePartition() if part == "seq" else HPartition(max_top=4, max_sub=4)
    blocks, tail = make_blocks(g, p.partition(g))
    for b in blocks:
        b.options = [store_all_option(b.graph)]
    pieces = [b.sequence(b.options[0].fwd) for b in blocks] + [[g.loss]]
    pieces += [b.sequence(b.options[0].bwd) for b in reversed(blocks)]
    sched = flatten(TopProblem(g, blocks, tail), pieces)
    sim = hiremate.simulate(g, sched)
    assert sim.valid, sim.error
    assert recomputations(sched) == 0
    assert sorted(s.node for s in sched if isinstance(s, Compute)) == list(range(len(g.nodes)))
    assert sim.time == pytest.approx(g.total_time())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(2, 40), n_const=st.integers(0, 4),
       p_soft=st.sampled_from([0.0, 2.0]), fuzz=st.booleans())
def test_rk_rotor_chain_model_bounds_the_simulated_peak(seed, n, n_const, p_soft, fuzz):
    """Property: with values read outside the chain (hoisted constants read by distant blocks,
    partial gradients summed by tail nodes, model outputs of earlier blocks and their
    gradients), rk-Rotor's chain model still counts what the translated schedule holds: the
    DP's peak bounds the simulated peak, from the least budget to the store-all one. Also on
    hostile fuzz graphs with random ops, whose first runs the translation must keep in order."""
    from hiremate.solvers.chain.rk_rotor_top import RkRotorTop
    from hiremate.solvers.chain.rk_rotor import BlockOp, block_min_budget, simulate_blocks, solve_blocks

    g = fuzz_graph(seed, min(n, 12)) if fuzz else with_constants(seed, n, n_const, 1.0, p_soft)[0]
    blocks, tail = make_blocks(g, SequencePartition().partition(g))
    for b in blocks:
        b.options = [store_all_option(b.graph)]
    problem = TopProblem(g, blocks, tail)
    top = RkRotorTop()
    bc = top.block_chain(problem)
    L = bc.L
    store = ([BlockOp("Fn", i, 0) for i in range(1, L + 1)] + [BlockOp("Loss", L + 1)]
             + [BlockOp("B", i, 0) for i in range(L, 0, -1)])
    low, high = block_min_budget(bc), simulate_blocks(bc, store).peak
    for f in (0.0, 0.3, 0.6, 1.0):
        sol = solve_blocks(bc, (low + f * (high - low)) * (1 + 1e-9), 300)
        sim = hiremate.simulate(g, top.translate(problem, sol.ops))
        assert sim.valid, sim.error
        assert sim.peak <= sol.peak + 1e-6, (f, sim.peak, sol.peak)


def test_hoisted_mask_solve_is_valid_and_per_layer():
    """A mask read by every layer is hoisted: one block per layer, and both composers'
    schedules are valid within the budget, the report's prediction being the simulator's."""
    g = masked_layers(6, 40)
    for top in ("rk-rotor", "hilp-top"):
        res = solve_graph(g, 0.5, hier(top=[top]))
        check(g, res)
        assert res.report["blocks"] == 2 + 6 and res.report["solver"] == top


# -- the solve ------------------------------------------------------------------------------------
@pytest.mark.parametrize("frac", [1.0, 0.7, 0.5])
def test_hierarchical_path_meets_budgets(frac):
    g = residual_chain(8)
    res = solve_graph(g, frac, hier())
    sim = check(g, res)
    rep = res.report
    assert rep["solver"] in ("rk-rotor", "hilp-top") and rep["hierarchical_path"]
    assert not rep["flat_path"]
    assert rep["blocks"] == 10 and rep["unique_blocks"] == 5
    assert len(rep["block_solvers"]) == 10
    if frac == 1.0:  # no need to recompute anything
        assert sim.time == pytest.approx(g.total_time())
    else:
        assert sim.time >= g.total_time()


def test_flat_path_on_a_small_graph_and_preset_paths():
    g = residual_chain(3)
    res = solve_graph(g, 0.6, "hiremate", **FAST)
    check(g, res)
    # the flat path runs; the hierarchy too unless the flat H-ILP proved its schedule optimal
    assert res.report["flat_path"]
    flat_won = res.report["solver"] in ("hilp", "twremat")
    assert flat_won or res.report["hierarchical_path"]
    for preset, path in (("twremat", "flat"), ("rockmate", "hier"), ("rotor", "hier"),
                         ("checkmate", "flat")):
        r = solve_graph(g, 0.8, preset, **FAST)
        check(g, r)
        assert r.report["flat_path" if path == "flat" else "hierarchical_path"]
    r = solve_graph(g, 1.0, "noremat", **FAST)
    # eager's schedule, on the step's view: the output gradients autograd holds are not freed
    assert r.schedule == hiremate.autodiff_schedule(step_view(g, 0, rng_states=False).graph)


def test_report_fields():
    g = residual_chain(6)
    rep = solve_graph(g, 0.6, hier()).report
    for key in ("predicted_peak", "predicted_time", "autodiff_peak", "autodiff_time",
                "solve_time", "hierarchy", "block_solvers", "blocks", "unique_blocks",
                "largest_block", "relative_peak", "relative_time", "solver", "budget"):
        assert key in rep, key
    assert rep["hierarchy"]["levels"] == 2
    assert rep["relative_peak"] <= 0.6 + 1e-9


@pytest.mark.parametrize("config", [hier, deep])
def test_infeasible_budget_reports_a_budget_that_works(config):
    g = residual_chain(6)
    cfg = config()
    with pytest.raises(InfeasibleBudgetError) as info:
        solve_graph(g, 0.05, cfg)
    low = info.value.min_budget
    assert low is not None and str(low) in str(info.value)
    assert low > 0.05 * hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak
    res = solve_graph(g, low, cfg)
    check(g, res)
    if config is hier:  # the chain DP's lowest budget is exact; the MILPs' is one that works
        with pytest.raises(InfeasibleBudgetError):
            solve_graph(g, low - 1, cfg)


def test_infeasible_budget_flat_path():
    g = residual_chain(3)
    with pytest.raises(InfeasibleBudgetError) as info:
        solve_graph(g, 1, "twremat", **FAST)
    res = solve_graph(g, info.value.min_budget, "twremat", **FAST)
    check(g, res)


def test_a_cache_hit_reports_the_current_costs(tmp_path):
    """A cache entry is found by structure (times left out of the key), so a second capture of
    the same model hits it with other measured times: the report's figures are the ones this
    graph gives the cached schedule, not the ones stored with it."""
    import dataclasses

    from hiremate.ir.graph import Graph
    from hiremate.ir.simulator import autodiff_schedule, simulate

    g = residual_chain(8)
    slower = Graph([dataclasses.replace(n, time=n.time * 1000) for n in g.nodes], g.data,
                   g.outputs, g.meta)
    cfg = hier(cache=True, cache_dir=str(tmp_path))
    first = solve_graph(g, 0.6, cfg)
    again = solve_graph(slower, 0.6, cfg)
    assert again.report["cached"] and again.schedule == first.schedule
    assert again.report["predicted_time"] == pytest.approx(simulate(slower, again.schedule).time)
    assert again.report["autodiff_time"] == pytest.approx(
        simulate(slower, autodiff_schedule(slower)).time)
    assert again.report["predicted_time"] > 100 * first.report["predicted_time"]


def test_cache_hit_is_fast_and_identical(tmp_path):
    g = residual_chain(8)
    cfg = hier(cache=True, cache_dir=str(tmp_path))
    first = solve_graph(g, 0.6, cfg)
    second = solve_graph(g, 0.6, cfg)
    assert second.schedule == first.schedule
    assert second.report["cached"] and not first.report["cached"]
    assert second.report["solve_time"] * 10 <= first.report["solve_time"]
    # another budget re-uses the block menus (only the top level runs)
    third = solve_graph(g, 0.7, cfg)
    check(g, third)
    assert third.report["cache_hits"] >= third.report["unique_blocks"]
    assert all(s["cached"] for m in third.report["block_menus"] for s in m["solvers"].values())


def test_corrupted_cache_entry_is_ignored_with_warning(tmp_path):
    g = residual_chain(4)
    cfg = hier(cache=True, cache_dir=str(tmp_path))
    first = solve_graph(g, 0.6, cfg)
    files = list(tmp_path.rglob("*.json"))
    assert files
    for f in files:
        f.write_bytes(b"not json")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        again = solve_graph(g, 0.6, cfg)
    assert again.schedule == first.schedule and not again.report["cached"]
    # and the entries were written again
    assert all(json.loads(f.read_bytes()) is not None for f in tmp_path.rglob("*.json"))


def test_cache_key_depends_on_costs_and_solver_config(tmp_path):
    g = residual_chain(2)
    cache = MenuCache(tmp_path)
    cfg = hier()
    k1 = {"graph": graph_key(g), **cfg.solver_key("hilp")}
    k2 = {"graph": graph_key(g), **hier(solver_params={"hilp": {"time_limit": 3.0}})
          .solver_key("hilp")}
    g2 = residual_chain(2, size=101)
    k3 = {"graph": graph_key(g2), **cfg.solver_key("hilp")}
    assert len({cache.path(k) for k in (k1, k2, k3)}) == 3
    # measured times are noise around what the op signature determines: not part of the key
    from hiremate.ir.graph import Graph
    from dataclasses import replace
    slower = Graph([replace(n, time=n.time * 1.1) for n in g.nodes], g.data, g.outputs)
    assert graph_key(slower) == graph_key(g) and graph_key(slower, times=True) != graph_key(g, times=True)
    assert MenuCache(tmp_path, enabled=False).get(k1) is None


@pytest.mark.parametrize("backend", ["loky", "threading"])
def test_parallel_menus_match_sequential(backend):
    g = residual_chain(6)
    seq = solve_graph(g, 0.6, hier())
    par = solve_graph(g, 0.6, hier(n_jobs=2, backend=backend))
    assert par.schedule == seq.schedule


def test_dask_backend():
    distributed = pytest.importorskip("dask.distributed", reason="dask.distributed not installed")
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2):
        g = residual_chain(6)
        res = solve_graph(g, 0.6, hier(n_jobs=2, backend="dask"))
        check(g, res)
