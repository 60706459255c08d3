"""The executor calls an op the way the trace recorded it, defaults included.

A traced op leaves out the arguments at their schema default, and the executor calls an op
through its public binding where it can (``torch._C._nn.mse_loss`` for
``aten.mse_loss.default``). The bindings parse an integer default from its C++ text, and the
losses' ``reduction=Mean`` reads as 0 (no reduction) there. A model returning
``F.mse_loss(out, target)``, or a loss captured with ``loss_fn=F.mse_loss``, returned the
elementwise loss instead of its mean; such ops now run through their overload.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hiremate
from hiremate.runtime.codegen import public_binding

FAST = {"n_jobs": 1, "cache": False, "progress": False, "calibrate": 0}


def _loss_inputs() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(4, 3, generator=g), torch.rand(4, 3, generator=g)
    sign = torch.randn(4, 3, generator=g).sign()
    classes = torch.randint(0, 3, (4,), generator=g)
    return {"binary_cross_entropy": (a, b), "binary_cross_entropy_with_logits": (a, b),
            "hinge_embedding_loss": (a, sign), "huber_loss": (a, b),
            "margin_ranking_loss": (a, b, sign), "mse_loss": (a, b),
            "multi_margin_loss": (a, classes), "nll_loss": (a.log(), classes),
            "smooth_l1_loss": (a, b), "soft_margin_loss": (a, sign)}


@pytest.mark.parametrize("name", sorted(_loss_inputs()))
def test_a_loss_whose_binding_reads_its_default_reduction_as_none_runs_as_its_op(name):
    """The cause, loss by loss: the bare binding returns an elementwise loss where the op
    returns the mean, so the executor does not call it."""
    args = _loss_inputs()[name]
    op = getattr(torch.ops.aten, name).default
    binding = getattr(torch._C._nn, name, None) or getattr(torch._C._VariableFunctions, name)
    assert op(*args).dim() == 0 and binding(*args).dim() > 0
    assert public_binding(f"aten.{name}.default", op) is None


def test_reduction_is_the_only_integer_default_written_as_an_enum():
    """What the executor's rule rests on: in this torch's operator table, every integer
    default that is not a number is a ``reduction``. A torch that adds another fails here."""
    try:
        import torchgen
    except ImportError:
        pytest.skip("torchgen (shipped with torch) is not importable: no operator table")
    table = Path(torchgen.__file__).parent / "packaged/ATen/native/native_functions.yaml"
    if not table.is_file():
        pytest.skip(f"no operator table at {table}")
    named = re.findall(r"\bint (\w+)=([A-Za-z_][\w:]*)", table.read_text())
    assert named and {name for name, _ in named} == {"reduction"}


class _Losses(nn.Module):
    """Ten losses at their default (mean) reduction, stacked: an elementwise loss in place of a
    mean cannot stack with the others."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(),
                                  nn.Linear(128, 6))

    def forward(self, x, target, sign, classes):
        out = self.body(x)
        a, b = out[:, :3], out[:, 3:]
        prob = torch.sigmoid(a)
        return torch.stack([
            F.mse_loss(a, target), F.binary_cross_entropy(prob, torch.sigmoid(target)),
            F.binary_cross_entropy_with_logits(a, torch.sigmoid(target)),
            F.hinge_embedding_loss(a, sign), F.huber_loss(a, target),
            F.margin_ranking_loss(a, b, sign), F.multi_margin_loss(a, classes),
            F.nll_loss(a.log_softmax(-1), classes), F.smooth_l1_loss(b, target),
            F.soft_margin_loss(b, sign)])


def test_a_model_returning_losses_at_their_default_reduction_trains_as_eager():
    torch.manual_seed(0)
    model = _Losses().double()
    g = torch.Generator().manual_seed(1)
    sample = {"x": torch.randn(32, 6, dtype=torch.float64, generator=g),
              "target": torch.randn(32, 3, dtype=torch.float64, generator=g),
              "sign": torch.randn(32, 3, dtype=torch.float64, generator=g).sign(),
              "classes": torch.randint(0, 3, (32,), generator=g)}
    eager = copy.deepcopy(model)
    wrapped = hiremate.HRockmate(model, sample, 0.9, cost_model="flops", **FAST)
    ours = wrapped(**sample)
    ours.sum().backward()
    theirs = eager(**sample)
    theirs.sum().backward()
    assert ours.shape == theirs.shape == (10,)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-14, msg=name)


def test_a_captured_mse_loss_is_the_mean():
    """``loss_fn=F.mse_loss`` captured into the graph: the call returns eager's scalar loss."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 8)).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, dtype=torch.float64, generator=g)
    target = torch.randn(32, 8, dtype=torch.float64, generator=g)
    eager = copy.deepcopy(model)
    wrapped = hiremate.HRockmate(model, x, 0.8, loss_fn=F.mse_loss, target=target,
                                 cost_model="flops", **FAST)
    loss = wrapped(x, target=target)
    expected = F.mse_loss(eager(x), target)
    assert loss.shape == ()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    loss.backward()
    expected.backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-14, msg=name)
