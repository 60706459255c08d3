"""Random-generator states the executor keeps for the random ops it reruns are part of the
predicted peak: the measured peak of a dropout model matches it without calibration."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hiremate
from hiremate.ir.simulator import simulate, step_peak as rng_state_peak


def _dropout_mlp():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layers = []
        for _ in range(4):
            layers += [nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.1)]
        model = nn.Sequential(*layers, nn.Linear(64, 4))
        x = torch.randn(32, 64)
    return model, x


def test_a_schedule_without_reruns_keeps_no_state():
    model, x = _dropout_mlp()
    graph = hiremate.build_graph(model, x, cost_model="flops")
    assert graph.meta["rng_state_bytes"] == torch.get_rng_state().numel()
    schedule = hiremate.autodiff_schedule(graph)
    assert rng_state_peak(graph, schedule) == simulate(graph, schedule).peak


@pytest.mark.parametrize("preset", ["twremat"])
def test_measured_peak_matches_the_prediction_with_reruns(preset):
    model, x = _dropout_mlp()
    remat = hiremate.HRockmate(model, x, 0.6, config=preset, cost_model="flops", cache=False,
                               n_jobs=1, calibrate=0, progress=False)
    report = remat.report()
    per_state = remat.graph.meta["rng_state_bytes"]
    assert report["rng_state_bytes"] >= per_state  # the schedule reruns a dropout
    assert report["predicted_peak"] <= report["budget"]
    measured = hiremate.measure(remat, x, repeats=1).peak
    assert report["predicted_peak"] * 0.98 <= measured <= report["predicted_peak"] * 1.02


def test_reruns_are_avoided_when_their_states_would_not_fit():
    """On a tiny model one saved generator state (5 KiB) outweighs every activation: the solve
    finds a schedule that recomputes other nodes but no random one."""
    from test_wrapper import QUICK, new_net

    model, x = new_net(0), torch.randn(5, 8, dtype=torch.float64)
    remat = hiremate.HRockmate(model, x, 0.7, **QUICK)
    report = remat.report()
    assert report["rng_state_bytes"] == 0
    assert report["random_reruns"].startswith("avoided")
    assert report["predicted_peak"] <= report["budget"]
    assert report["predicted_time"] == pytest.approx(simulate(remat.graph, remat.schedule).time)
    measured = hiremate.measure(remat, x, repeats=1).peak
    assert measured <= report["predicted_peak"] * 1.02
