"""A model changed after its wrapper was built: a module replaced (a new head for
fine-tuning), one with other settings, parameters of other shapes. The captured program is
then not the model's; the wrapper must notice (:mod:`hiremate.runtime.structure`) rather than
run the old program or the old module's parameters. Outputs and gradients against eager's."""

from __future__ import annotations

import copy
import io
import json
import pickle

import pytest
import torch
from torch import nn

from hiremate import HRockmate
from hiremate.errors import InvalidGraphError, ModelChangedError
from hiremate.ir.simulator import autodiff_schedule
from hiremate.runtime import structure
from hiremate.runtime.executor import RematModule
from test_model_untouched import assert_grads_match


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 24), nn.GELU(),
                         nn.Linear(24, 5)).double()


def _same_step(wrapped: nn.Module, model: nn.Module, x: torch.Tensor) -> None:
    """One step of the wrapper and of eager on a copy of the model as it is now."""
    eager = copy.deepcopy(model)
    for m in (wrapped, eager):
        m.zero_grad(set_to_none=True)
    out = wrapped(x)
    out.square().sum().backward()
    expected = eager(x)
    expected.square().sum().backward()
    assert torch.equal(out, expected)
    assert_grads_match(wrapped, eager)


@pytest.fixture
def x() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(6, 12, dtype=torch.float64)


def test_a_head_replaced_by_one_of_the_same_shape_is_read_from_its_new_owner(x):
    model = _net()
    wrapped = HRockmate(model, x, 1.0, calibrate=0)
    model[4] = nn.Linear(24, 5).double()  # before: the old head's parameters ran, silently
    _same_step(wrapped, model, x)
    assert wrapped.rebuilds == 0 and wrapped.recaptures == 0


@pytest.mark.parametrize("change", ["other shape", "other setting", "inserted", "removed"])
def test_a_changed_model_is_captured_again(x, change):
    model = _net()
    wrapped = HRockmate(model, x, 1.0, calibrate=0)
    if change == "other shape":
        model[4] = nn.Linear(24, 3).double()
    elif change == "other setting":
        model[1] = nn.GELU(approximate="tanh")  # same shapes, another program
    elif change == "inserted":  # Sequential.insert registers nothing: seen by its length
        model.insert(2, nn.Linear(24, 24).double())
    else:
        del model[3]
    _same_step(wrapped, model, x)
    _same_step(wrapped, model, x)
    assert wrapped.rebuilds == 1
    assert wrapped.schedule == wrapped.executor.schedule


def test_the_executor_alone_refuses_a_changed_model(x):
    model = _net()
    wrapped = HRockmate(model, x, 1.0, calibrate=0)
    module = RematModule(model, wrapped.graph, autodiff_schedule(wrapped.graph))
    model[4] = nn.Linear(24, 3).double()
    with pytest.raises(ModelChangedError, match=r"modules changed: '4'.*parameter '4.weight' "
                                                r"\(5, 24\) -> \(3, 24\)"):
        module(x)


def test_nothing_registered_costs_no_walk(x, monkeypatch):
    """A call looks at the model only when some module registered something since its last
    look; a pickled module looks once after loading (another process counts anew)."""
    model = _net()
    wrapped = HRockmate(model, x, 1.0, calibrate=0)
    module = wrapped.executor
    module(x)
    walks = []
    real = structure.fingerprint
    monkeypatch.setattr(structure, "fingerprint", lambda m: walks.append(1) or real(m))
    module(x)
    module(x)
    assert walks == []
    nn.Linear(2, 2)  # any registration anywhere: the next call looks once
    module(x)
    module(x)
    assert walks == [1]
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded(x)
    assert walks == [1, 1]
    assert pickle.loads(pickle.dumps(module))._watch._generation == -1


def test_a_saved_schedule_loads_only_on_the_model_it_was_saved_for(x, tmp_path, caplog):
    """``HRockmate.load`` on a model of another architecture ran the saved program: with
    another activation, or a layer more, silently other outputs than the model's."""
    model = _net()
    path = tmp_path / "saved.json"
    HRockmate(model, x, 1.0, calibrate=0).save(path)
    same = _net()
    _same_step(HRockmate.load(same, path), same, x)
    other_activation = _net()
    other_activation[1] = nn.ReLU()
    longer = nn.Sequential(*_net(), nn.Tanh())
    for other, match in ((other_activation, "modules changed: '1'"),
                         (longer, "modules added: '5'"), (_net().float(), "float32")):
        with pytest.raises(InvalidGraphError, match=match):
            HRockmate.load(other, path)
    payload = json.loads(path.read_text())
    del payload["model"]  # a file saved before the model was recorded: loaded, with a warning
    path.write_text(json.dumps(payload))
    with caplog.at_level("WARNING", logger="hiremate"):
        HRockmate.load(_net(), path)
    assert any("does not record the model" in r.getMessage() for r in caplog.records
               if r.name.startswith("hiremate"))


def test_a_graph_of_another_model_is_refused(x):
    """``from_graph`` (and a bare ``RematModule``) given a graph captured from a model of other
    parameter shapes or dtypes: before, the program ran on this model's parameters."""
    import hiremate

    graph = hiremate.build_graph(_net(), x)
    HRockmate.from_graph(_net(), graph, 1.0)
    wider = nn.Sequential(nn.Linear(12, 30), nn.GELU(), nn.Linear(30, 24), nn.GELU(),
                          nn.Linear(24, 5)).double()
    for other, match in ((wider, r"'0.weight' is \(30, 12\) float64 but the graph was captured "
                                 r"with \(24, 12\) float64"), (_net().float(), "float32")):
        with pytest.raises(InvalidGraphError, match=match):
            HRockmate.from_graph(other, graph, 1.0)
        with pytest.raises(InvalidGraphError, match=match):
            RematModule(other, graph, autodiff_schedule(graph))


class _Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(12, 24)
        self.norm = nn.BatchNorm1d(24)
        self.drop = nn.Dropout(0.1)
        self.act = nn.LeakyReLU(0.1)
        self.outer = nn.Linear(24, 5)

    def forward(self, x):
        return self.outer(self.act(self.drop(self.norm(self.inner(x)))))


@pytest.mark.parametrize("setting", ["drop.p", "norm.momentum", "act.negative_slope"])
def test_a_setting_assigned_in_place_is_noticed(x, setting):
    """Dropout annealed by assigning ``p``, a BatchNorm's ``momentum`` changed: torch's modules
    declare such settings (``__constants__``) and a call compares them. Before, the old value
    ran: other dropout masks, other running statistics than eager's, silently."""
    model = _Normed().double()
    wrapped = HRockmate(model, x, 1.0, calibrate=0)
    owner, name = setting.split(".")
    setattr(getattr(model, owner), name, 0.5)
    eager = copy.deepcopy(model)
    for m in (wrapped, eager):
        m.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    out = wrapped(x)
    out.square().sum().backward()
    torch.manual_seed(3)
    expected = eager(x)
    expected.square().sum().backward()
    assert torch.equal(out, expected) and wrapped.rebuilds == 1
    assert_grads_match(wrapped, eager)
    assert torch.equal(model.norm.running_mean, eager.norm.running_mean)


class _SlicingStack(nn.Module):
    """A forward that registers modules at every call, as Hugging Face's Llama does when it
    slices its ``ModuleList`` of layers."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers[:2]:
            x = torch.tanh(layer(x))
        return x


def test_watching_a_model_does_not_make_other_compiled_models_recompile(x):
    """Once a wrapper watches a model, torch's registration hooks run for every module in the
    process. A compiled model whose forward registers modules must still compile once: were
    the hooks' counter traced, each call would recompile, and torch would soon fall back to
    eager (measured on the decision table's Llama: torch.compile's memory budget then did
    nothing)."""
    import torch._dynamo

    HRockmate(_net(), x, 1.0, cache=False, calibrate=0)  # installs the hooks
    assert structure._installed
    other, sample = _SlicingStack(), torch.randn(2, 4)
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    try:
        compiled = torch.compile(other, backend="eager")
        for _ in range(4):
            compiled(sample).sum().backward()
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 1
    finally:
        torch._dynamo.reset()
    before = structure.generation()
    other(sample)  # eager registrations are still counted
    assert structure.generation() > before
