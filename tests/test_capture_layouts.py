"""What the trace records otherwise than the real kernels run: a write that functionalisation
leaves (``native_batch_norm``'s running statistics) into a value of the program, and a view
taken on a fake layout that the real result does not have. Each model trains as eager under
schedules that recompute."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hiremate
from test_capture import _assert_same_training_step
from test_executor_util import schedules_of


class InstanceNormed(nn.Module):
    """Instance norms that keep running statistics: ``instance_norm`` passes repeats of the
    buffers to ``native_batch_norm``, which writes them in place (its schema does not say so),
    and averages them back into the buffers."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.norm = nn.InstanceNorm2d(6, affine=True, track_running_stats=True)
        self.norm1d = nn.InstanceNorm1d(6, track_running_stats=True)
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        return self.head(torch.tanh(self.norm1d(h.flatten(2))))


@pytest.mark.parametrize("schedule", ["autodiff", "keep-none", "keep-half"])
def test_instance_norm_with_running_statistics_trains_as_eager(schedule):
    """The write into another node's value was refused ("hiremate cannot yet recompute such
    writes"); now it goes into a clone in the writer's node, and a schedule that recomputes
    the norms leaves the same loss, gradients and running statistics as eager."""
    torch.manual_seed(0)
    model = InstanceNormed().double()
    sample = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    _assert_same_training_step(model, sample, schedule=schedules_of(graph)[schedule],
                               graph=graph)


class TransposedBatchNorm(nn.Module):
    """PatchTST's pattern: a BatchNorm over a transposed input, transposed back, then
    reshaped. CPU ``native_batch_norm`` returns a contiguous result where its fake tensor keeps
    the input's strides, so the trace records the reshape as a view that the real result
    cannot take (eager's reshape copies)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.norm(self.lin(x).transpose(1, 2)).transpose(1, 2)
        return self.head(h.reshape(h.shape[0], -1))


@pytest.mark.parametrize("schedule", ["autodiff", "keep-none"])
def test_a_view_that_the_real_layout_cannot_take_copies_as_eager_reshape_does(schedule):
    """The build's real run failed ("view size is not compatible with input tensor's size
    and stride"); now that view copies first, and the step equals eager's."""
    torch.manual_seed(0)
    model = TransposedBatchNorm().double()
    sample = torch.randn(3, 4, 8, dtype=torch.float64)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    targets = [op.target for node in graph.nodes for op in node.ops]
    assert "aten._unsafe_view.default" in targets
    _assert_same_training_step(model, sample, schedule=schedules_of(graph)[schedule],
                               graph=graph)
