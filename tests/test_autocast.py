"""Autocast (mixed precision): a capture under ``torch.autocast`` records its casts, and
``HRockmate`` runs the schedule only under the autocast it was captured with; under another
one it runs the plain forward (as a model in another mode), with a warning once."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from hiremate import HRockmate
from test_executor_util import schedule_calls


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers = [m for _ in range(6) for m in (nn.Linear(32, 32), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(32, 4)), torch.randn(128, 32)


def _ours(caplog) -> list:
    """hiremate's records: other libraries may log beside it (torch's tracing does, once a
    test in the same process has turned its logs on)."""
    return [r for r in caplog.records if r.name.startswith("hiremate")]


def _step(module: nn.Module, x: torch.Tensor, autocast: bool) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = module(x)
    out.float().square().sum().backward()
    return out


def test_captured_under_autocast_runs_its_schedule_with_eagers_gradients(caplog):
    model, x = _model()
    reference = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        wrapper = HRockmate(model, x, 0.6, calibrate=0)
    assert wrapper.graph.meta["autocast"] == "bfloat16"
    assert any(d.dtype == "bfloat16" for d in wrapper.graph.data)
    assert wrapper.report()["relative_time"] > 1  # it recomputes
    calls = schedule_calls(wrapper)
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        ours = _step(wrapper, x, autocast=True)
    theirs = _step(reference, x, autocast=True)
    assert calls == [1] and not _ours(caplog)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    assert torch.equal(ours, theirs)
    for a, b in zip(wrapper.parameters(), reference.parameters()):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("captured", [False, True])
def test_a_call_under_another_autocast_runs_the_plain_forward(captured, caplog):
    """Captured without autocast and called under it (the backward of the float32 program
    failed on the bfloat16 values), or the other way round: the plain forward, as eager."""
    model, x = _model()
    reference = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=captured):
        wrapper = HRockmate(model, x, 0.6, calibrate=0)
    assert wrapper.graph.meta.get("autocast") == ("bfloat16" if captured else None)
    calls = schedule_calls(wrapper)
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            ours = _step(wrapper, x, autocast=not captured)
    theirs = _step(reference, x, autocast=not captured)
    assert calls == []
    assert len([r for r in _ours(caplog) if "autocast" in r.getMessage()]) == 1
    assert torch.equal(ours, theirs)
    for a, b in zip(wrapper.parameters(), reference.parameters()):
        assert torch.equal(a.grad, b.grad)
