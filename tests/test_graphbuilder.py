"""The graph builder on small models: structure, determinism, serialisation, capture errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import hiremate
from hiremate import DataKind, GraphCaptureError, NodeKind, autodiff_schedule, simulate
from hiremate.ir.graph import Graph


class Block(nn.Module):
    def __init__(self, width: int = 8, p: float = 0.0):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        y = self.lin(x).view(x.shape[0], -1)
        return self.drop(torch.relu(self.norm(y))) + y


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:  # a branch on an activation: no capture path can trace it
            return y * 2
        return y


def test_structure_of_a_small_block():
    torch.manual_seed(0)
    g = hiremate.build_graph(Block(), torch.randn(4, 8), cost_model="flops")
    kinds = [n.kind for n in g.nodes]
    loss = kinds.index(NodeKind.LOSS)
    assert all(k is NodeKind.FWD for k in kinds[:loss])
    assert all(k is NodeKind.BWD for k in kinds[loss + 1:])
    # four parameters need grad: linear weight/bias, batchnorm weight/bias
    assert sum(d.kind is DataKind.PARAM for d in g.data) == 4
    assert sum(d.kind is DataKind.PARAM_GRAD for d in g.data) == 4
    # the input needs no grad: no input gradient, and no backward node exists only for it
    assert not any(d.kind is DataKind.INPUT_GRAD for d in g.data)
    # the view joins the linear node: no data node of its own
    names = {d.name for d in g.data}
    assert all(not n.startswith("view") for n in names)
    # BatchNorm's buffer writes are recorded
    assert "norm.running_mean" in g.meta["mutated_buffers"]
    assert any("norm.num_batches_tracked" in n.mutates for n in g.nodes)
    # every forward node that produces something needed later has a backward partner
    lin = next(n for n in g.fwd_nodes if any(o.target == "aten.addmm.default" for o in n.ops))
    assert lin.partner is not None and g.nodes[lin.partner].is_bwd
    sim = simulate(g, autodiff_schedule(g))
    assert sim.valid, sim.error


def test_dropout_is_a_random_node():
    g = hiremate.build_graph(Block(p=0.5), torch.randn(4, 8), cost_model="flops")
    assert any(n.random for n in g.fwd_nodes)


def test_input_gradient_when_the_input_requires_grad():
    x = torch.randn(4, 8, requires_grad=True)
    g = hiremate.build_graph(Block(), x, cost_model="flops")
    grads = [d for d in g.data if d.kind is DataKind.INPUT_GRAD]
    assert len(grads) == 1 and grads[0].shape == (4, 8)


def test_tied_weights_appear_once():
    g = hiremate.build_graph(Tied(), torch.randint(0, 16, (3, 5)), cost_model="flops")
    params = [d for d in g.data if d.kind is DataKind.PARAM]
    assert len(params) == 1
    assert len([d for d in g.data if d.kind is DataKind.PARAM_GRAD]) == 1
    assert len(g.meta["param_names"]) == 1


@pytest.mark.parametrize("form", ["tensor", "tuple", "dict"])
def test_sample_forms(form):
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x, y=None):
            return self.a(x) * (1 if y is None else y)

    x, y = torch.randn(2, 4), torch.randn(2, 4)
    sample = {"tensor": x, "tuple": (x, y), "dict": {"x": x, "y": y}}[form]
    g = hiremate.build_graph(Two(), sample, cost_model="flops")
    n_inputs = sum(d.kind is DataKind.INPUT for d in g.data)
    assert n_inputs == (1 if form == "tensor" else 2)


def test_deterministic_and_serialisable(tmp_path):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(4, 8)
    a = hiremate.build_graph(model, x, cost_model="flops")
    b = hiremate.build_graph(model, x, cost_model="flops")
    assert a.dumps() == b.dumps()
    path = tmp_path / "g.json"
    a.save(path)
    assert Graph.load(path) == a


def test_measured_costs_are_positive_and_model_unchanged():
    torch.manual_seed(0)
    model, x = Block(), torch.randn(16, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = hiremate.build_graph(model, x, cost_model="measured", repeats=2)
    assert g.meta["cost_model"] == "measured"
    assert all(n.time > 0 for n in g.nodes if not n.is_loss and n.ops)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"building the graph changed {k}"


def test_capture_error_names_every_path():
    with pytest.raises(GraphCaptureError) as info:
        hiremate.build_graph(DataDependent(), torch.randn(2, 4), cost_model="flops")
    assert set(info.value.attempts) == {"make_fx", "export"}
    message = str(info.value)
    assert "make_fx" in message and "export" in message
    # the make_fx path's own reason: the op asked for its value, the model's line, the cause
    reason = info.value.attempts["make_fx"]
    assert "aten.gt.Scalar" in reason and "activation" in reason
    assert "test_graphbuilder.py:44 (if y.sum() > 0:" in reason


def test_bad_arguments_raise_hiremate_errors():
    with pytest.raises(hiremate.ConfigError):
        hiremate.build_graph(lambda x: x, torch.randn(2))
    with pytest.raises(hiremate.ConfigError):
        hiremate.build_graph(Block(), torch.randn(4, 8), cost_model="guess")
