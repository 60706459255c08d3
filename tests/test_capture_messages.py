"""What a user reads when a model cannot be captured: the cause, the line of the model, said
once, and nothing else on the console.

A check inside a torch function on values computed in the model (``gaussian_nll_loss`` checks
its variance) stops the trace where :class:`~hiremate.graphbuilder.guards.BranchRecorder` does
not look: before, the error carried torch's own text (a guard on ``Eq(u0, 1)``) twice, and a
failed ``torch.export`` printed its partial graph and a warning to stderr first.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.utils._pytree as pytree
import torch.nn.functional as F
from torch import nn

from hiremate.api import HRockmate
from hiremate.errors import GraphCaptureError


class VarianceHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.Linear(8, 8)
        self.scale = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean(x)
        return F.gaussian_nll_loss(mean, x, self.scale(x).exp())  # the line named


class ActivationBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y if (y > 0).all() else y * 2  # the line named


def _refusal(model: nn.Module) -> str:
    """The text of the capture error that building ``model`` on a 4 x 8 sample raises."""
    torch.manual_seed(0)
    with pytest.raises(GraphCaptureError) as info:
        HRockmate(model, torch.randn(4, 8), 0.6)
    return str(info.value)


def test_a_check_inside_a_torch_function_names_the_function_and_the_line(capfd):
    text = _refusal(VarianceHead())
    assert "torch.nn.functional.gaussian_nll_loss" in text
    assert "test_capture_messages.py" in text and "the line named" in text
    assert "every path:" in text and text.count("gaussian_nll_loss") == 2  # said once
    assert "Eq(u0" not in text
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


def test_a_branch_on_an_activation_leaves_the_console_quiet(capfd):
    torch.manual_seed(0)
    with pytest.raises(GraphCaptureError, match=r"branches on the value of a tensor") as info:
        HRockmate(ActivationBranch(), torch.randn(4, 8), 0.6)
    assert "the line named" in str(info.value)
    assert "Eq(u0" not in str(info.value)
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


@dataclasses.dataclass
class Heads:
    logits: torch.Tensor
    hidden: torch.Tensor


class DataclassOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> Heads:
        hidden = torch.relu(self.lin(x))
        return Heads(hidden.sum(1), hidden)


def test_an_output_class_pytree_cannot_open_is_refused_with_the_fix():
    """Before, the capture took the dataclass for an opaque object that needs no gradient: the
    build failed with "no output needs a gradient", and beside a tensor output the wrapper
    returned None in its place."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with pytest.raises(GraphCaptureError, match=r"Heads.*register_dataclass\(Heads\)"):
        HRockmate(DataclassOutput(), x, 1.0)
    pytree.register_dataclass(Heads)
    try:
        model = DataclassOutput()
        out = HRockmate(model, x, 1.0)(x)
        assert isinstance(out, Heads)
        (out.logits.sum() + out.hidden.square().sum()).backward()
        eager = DataclassOutput()
        eager.load_state_dict(model.state_dict())
        reference = eager(x)
        (reference.logits.sum() + reference.hidden.square().sum()).backward()
        assert torch.allclose(model.lin.weight.grad, eager.lin.weight.grad)
    finally:
        pytree._deregister_pytree_node(Heads)


class QueuePointer(nn.Module):
    """MoCo's queue: a buffer's value read into Python to slice where the next keys go."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("queue", torch.zeros(8, 16))
        self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = self.lin(x)
        p = int(self.ptr)  # the line named
        self.queue[:, p:p + 4] = keys.detach().T
        self.ptr[0] = (p + 4) % 16
        return (keys @ self.queue).sum()


def test_a_value_read_from_a_buffer_names_the_buffer_and_the_call():
    """Said before: "branches on the value of a tensor (b_2) ... depends on a buffer of the
    model: a traced program cannot follow a branch on an activation"."""
    text = _refusal(QueuePointer())
    assert "reads the value of a tensor into Python (int())" in text
    assert "the buffer 'ptr'" in text and "the line named" in text
    assert "activation" not in text.split("export:")[0]


def test_a_cumulative_batch_norm_is_named_with_the_setting_to_change():
    """BatchNorm with momentum=None reads its batch count into Python at every call: the
    refusal named only the buffer, not the setting behind it."""
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, momentum=None), nn.Tanh())
    with pytest.raises(GraphCaptureError, match=r"the buffer '1.num_batches_tracked': this is "
                       r"a BatchNorm with momentum=None .* Give it a momentum"):
        HRockmate(model, torch.randn(4, 8), 1.0, cost_model="flops")


class TakesAList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, parts: list) -> torch.Tensor:
        return sum(self.lin(p) for p in parts).sum()


def test_a_list_sample_for_a_forward_that_takes_one_list_says_how_to_pass_it():
    parts = [torch.randn(4, 8), torch.randn(4, 8)]
    with pytest.raises(GraphCaptureError, match=r"the sample is a list, which gives the "
                       r"positional arguments as a tuple does: pass \(\[\.\.\.\],\)"):
        HRockmate(TakesAList(), parts, 0.9)
    wrapped = HRockmate(TakesAList(), (parts,), 1.0, cost_model="flops")
    assert wrapped(parts).shape == ()
