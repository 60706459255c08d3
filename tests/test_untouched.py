"""``writes_undone``: the build's real runs of the user's forward put back what it wrote into
parameters and inputs, values and version counters, and copy only what is written."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torch import nn

import hiremate
from hiremate.errors import GraphCaptureError
from hiremate.graphbuilder.untouched import _CopyOnWrite, writes_undone
from hiremate.runtime.executor import RematModule
from test_capture import WritesItsInput
from test_executor_schedules import recomputing_schedules


def test_writes_through_views_and_data_are_put_back_and_only_written_tensors_copied() -> None:
    weight = torch.nn.Parameter(torch.randn(4, 3))
    batch, other = torch.randn(2, 3), torch.randn(5)
    kept = [t.detach().clone() for t in (weight, batch, other)]
    versions = [t._version for t in (weight, batch, other)]
    watch = _CopyOnWrite([weight, batch, other])
    with watch:
        with torch.no_grad():
            weight[1].mul_(3)  # through a view
            torch.embedding_renorm_(weight, torch.tensor([0, 2]), 0.1, 2.0)
        batch.div_(255)
        assert (other * 2).shape == (5,)  # read, not written
    assert sorted(len(v[1]) for v in watch.saved.values()) == [2, 4]  # the two written
    watch.restore()
    for t, k, v in zip((weight, batch, other), kept, versions):
        assert torch.equal(t, k) and t._version == v
    with writes_undone([batch]):
        batch.add_(1)
    assert torch.equal(batch, kept[1]) and batch._version == versions[1]


def test_with_nothing_to_watch_the_body_runs_without_the_mode(monkeypatch) -> None:
    """A higher-order op (``torch.cond``) has no rule for the watch's dispatch mode: the
    capture's probe runs again without the watch when the watched run raises, and an empty
    watch installs no mode."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    capture = importlib.import_module("hiremate.graphbuilder.capture")

    with writes_undone([]):
        assert _get_current_dispatch_mode() is None
    with writes_undone([torch.zeros(2)]):
        assert isinstance(_get_current_dispatch_mode(), _CopyOnWrite)
    real = capture.writes_undone
    watched = []

    def refusing(tensors):
        watched.append(len(tensors))
        if tensors:
            raise NotImplementedError("no rule for this mode")
        return real(tensors)

    monkeypatch.setattr(capture, "writes_undone", refusing)
    graph = hiremate.build_graph(nn.Linear(3, 2), torch.randn(4, 3), cost_model="flops")
    assert watched[:2] == [3, 0] and graph.nodes


class RenormalisedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8, max_norm=1.0)
        self.out = nn.Linear(8, 2)

    def forward(self, ids):
        return self.out(self.emb(ids)).sum()


def test_a_build_leaves_the_sample_and_the_parameters_as_they_were():
    """The build's real runs of the forward wrote into the user's batch (x.mul_(2) doubled it:
    the outputs' probe, the costs' run, the calibration's measured steps) and renormalised the
    embedding's rows before the capture refused that write."""
    x = torch.randn(2, 4)
    kept, version = x.clone(), x._version
    hiremate.HRockmate(WritesItsInput(), x, 1.0, config={"cost_model": "flops"})  # calibrates
    assert torch.equal(x, kept) and x._version == version
    lazy = WritesItsInput()
    lazy.a = nn.LazyLinear(4)  # initialised by one more real run of the forward, on the sample
    hiremate.HRockmate(lazy, x, 1.0, config={"cost_model": "flops"})
    assert torch.equal(x, kept) and x._version == version
    grad_input = x.clone().requires_grad_()
    with pytest.raises(GraphCaptureError, match="requires grad is being used in an in-place"):
        hiremate.HRockmate(WritesItsInput(), grad_input, 1.0, config={"cost_model": "flops"})
    torch.manual_seed(0)
    model = RenormalisedEmbedding()
    with torch.no_grad():
        model.emb.weight.mul_(5)  # rows above max_norm, which a forward renormalises
    weight, weight_version = model.emb.weight.detach().clone(), model.emb.weight._version
    hiremate.HRockmate(model, torch.randint(0, 50, (4, 6)), 1.0, config={"cost_model": "flops"})
    assert torch.equal(model.emb.weight, weight) and model.emb.weight._version == weight_version


@pytest.mark.parametrize("schedule", ["autodiff", "keep-none", "keep-half"])
def test_a_renormalising_embedding_trains_as_eager(schedule):
    """``nn.Embedding(max_norm=...)`` renormalises the rows it reads, in place, at every call:
    refused before, replayed now like a buffer's write (the recomputations reading the weight
    from before the write take a copy)."""
    torch.manual_seed(0)
    model = RenormalisedEmbedding().double()
    with torch.no_grad():
        model.emb.weight.mul_(5)
    eager = copy.deepcopy(model)
    ids = torch.randint(0, 50, (4, 6))
    graph = hiremate.build_graph(model, ids, cost_model="flops")
    chosen = {"autodiff": hiremate.autodiff_schedule(graph),
              **recomputing_schedules(graph)}[schedule]
    remat = RematModule(model, graph, chosen)
    steps = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    for k in range(2):
        batch = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(k))
        remat(batch).backward()
        eager(batch).backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=0)
        for opt in steps:
            opt.step()
            opt.zero_grad()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=0)
