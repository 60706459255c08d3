"""The default preset is never worse than another preset on the same graph (issue: a chain of
Linear layers once got +15 % from ``hiremate`` where ``rockmate`` found +5 %, because the flat
path's time-limited incumbent won the default's choice and the hierarchy was not tried).

Graphs are captured with FLOP costs, so the predicted times (what every preset minimises) are
the same in every run. A preset that cannot meet the budget is left out of the comparison; the
default must then still meet it whenever another preset does.
"""

from __future__ import annotations

import pytest
import torch

import hiremate
from hiremate.api import solve_graph
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.simulator import simulate

OTHERS = ["rockmate", "rotor", "twremat", "fastsa", "hilp", "checkmate"]
FAST = {"cache": False, "calibrate": 0, "n_jobs": 1, "progress": False}


def _chain(n: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for i in range(n):
        layers += [torch.nn.Linear(32, 32), torch.nn.GELU() if i % 2 else torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


class _Residual(torch.nn.Module):
    """Blocks with a skip connection: not a chain of single nodes, so H-Partition groups them."""

    def __init__(self, n: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
            for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x.tanh()


def _graph(model: torch.nn.Module):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        x = torch.randn(16, 32)
    return hiremate.build_graph(model, x, cost_model="flops")


@pytest.fixture(scope="module")
def graph(request):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        kind = request.param.rstrip("0123456789")
        size = int(request.param[len(kind):])
        model = _chain(size) if kind == "chain" else _Residual(size)
    return _graph(model)


def _predicted(graph, budget: float, preset: str) -> float | None:
    try:
        res = solve_graph(graph, budget, preset, **FAST)
    except InfeasibleBudgetError:
        return None
    sim = simulate(graph, res.schedule)
    assert sim.valid and sim.peak <= res.report["budget"]
    return sim.time


# at 0.5 the chains' flat MILPs (the hilp and checkmate presets) take 30-70 s in all: those
# cases are the full run's. On the 10-layer chain at 0.5 the hierarchy's best is 2.5 % slower
# than theirs; the default's flat H-ILP, gated by a threshold that shrinks on a MILP this small
# (flat_gap_columns), runs and finds it (without that scaling the gate skipped it at 5 %).
@pytest.mark.parametrize("graph, fraction", [
    pytest.param("chain10", 0.5, marks=pytest.mark.slow, id="chain10-0.5"),
    pytest.param("chain12", 0.5, marks=pytest.mark.slow, id="chain12-0.5"),
    pytest.param("chain12", 0.7, id="chain12-0.7"),
    pytest.param("residual6", 0.5, id="residual6-0.5"),
    pytest.param("residual6", 0.7, id="residual6-0.7")], indirect=["graph"])
def test_default_never_worse_than_another_preset(graph, fraction):
    default = _predicted(graph, fraction, "hiremate")
    others = {p: _predicted(graph, fraction, p) for p in OTHERS}
    found = {p: t for p, t in others.items() if t is not None}
    if found:
        assert default is not None, f"default found nothing where {sorted(found)} did"
    worse = {p: t for p, t in found.items() if default > t * (1 + 1e-9)}
    assert not worse, f"default {default:.6g} slower than {worse}"


def test_the_bench_prints_each_preset_against_the_default(capsys):
    """``bench/presets_compare.py`` (the issue's chain against every preset, docs/results.md):
    one row per preset, the default's ratio 1, and a preset that meets nothing named by its
    error rather than dropped."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import presets_compare

    presets_compare.main(["--layers", "4", "--budgets", "0.7", "0.05",
                          "--presets", "hiremate", "rockmate", "twremat"])
    # logging stays on for the tests that run after it in this process (test_registry's
    # warning check failed behind it once)
    import logging

    assert logging.root.manager.disable == logging.NOTSET
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| 0.")]
    assert [r[1] for r in rows] == ["hiremate", "rockmate", "twremat"] * 2
    assert float(rows[0][2]) > 1 and rows[0][5].startswith("1.0000")
    assert float(rows[1][5].rstrip(" |")) >= 1  # rockmate: never better than the default
    # TW-Remat meets nothing at 0.7 on this chain, and no preset meets 0.05
    assert all(r[3] == "InfeasibleBudgetError" for r in rows[2:])
