"""Module hooks and the schedule: forward and backward hooks present at the build ran once on
traced values and do not run through the schedule (a warning says so); hooks added after the
build make the call run the model's plain forward, where they run, until they are removed."""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from hiremate import HRockmate
from test_executor_util import schedule_calls


def _model() -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    layers = [m for _ in range(6) for m in (nn.Linear(16, 16), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(16, 4)).double(), torch.randn(64, 16).double()


def test_a_hook_added_after_the_build_runs_in_the_plain_forward(caplog):
    model, x = _model()
    eager = copy.deepcopy(model)
    wrapper = HRockmate(model, x, 0.6, calibrate=0)
    calls = schedule_calls(wrapper)
    kept: list[torch.Tensor] = []
    handle = model[4].register_forward_hook(lambda mod, args, out: kept.append(out.detach()))
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        for _ in range(2):
            wrapper(x).sum().backward()
    assert calls == [] and len(kept) == 2
    assert torch.equal(kept[0], eager[:5](x).detach())
    assert len([r for r in caplog.records if "hooks were added" in r.getMessage()]) == 1
    handle.remove()
    wrapper(x).sum().backward()
    assert calls == [1] and len(kept) == 2


def test_hooks_at_the_build_are_named_and_torchs_own_are_not(caplog):
    model, x = _model()
    model[2].register_forward_hook(lambda mod, args, out: None)
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        wrapper = HRockmate(model, x, 0.6, calibrate=0)
    assert any("1 module hooks" in r.getMessage() for r in caplog.records)
    calls = schedule_calls(wrapper)
    wrapper(x).sum().backward()
    assert calls == [1]  # the schedule runs: the hooks are those of the build
    caplog.clear()
    model, x = _model()
    nn.utils.spectral_norm(model[0])  # a pre-hook of torch's own, which only computes
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        HRockmate(model, x, 0.6, calibrate=0)
    assert not any("hooks" in r.getMessage() for r in caplog.records)


class GradientHooks(nn.Module):
    """Gradient hooks registered in the forward: one scales a gradient (captured), one keeps
    it (a side effect that happens only while capturing)."""

    def __init__(self, kept: list[torch.Tensor]):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)
        self.kept = kept

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if h.requires_grad:
            h.register_hook(lambda grad: grad * 0.5)
            h.register_hook(self.kept.append)
        return self.b(h)


def test_gradient_hooks_in_the_forward_are_captured_and_named(caplog):
    torch.manual_seed(0)
    kept: list[torch.Tensor] = []
    model = GradientHooks(kept).double()
    x = torch.randn(32, 16, dtype=torch.float64)
    eager = copy.deepcopy(model)
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        wrapper = HRockmate(model, x, 1.0, calibrate=0)
    assert any("gradient hooks" in r.getMessage() for r in caplog.records)
    wrapper(x).square().sum().backward()
    eager(x).square().sum().backward()
    for a, b in zip(model.parameters(), eager.parameters()):
        assert torch.equal(a.grad, b.grad)  # the scaling hook is part of the program


def test_a_backward_hook_added_after_the_build_runs_in_the_plain_forward(caplog):
    """Before, a ``register_full_backward_hook`` added after the build never ran, silently:
    only forward hooks were counted."""
    model, x = _model()
    eager = copy.deepcopy(model)
    wrapper = HRockmate(model, x, 0.6, calibrate=0)
    calls = schedule_calls(wrapper)
    norms: list[float] = []
    handle = model[4].register_full_backward_hook(
        lambda mod, grad_in, grad_out: norms.append(float(grad_out[0].norm())))
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        wrapper(x).sum().backward()
    eager(x).sum().backward()
    assert calls == [] and len(norms) == 1
    assert any("module hooks were added" in r.getMessage() for r in caplog.records)
    for a, b in zip(model.parameters(), eager.parameters()):
        assert torch.equal(a.grad, b.grad)
    handle.remove()
    wrapper(x).sum().backward()
    assert calls == [1] and len(norms) == 1


def test_a_backward_hook_at_the_build_is_named_and_what_it_returns_is_captured(caplog):
    model, x = _model()
    eager = copy.deepcopy(model)
    for m in (model, eager):
        m[2].register_full_backward_hook(lambda mod, grad_in, grad_out: (grad_in[0] * 0.5,))
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        wrapper = HRockmate(model, x, 0.6, calibrate=0)
    assert any("1 module hooks" in r.getMessage() for r in caplog.records)
    calls = schedule_calls(wrapper)
    wrapper(x).sum().backward()
    eager(x).sum().backward()
    assert calls == [1]
    for a, b in zip(model.parameters(), eager.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=0)
