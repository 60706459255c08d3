"""Ops whose sizes depend on input values (:mod:`hiremate.graphbuilder.traceable`): the CTC loss
inside a model (``nn.CTCLoss``, ``F.ctc_loss``, lengths as tensors or lists) and
``masked_select`` with a mask made from the inputs are captured, scheduled and trained exactly
as eager. Before, every such model failed to capture: torch's fake tensors refuse
``aten._ctc_loss``, and a masked selection had a size no schedule could plan for."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode

import hiremate
from hiremate.errors import GraphCaptureError

CLASSES = 6


class CtcModel(nn.Module):
    """Frames -> log-probabilities over ``CLASSES`` labels (0 is the blank) -> CTC loss."""

    def __init__(self, reduction: str = "mean", functional: bool = False):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.GELU())
        self.head = nn.Linear(16, CLASSES)
        self.loss = nn.CTCLoss(reduction=reduction, zero_infinity=True)
        self.functional = functional

    def forward(self, frames, targets, frame_lengths, target_lengths):
        log_probs = self.head(self.encoder(frames)).log_softmax(-1).transpose(0, 1)
        if self.functional:
            return F.ctc_loss(log_probs, targets, frame_lengths, target_lengths,
                              reduction=self.loss.reduction)
        return self.loss(log_probs, targets, frame_lengths, target_lengths)


def batch(target_lengths: list[int], as_tensors: bool = True, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    frames = torch.randn(3, 12, 8, generator=gen, dtype=torch.float64)
    targets = torch.randint(1, CLASSES, (3, 5), generator=gen)
    frame_lengths = [12, 10, 9]
    if as_tensors:
        return {"frames": frames, "targets": targets,
                "frame_lengths": torch.tensor(frame_lengths),
                "target_lengths": torch.tensor(target_lengths)}
    return {"frames": frames, "targets": targets, "frame_lengths": frame_lengths,
            "target_lengths": target_lengths}


def assert_trains_as_eager(wrapped: nn.Module, model: nn.Module, sample: dict | tuple) -> None:
    """One step of ``wrapped`` and one of eager ``model`` on ``sample`` (keyword arguments or
    positional ones), the output summed: the same loss and parameter gradients (float64)."""
    args, kwargs = ((), sample) if isinstance(sample, dict) else (sample, {})
    model.zero_grad(set_to_none=True)
    loss = wrapped(*args, **kwargs).sum()
    loss.backward()
    ours = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    eager = model(*args, **kwargs).sum()
    eager.backward()
    torch.testing.assert_close(loss, eager, rtol=1e-12, atol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(ours[name], p.grad, rtol=1e-10, atol=1e-14, msg=name)


def assert_reuses_then_recaptures(wrapped: hiremate.HRockmate, model: nn.Module,
                                  same: dict | tuple, other: dict | tuple) -> None:
    """``same`` (inputs whose guarded values are the sample's) runs on the wrapper's program,
    ``other`` is captured again; each trains as eager."""
    assert_trains_as_eager(wrapped, model, same)
    assert wrapped.recaptures == 0
    assert_trains_as_eager(wrapped, model, other)
    assert wrapped.recaptures == 1


def build(model: nn.Module, sample: dict | tuple, budget: float = 0.8) -> hiremate.HRockmate:
    return hiremate.HRockmate(model, sample, budget, n_jobs=1, cache=False, progress=False)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("as_tensors", [True, False])
def test_a_model_with_a_ctc_loss_trains_as_eager(reduction, as_tensors):
    torch.manual_seed(0)
    model = CtcModel(reduction, functional=reduction == "sum").double()
    sample = batch([5, 4, 3], as_tensors)
    wrapped = build(model, sample)
    assert any(op.target.startswith("aten._ctc_loss")
               for node in wrapped.graph.nodes for op in node.ops)
    assert_trains_as_eager(wrapped, model, sample)


def test_lengths_that_keep_the_longest_target_run_on_the_same_program():
    """Only the longest target shapes the program: other lengths run on it, a new longest one
    is captured again; each trains as eager."""
    torch.manual_seed(0)
    model = CtcModel().double()
    wrapped = build(model, batch([5, 4, 3]))
    assert_reuses_then_recaptures(wrapped, model, batch([2, 5, 1], seed=1),
                                  batch([4, 4, 3], seed=2))


def test_the_capture_leaves_torch_without_its_fake_kernels():
    """The kernels live as long as a capture: afterwards torch's fake tensors refuse the op as
    before (the user's process is left as it was)."""
    torch.manual_seed(0)
    build(CtcModel().double(), batch([5, 4, 3]))
    with FakeTensorMode():
        log_probs = torch.randn(12, 3, CLASSES).log_softmax(-1)
        targets = torch.randint(1, CLASSES, (3, 5))
        with pytest.raises(DynamicOutputShapeException):
            torch.ops.aten._ctc_loss.default(log_probs, targets, [12, 10, 9], [5, 4, 3])


class SelectsLabels(nn.Module):
    """Hugging Face's CTC loss in miniature: padded labels (-100) flattened with
    ``masked_select``, the activations gathered with the same mask."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, labels):
        keep = labels >= 0
        picked = self.lin(x).masked_select(keep.unsqueeze(-1))
        return picked.square().sum() + labels.masked_select(keep).sum() * 0.1


def labelled(pattern: list[list[int]], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.tensor(pattern)
    return torch.randn(*labels.shape, 4, generator=gen, dtype=torch.float64), labels


def test_a_selection_by_an_input_mask_trains_as_eager_and_guards_its_count():
    """The selected count shapes the program: masks with the sample's count run on it, another
    count is captured again; each trains as eager."""
    torch.manual_seed(0)
    model = SelectsLabels().double()
    x, labels = labelled([[1, 2, -100], [3, -100, -100]])
    wrapped = build(model, (x, labels), 1.0)
    assert_trains_as_eager(wrapped, model, (x, labels))
    assert_reuses_then_recaptures(wrapped, model, labelled([[-100, 2, -100], [3, 4, -100]], 1),
                                  labelled([[1, 2, 5], [3, -100, -100]], 2))


class SelectsActivations(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        return h.masked_select(h > 0).sum()


def test_a_selection_by_an_activation_is_still_refused_with_its_line():
    """A mask computed from activations has no value to guard before the model runs: the
    capture refuses it as any value-dependent size, naming the line."""
    with pytest.raises(GraphCaptureError) as info:
        hiremate.build_graph(SelectsActivations().double(),
                             torch.randn(4, 6, dtype=torch.float64),
                             cost_model="flops")
    reason = info.value.attempts["make_fx"]
    assert "size depends on tensor values" in reason
    assert "return h.masked_select(h > 0).sum()" in reason


class ScalarWriteBranch(nn.Module):
    """Longformer's pattern: an input mask is written with a Python scalar (traced as a tensor
    constant of the program) and a branch asks whether any entry is positive."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, mask):
        scores = mask.to(x.dtype)
        scores[mask == 2] = torch.finfo(x.dtype).max
        if (scores > 0).any().item():
            return self.lin(x).tanh() * 2
        return self.lin(x).tanh()


def test_a_guard_that_reads_a_constant_of_the_program_is_recorded_by_value():
    """The guard's ops were recorded while the tracer ran, so reading the constant's value
    was traced into the program (a ``KeyError`` on ``_tensor_constant0_1`` in the grouping)
    and stored as a symbolic float (not JSON); they are now recorded outside every mode."""
    torch.manual_seed(0)
    model = ScalarWriteBranch().double()
    sample = (torch.randn(4, 8, dtype=torch.float64), torch.tensor([0, 2, 1, 0]))
    wrapped = build(model, sample, 1.0)  # a tiny graph: the capture is what is checked
    assert_trains_as_eager(wrapped, model, sample)
    other = (torch.randn(4, 8, dtype=torch.float64), torch.tensor([0, 0, 0, 0]))
    assert_trains_as_eager(wrapped, model, other)  # the branch's other side: captured again


def test_an_internal_grouping_error_reaches_the_user_as_a_capture_error(monkeypatch):
    """Longformer's ``KeyError`` reached the user bare; an error of the grouping that is not
    hiremate's own now comes as a ``GraphCaptureError`` asking for a report, its cause
    chained."""
    import hiremate.graphbuilder.build as build_module

    def broken(cap):
        raise KeyError("_tensor_constant0_1")

    monkeypatch.setattr(build_module, "group_joint", broken)
    with pytest.raises(hiremate.GraphCaptureError, match="please report") as info:
        hiremate.build_graph(nn.Linear(4, 4), torch.randn(2, 4), cost_model="flops")
    assert isinstance(info.value.__cause__, KeyError)
