"""HRockmate end to end on zoo models: feasibility at half the autodiff peak, gradients equal to
eager PyTorch's (float64), measured peak within the budget, save/load, cache hits.

The default run covers ``mlp`` (seconds); every zoo model and the scale cases are ``slow``."""

from __future__ import annotations

import time

import pytest
import torch

import hiremate
from hiremate import zoo
from hiremate.api import HRockmate
from hiremate.ir.graph import DataKind

FAST = {"progress": False, "n_jobs": 1}


def grads(fn, model, sample):
    args, kwargs = zoo.split_sample(sample)
    for p in model.parameters():
        p.grad = None
    zoo.output_loss(fn(*args, **kwargs)).backward()
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return out


def check_model(name: str, remat: HRockmate, model, sample, budget_frac: float = 0.5):
    rep = remat.report()
    sim = hiremate.simulate(remat.graph, remat.schedule)
    assert sim.valid and sim.peak <= rep["budget"]
    # a fraction is of the whole step's autodiff peak, the loss's memory included
    from hiremate.ir.simulator import step_peak

    step = step_peak(remat.graph, hiremate.autodiff_schedule(remat.graph), rep["loss_bytes"])
    assert rep["budget"] <= budget_frac * step + 1
    eager = grads(model, model, sample)
    mine = grads(remat, model, sample)
    assert eager.keys() == mine.keys()
    for k in eager:
        torch.testing.assert_close(mine[k], eager[k], rtol=0, atol=1e-12, msg=f"{name}: {k}")
    args, kwargs = zoo.split_sample(sample)
    measured = hiremate.measure(remat, *args, **kwargs)
    assert measured.peak <= rep["budget"] * 1.05, (name, measured.peak, rep["budget"])
    return measured


def test_mlp_end_to_end_save_load_and_cache(tmp_path):
    model, sample = zoo.get("mlp", dtype=torch.float64)
    cfg = {"cache_dir": str(tmp_path / "cache"), **FAST}
    first = HRockmate(model, sample, 0.5, **cfg)
    check_model("mlp", first, model, sample)
    rep = first.report()
    assert rep["relative_peak"] <= 0.5 and rep["solver"]
    # a second run on the same model and configuration hits the cache
    second = HRockmate(model, sample, 0.5, **cfg)
    assert second.schedule == first.schedule
    assert second.report()["cached"]
    assert second.report()["solve_time"] * 10 <= rep["solve_time"]
    # save / load skips capture and solving
    path = tmp_path / "mlp.hiremate.json"
    first.save(path)
    t0 = time.perf_counter()
    loaded = HRockmate.load(model, path)
    assert time.perf_counter() - t0 < 5
    assert loaded.schedule == first.schedule and loaded.graph == first.graph
    assert loaded.report()["solve_time"] == 0.0
    check_model("mlp", loaded, model, sample)


def test_bad_budget_and_load_errors(tmp_path):
    model, sample = zoo.get("mlp")
    with pytest.raises(hiremate.ConfigError):
        HRockmate(model, sample, -1, **FAST)
    with pytest.raises(hiremate.ConfigError):
        HRockmate(model, sample, float("nan"), **FAST)
    with pytest.raises(hiremate.ConfigError, match="cannot read"):
        HRockmate.load(model, tmp_path / "missing.json")


def test_infeasible_budget_on_a_model(tmp_path):
    model, sample = zoo.get("mlp", dtype=torch.float64)
    cfg = {"cache": False, **FAST, "config": "twremat"}
    with pytest.raises(hiremate.InfeasibleBudgetError) as info:
        HRockmate(model, sample, 64, **cfg)
    low = info.value.min_budget
    assert low and low > 64
    remat = HRockmate(model, sample, low, **cfg)
    assert hiremate.simulate(remat.graph, remat.schedule).peak <= low


#: Rockmate's two levels: the sequence partitioner's chain of blocks, each flattened
SEQUENCE = {"partitioner": "sequence", "partitioner_params": {}, "middle": [], "middle_flat": [],
            "total_options": None, "polish": [], "sequence_top": []}


def test_gpt2_hoisted_mask_blocks_solve_and_gradients():
    """GPT-2 (4 layers, float64) on the hierarchical path: its causal mask and position ids are
    hoisted, so the chain is cut at every residual add (13 blocks). rk-Rotor's chain model
    counts the hoisted values (its peak bounds the simulated one), its schedule is valid within
    half the autodiff peak, the report's prediction is the simulator's, and the executor's
    gradients equal eager PyTorch's. (TW-Remat menus and rk-Rotor keep this test fast;
    ``test_hoisted_mask_solve_is_valid_and_per_layer`` covers hilp-top with hoisted values, the
    slow zoo test the default preset.)"""
    from hiremate.solvers.chain.rk_rotor_top import RkRotorTop
    from hiremate.ir.blocks import TopProblem, make_blocks
    from hiremate.composer.menus import store_all_option
    from hiremate.partition import SequencePartition
    from hiremate.solvers.chain.rk_rotor import BlockOp, block_min_budget, simulate_blocks, solve_blocks
    from hiremate.ir.simulator import step_peak
    from hiremate.runtime.measurement import loss_of

    model, sample = zoo.get("gpt2", layers=4, width=32, dtype=torch.float64)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    cfg = {"cache": False, "calibrate": 0, "flat_max_nodes": 0, "sample": sample, **FAST,
           "bottom": ["twremat"], "top": ["rk-rotor"], **SEQUENCE}
    # check_model measures with the default loss (the outputs' sum: it keeps nothing)
    remat = HRockmate.from_graph(model, graph, 0.5, loss_fn=loss_of, capture_loss=False, **cfg)
    rep = remat.report()
    assert rep["blocks"] == 13 and rep["largest_block"] <= 30 and rep["solver"] == "rk-rotor"
    assert rep["predicted_peak"] == step_peak(graph, remat.schedule, rep["loss_bytes"])
    check_model("gpt2", remat, model, sample)
    # the chain model against the simulator, from the least budget to the store-all one
    blocks, tail = make_blocks(graph, SequencePartition().partition(graph))
    for b in blocks:
        b.options = [store_all_option(b.graph)]
    problem = TopProblem(graph, blocks, tail)
    composer = RkRotorTop()
    bc = composer.block_chain(problem)
    assert composer.held >= 8 * 8 * 8  # the float64 mask (seq 8 x seq 8) at least
    L = bc.L
    store = ([BlockOp("Fn", i, 0) for i in range(1, L + 1)] + [BlockOp("Loss", L + 1)]
             + [BlockOp("B", i, 0) for i in range(L, 0, -1)])
    low, high = block_min_budget(bc), simulate_blocks(bc, store).peak
    for f in (0.0, 0.5, 1.0):
        sol = solve_blocks(bc, (low + f * (high - low)) * (1 + 1e-9), 100)
        sim = hiremate.simulate(graph, composer.translate(problem, sol.ops))
        assert sim.valid and sim.peak <= sol.peak, (f, sim.peak, sol.peak)


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_at_half_the_autodiff_peak(name, tmp_path):
    """Feasible at 50% (required of every zoo model). A zoo model whose single
    node needs more than half the autodiff peak (``memory_floor``) fails here: that is a zoo
    defect (see the unet's 1x1 merge), not a case to skip."""
    from hiremate.ir.tracker import memory_floor

    model, sample = zoo.get(name, dtype=torch.float64)
    graph = hiremate.build_graph(model, sample)
    half = 0.5 * hiremate.simulate(graph, hiremate.autodiff_schedule(graph)).peak
    cfg = {"cache_dir": str(tmp_path), "progress": False, "sample": sample}
    assert memory_floor(graph) <= half, f"{name}: one node needs more than 50% of the peak"
    remat = HRockmate.from_graph(model, graph, 0.5, **cfg)
    check_model(name, remat, model, sample)


@pytest.mark.slow
def test_scale_gpt2_96_layers():
    model, sample = zoo.get("gpt2", layers=96, width=64)
    t0 = time.perf_counter()
    remat = HRockmate(model, sample, 0.5, cache=False, progress=False)
    elapsed = time.perf_counter() - t0
    rep = remat.report()
    print({k: rep.get(k) for k in ("compute_nodes", "blocks", "unique_blocks", "solve_time",
                                   "relative_peak", "relative_time", "solver")}, elapsed)
    assert elapsed <= 600
    assert hiremate.simulate(remat.graph, remat.schedule).peak <= rep["budget"]


@pytest.mark.slow
def test_scale_transformer_36_36():
    model, sample = zoo.get("transformer", layers=36)
    t0 = time.perf_counter()
    remat = HRockmate(model, sample, 0.5, cache=False, progress=False)
    elapsed = time.perf_counter() - t0
    rep = remat.report()
    print({k: rep.get(k) for k in ("compute_nodes", "blocks", "unique_blocks", "solve_time",
                                   "relative_peak", "relative_time", "solver")}, elapsed)
    assert elapsed <= 1800
    assert hiremate.simulate(remat.graph, remat.schedule).peak <= rep["budget"]


def test_gradients_sharing_a_storage_are_copied_right_after_it():
    """FNO's complex weights get their real and imaginary gradients as two views of one
    backward storage. Both must be copied (so the storage is a counted gradient, not an
    uncounted parameter gradient that the simulator ignores while the executor holds it), and
    each copy's node must come right after the storage's producer: solvers that keep the node
    order would otherwise hold every such storage until the end of the backward (fno3d: 216 KiB
    that the simulator did not see, measured peak 1.46 x the budget)."""
    model, sample = zoo.get("fno1d", layers=1, dtype=torch.float64)
    graph = hiremate.build_graph(model, sample)
    copies = [n for n in graph.nodes if n.name.endswith("_grad_copy")]
    assert len(copies) == 2  # weight_re and weight_im of the one spectral layer
    for c in copies:
        (src,) = c.inputs
        d = graph.data[src]
        assert d.counted and d.kind is DataKind.GRAD, (c.name, d.kind)
        producer = d.producer
        between = range(producer + 1, c.id)
        assert all(graph.nodes[k].name.endswith("_grad_copy") for k in between), c.name


def test_calibration_falls_back_to_the_lowest_budget_the_solvers_meet(monkeypatch):
    """When the executor measures above the budget and the budget lowered by the excess is out
    of the solvers' reach, calibration solves at the lowest budget they are known to meet (the
    error's ``min_budget``) instead of giving up with the over-budget schedule."""
    import types

    import hiremate.runtime.measurement as measurement
    import hiremate.solving as solving

    model, sample = zoo.get("mlp", dtype=torch.float64)
    graph = hiremate.build_graph(model, sample)
    ad = hiremate.simulate(graph, hiremate.autodiff_schedule(graph)).peak
    budget, low = int(0.6 * ad), int(0.5 * ad)
    real_solve = solving.solve_graph
    asked: list[int] = []

    def solve(g, b, config="hiremate", **kw):
        asked.append(int(b))
        if len(asked) == 2:  # the budget lowered by the excess: out of reach
            raise hiremate.InfeasibleBudgetError("too low", min_budget=low)
        return real_solve(g, b, config, **kw)

    def measure(module, *args, **kwargs):  # the executor "measures" 1.2 x its predicted peak
        peak = hiremate.simulate(graph, module.schedule).peak
        return types.SimpleNamespace(peak=int(1.2 * peak))

    monkeypatch.setattr(solving, "solve_graph", solve)
    monkeypatch.setattr(measurement, "measure", measure)
    remat = HRockmate.from_graph(model, graph, budget, sample=sample, cache=False, **FAST)
    rep = remat.report()
    assert asked[0] == budget and asked[1] < budget and asked[2] == low
    assert len(rep["calibration"]) >= 2
    assert hiremate.simulate(graph, remat.schedule).peak <= low
    assert rep["budget"] == budget
