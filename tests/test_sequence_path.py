"""The default preset runs Rockmate's two levels (the sequence partition's chain of blocks, rk-Rotor)
beside the hierarchy (``sequence_top``): on models whose hierarchy folds many small layers into a
few large subgraphs, the chain DP over fine blocks finds the faster schedule (the paper-size
MLPMixer: 1.092 against the hierarchy's 1.123 with FLOP costs). Its candidates must be valid,
within the budget, and run in the executor with eager's gradients."""

from __future__ import annotations

import pytest
import torch

import hiremate
from hiremate.api import solve_graph
from hiremate.config import Config, load_config
from hiremate.errors import ConfigError
from hiremate.runtime.executor import RematModule

FAST = {"cache": False, "calibrate": 0, "n_jobs": 1, "progress": False, "flat_max_nodes": 0}


class _Mixer(torch.nn.Module):
    """Residual MLP blocks: a chain at the block boundaries, not a chain of single nodes."""

    def __init__(self, n: int = 6, width: int = 24):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, 2 * width),
                                torch.nn.GELU(), torch.nn.Linear(2 * width, width))
            for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x.square().mean()


def _model_and_graph(dtype=torch.float32):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _Mixer().to(dtype)
        x = torch.randn(8, 24, dtype=dtype)
    return model, x, hiremate.build_graph(model, x, cost_model="flops")


def test_sequence_path_candidates_are_valid_and_reported():
    _, _, graph = _model_and_graph()
    res = solve_graph(graph, 0.5, "hiremate", **FAST)
    seq = res.report["sequence_path"]
    assert seq["blocks"] > 1 and seq["largest_block"] > 0
    names = set(res.report["candidates"])
    assert "sequence:rk-rotor" in names, names
    assert {"hilp-top", "rk-rotor"} & names, names  # the hierarchy ran as well
    sim = hiremate.simulate(graph, res.schedule)
    assert sim.valid and sim.peak <= res.report["budget"]
    # the winner is the fastest of all candidates, whichever path gave it
    assert res.report["predicted_time"] == min(c["time"] for c in res.report["candidates"].values())


def test_sequence_path_candidates_run_in_the_executor_with_eager_gradients():
    from hiremate.composer.menu_cache import MenuCache
    from hiremate.composer.flat import Paths
    from hiremate.composer.solve import _sequence_path

    model, x, graph = _model_and_graph(torch.float64)
    budget = hiremate.simulate(graph, hiremate.autodiff_schedule(graph)).peak // 2
    found, report = Paths(), {}
    _sequence_path(graph, budget, load_config("hiremate", **FAST), MenuCache(None, enabled=False),
                   found, report)
    assert found.candidates and report["sequence_path"]["blocks"] > 1
    model.zero_grad()
    model(x).backward()
    eager = [p.grad.clone() for p in model.parameters()]
    for cand in found.candidates:
        assert cand.source == "sequence:rk-rotor"
        sim = hiremate.simulate(graph, cand.schedule)
        assert sim.valid and sim.peak <= budget
        model.zero_grad()
        RematModule(model, graph, cand.schedule)(x).backward()
        for g, p in zip(eager, model.parameters()):
            torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12)


def test_sequence_path_skipped_on_large_blocks_and_off_by_default():
    _, _, graph = _model_and_graph()
    res = solve_graph(graph, 0.5, "hiremate", **FAST, sequence_max_block=1)
    assert "skipped" in res.report["sequence_path"]
    assert not any(n.startswith("sequence:") for n in res.report["candidates"])
    res = solve_graph(graph, 0.5, "hiremate", **FAST, sequence_top=[])
    assert "sequence_path" not in res.report
    assert Config().sequence_top == []


def test_sequence_path_skipped_when_one_block_holds_most_of_the_graph():
    """A random DAG's sequence chain is an input block and one block of the rest: its menu
    would be MILPs on nearly the whole graph, so the path is skipped and says why; a chain of
    many small blocks (the mixer above) still runs it."""
    from hiremate.registry import make_partitioner
    from hiremate.testing.synthetic import random_graph

    graph = random_graph(4, 10, max_fanin=2)
    hierarchy = make_partitioner("sequence", {}).partition(graph)
    sizes = [len(hierarchy.leaves(p)) for p in hierarchy.top]
    # within the size bound, so the share is what skips it
    assert max(sizes) <= load_config("hiremate").sequence_max_block
    assert 2 * max(sizes) > sum(sizes)
    res = solve_graph(graph, 0.8, "hiremate", **FAST)
    assert "more than half" in res.report["sequence_path"]["skipped"]
    assert not any(n.startswith("sequence:") for n in res.report["candidates"])
    sim = hiremate.simulate(graph, res.schedule)
    assert sim.valid and sim.peak <= res.report["budget"]


@pytest.mark.parametrize("bad", [["nope"], "x", -1])
def test_sequence_keys_are_checked(bad):
    key = "sequence_max_block" if isinstance(bad, int) else "sequence_top"
    with pytest.raises(ConfigError):
        load_config("hiremate", **{key: bad})
