"""Parameters frozen or unfrozen after the build: the graph differentiates the parameters that
were trainable at capture, so one unfrozen later (a backbone trained after some epochs of the
head alone) needs another capture, which ``HRockmate`` makes once per such set; one frozen
later only has its gradient dropped, as eager autograd leaves it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hiremate import HRockmate


def _model() -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    layers = [m for _ in range(6) for m in (nn.Linear(32, 32), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(32, 4)).double(), torch.randn(64, 32).double()


def _grads_match(model: nn.Module, reference: nn.Module, x: torch.Tensor, wrapper) -> None:
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
    wrapper(x).square().sum().backward()
    reference(x).square().sum().backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)


def _set_backbone(model: nn.Module, trainable: bool) -> None:
    for p in model[:6].parameters():
        p.requires_grad_(trainable)


def test_unfrozen_parameters_are_captured_again_once_and_get_eagers_gradients():
    model, x = _model()
    _set_backbone(model, False)
    reference = copy.deepcopy(model)
    wrapper = HRockmate(model, x, 0.6, calibrate=0)
    _grads_match(model, reference, x, wrapper)
    assert wrapper.recaptures == 0
    for m in (model, reference):
        _set_backbone(m, True)
    for _ in range(2):  # the second call reuses the module built for this set
        _grads_match(model, reference, x, wrapper)
        assert model[0].weight.grad is not None
        assert wrapper.recaptures == 1
    for m in (model, reference):  # frozen again: the module built first
        _set_backbone(m, False)
    _grads_match(model, reference, x, wrapper)
    assert wrapper.recaptures == 1


def test_parameters_frozen_after_the_build_keep_the_module_and_get_no_gradient():
    model, x = _model()
    reference = copy.deepcopy(model)
    wrapper = HRockmate(model, x, 0.6, calibrate=0)
    for m in (model, reference):
        _set_backbone(m, False)
    _grads_match(model, reference, x, wrapper)
    assert model[0].weight.grad is None and model[-1].weight.grad is not None
    assert wrapper.recaptures == 0


def test_the_executor_alone_refuses_a_parameter_unfrozen_after_its_graph():
    import hiremate
    from hiremate.errors import InputMismatchError
    from hiremate.runtime.executor import RematModule

    model, x = _model()
    _set_backbone(model, False)
    graph = hiremate.build_graph(model, x, cost_model="flops")
    module = RematModule(model, graph, hiremate.autodiff_schedule(graph))
    module(x).sum().backward()
    _set_backbone(model, True)
    with pytest.raises(InputMismatchError, match=r"0\.weight") as caught:
        module(x)
    assert isinstance(caught.value, ValueError)
    with torch.no_grad():  # no backward can follow: nothing is missing
        module(x)
