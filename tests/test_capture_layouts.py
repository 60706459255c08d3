"""Where the traced program and the real one part ways: a write that functionalisation leaves
(``native_batch_norm``'s running statistics) into a value of the program, a view taken on a
fake layout that the real result does not have, a custom backward that runs autograd itself,
a trainable tensor that the trace meets as a constant. Each model trains as eager (under
schedules that recompute), or is refused by name."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

import hiremate
from hiremate.errors import GraphCaptureError
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


class _Reversible(torch.autograd.Function):
    """A layer that keeps no activations and recomputes itself in its backward, as Reformer's
    reversible layers do: the forward runs under no_grad, the backward differentiates the
    layer again by hand, reaching parameters it was not given."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        ctx.save_for_backward(x)
        return layer(x) + x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            out = ctx.layer(x) + x
            torch.autograd.backward(out, grad)
        return x.grad, None


class _RecomputesInBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre, self.layer, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.head(_Reversible.apply(self.pre(x), self.layer))


def test_a_backward_that_runs_autograd_itself_is_captured_by_export():
    """The make_fx path cannot hold the gradients such a backward adds as a side effect; it
    refuses it, naming the cause, and the export path, which traces the Function's forward as
    plain ops, captures the model: the step equals eager's."""
    torch.manual_seed(0)
    model = _RecomputesInBackward()
    sample = torch.randn(4, 6)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    assert graph.meta["capture_path"] == "export"
    _assert_same_training_step(model, sample, graph=graph)
    joint = importlib.import_module("hiremate.graphbuilder.capture")
    with pytest.raises(GraphCaptureError, match=r"runs autograd inside a backward"):
        with joint.capturing():
            joint._trace_joint(model, model, (sample,), {}, "make_fx", "all")


class _Unregistered(nn.Module):
    """A layer kept out of the module tree (``object.__setattr__``): its parameters are not the
    model's, so the capture meets them as constants of the program."""

    def __init__(self):
        super().__init__()
        object.__setattr__(self, "hidden", nn.Linear(6, 6))
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(x)))


def test_a_trainable_tensor_read_as_a_constant_is_refused():
    """Its gradient would be lost; Reformer's reversible layers read theirs this way too
    (before, a bare KeyError came out of the grouping)."""
    with pytest.raises(GraphCaptureError, match=r"trainable parameters where the capture "
                                                r"cannot see them"):
        hiremate.build_graph(_Unregistered(), torch.randn(4, 6), cost_model="flops")


class _CastsItsRouter(nn.Module):
    """Casts a submodule in every forward, as Switch Transformers' router does
    (``self.classifier = self.classifier.to(float32)``): a no-op once the dtype is right."""

    def __init__(self):
        super().__init__()
        self.router, self.head = nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        self.router = self.router.to(torch.float32)
        return self.head(torch.softmax(self.router(x), -1) * x)


def test_a_forward_that_casts_a_submodule_to_its_own_dtype_trains_as_eager():
    """On traced parameters even that no-op failed in torch ("Couldn't swap Linear.weight")."""
    torch.manual_seed(0)
    model, sample = _CastsItsRouter(), torch.randn(4, 6)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    _assert_same_training_step(model, sample, schedule=schedules_of(graph)["keep-none"],
                               graph=graph)


def test_a_forward_that_converts_a_submodule_is_refused_by_name():
    with pytest.raises(GraphCaptureError, match=r"converts its own submodule 'router' to "
                                                r"torch\.float32"):
        hiremate.build_graph(_CastsItsRouter().double(), torch.randn(4, 6, dtype=torch.float64),
                             cost_model="flops")


class PhysicsInformed(nn.Module):
    """A physics-informed network's residual: the output's derivative by the input, taken
    inside the forward with ``create_graph=True``, so the training step differentiates twice."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(2, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        x = x.detach().requires_grad_(True)
        u = self.out(torch.tanh(self.hidden(x)))
        du, = torch.autograd.grad(u.sum(), x, create_graph=True)
        return du.pow(2).sum(-1) - u.squeeze(-1)


@pytest.mark.parametrize("schedule", ["autodiff", "keep-none"])
def test_a_forward_that_differentiates_inside_itself_trains_as_eager(schedule):
    """The wrapper read the output's structure from a run without autograd, where the
    forward's own ``autograd.grad`` failed ("element 0 of tensors does not require grad")."""
    torch.manual_seed(0)
    model = PhysicsInformed().double()
    sample = torch.randn(10, 2, dtype=torch.float64)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    _assert_same_training_step(model, sample, schedule=schedules_of(graph)[schedule],
                               graph=graph)
    wrapped = hiremate.HRockmate(model, sample, 0.98, config={"cost_model": "flops"})
    assert wrapped(sample).shape == (10,)
