"""A backward with ``retain_graph=True`` leaves the call differentiable again, as in eager
PyTorch: several losses over one output, the same loss twice, ``torch.autograd.grad`` before
``backward``. That backward runs on copies of what the call kept (values and generator
states), so the next one finds them as they were and the gradients are eager's."""

from __future__ import annotations

import copy

import pytest
import torch

import hiremate
from hiremate.errors import BackwardTwiceError, ModifiedInPlaceError

_CONFIG = {"cost_model": "flops", "calibrate": 0}


class _Net(torch.nn.Module):
    """Dropout makes the rerun's random numbers matter; ``target`` adds a loss output, which
    the wrapper differentiates alone (its other outputs get no tangent)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.Dropout(0.3), torch.nn.GELU(),
            torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None):
        logits = self.body(x)
        if target is None:
            return logits
        return {"loss": torch.nn.functional.mse_loss(logits, target), "logits": logits}


def _pair(with_target: bool):
    torch.manual_seed(0)
    model = _Net().double()
    eager = copy.deepcopy(model)
    x = torch.randn(32, 16, dtype=torch.float64)
    sample = (x, torch.randn(32, 8, dtype=torch.float64)) if with_target else (x,)
    return hiremate.HRockmate(model, sample, 0.8, config=_CONFIG), model, eager, sample


def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


def _close(a: list, b: list) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)


def test_two_losses_over_one_output_give_eager_gradients() -> None:
    wrapped, model, eager, (x,) = _pair(False)
    seen = []
    for run, params in ((wrapped, model), (eager, eager)):
        torch.manual_seed(5)
        xi = x.clone().requires_grad_()
        out = run(xi)
        out.pow(2).sum().backward(retain_graph=True)
        first = _grads(params)
        out.sin().sum().backward()
        seen.append([*first, *_grads(params), xi.grad, torch.rand(3)])  # and the RNG after
    _close(*seen)


def test_the_same_loss_twice_then_a_third_time_refused() -> None:
    wrapped, model, eager, sample = _pair(True)
    seen = []
    for run, params in ((wrapped, model), (eager, eager)):
        torch.manual_seed(7)
        loss = run(*sample)["loss"]
        loss.backward(retain_graph=True)
        loss.backward()
        seen.append(_grads(params))
    _close(*seen)
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())
    loss = wrapped(*sample)["loss"]
    loss.backward()
    with pytest.raises(BackwardTwiceError, match="retain_graph=True"):
        loss.backward()


def test_autograd_grad_kept_then_backward() -> None:
    wrapped, model, eager, (x,) = _pair(False)
    seen = []
    for run, params in ((wrapped, model), (eager, eager)):
        torch.manual_seed(9)
        xi = x.clone().requires_grad_()
        loss = run(xi).square().mean()
        (gx,) = torch.autograd.grad(loss, xi, retain_graph=True)
        loss.backward()
        seen.append([gx, xi.grad, *_grads(params)])
    _close(*seen)


def test_a_parameter_stepped_between_the_two_backwards_is_refused() -> None:
    wrapped, model, _, (x,) = _pair(False)
    out = wrapped(x)
    out.sum().backward(retain_graph=True)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    with pytest.raises(ModifiedInPlaceError, match="modified in place"):
        out.mean().backward()
