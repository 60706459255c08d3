"""A model that returns its loss beside its logits (a Hugging Face model given labels) is
trained from the loss: the wrapper captures it so (config ``output_gradients``), without an
output-sized zero gradient for the logits that eager PyTorch never makes, and a backward that
reaches the logits after all still gets eager's gradients (the call is captured, solved and
run again with every output differentiated)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from hiremate import HRockmate, build_graph
from hiremate.errors import (ConfigError, ExecutionError, InfeasibleBudgetError,
                             OutputGradientError)
from hiremate.ir.simulator import autodiff_schedule, replay_state_bytes, step_peak
from hiremate.runtime.executor import RematModule
from hiremate.runtime.measurement import loss_of, measure
from test_model_untouched import one_thread  # noqa: F401 (an autouse fixture)

SOLVE = {"cache": False, "calibrate": 0, "cost_model": "flops"}


class LossAndLogits(nn.Module):
    """BatchNorm (buffers a forward writes), dropout (random draws a rerun must repeat) and a
    head whose logits are the largest activation, returned with the loss as a dict."""

    def __init__(self, classes: int = 256):
        super().__init__()
        self.embed = nn.Linear(16, 64)
        self.norm = nn.BatchNorm1d(64)
        self.drop = nn.Dropout(0.2)
        self.body = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.head = nn.Linear(64, classes)

    def forward(self, x, y):
        logits = self.head(self.body(self.drop(self.norm(self.embed(x)))))
        return {"loss": nn.functional.cross_entropy(logits, y), "logits": logits}


def _data():
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(64, 16, dtype=torch.float64, generator=gen),
            torch.randint(0, 256, (64,), generator=gen))


def _model():
    torch.manual_seed(0)
    return LossAndLogits().double()


def _same_step(wrapped, eager, loss, seed):
    """One step of each from the same generator state: loss, gradients, buffers and the
    generator state after it are eager's."""
    x, y = _data()
    ends = []
    for module in (wrapped, eager):
        module.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        out = module(x, y)
        loss(out).backward()
        ends.append((out["loss"].detach(), torch.get_rng_state()))
    assert torch.equal(ends[0][0], ends[1][0])
    assert torch.equal(ends[0][1], ends[1][1])
    for (name, p), q in zip(wrapped.named_parameters(), eager.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-12), name
    for b, c in zip(wrapped.buffers(), eager.buffers()):
        assert torch.equal(b, c)


def test_a_loss_beside_its_logits_is_what_the_backward_starts_from():
    model = _model()
    eager = copy.deepcopy(model)
    wrapped = HRockmate(model, _data(), 0.8, **SOLVE)
    every = HRockmate(copy.deepcopy(model), _data(), 0.8, output_gradients="all", **SOLVE)
    assert wrapped.graph.meta["untangented_outputs"] == [1]
    assert wrapped.graph.tangent_bytes == 8  # the loss's gradient, a float64 scalar
    assert "untangented_outputs" not in every.graph.meta
    logits = 64 * 256 * 8
    # the zero gradient of the logits is gone from the step, which keeps a generator state
    # instead, in case a backward reaches the logits after all
    saved = every.report()["autodiff_peak"] - wrapped.report()["autodiff_peak"]
    assert saved >= logits - replay_state_bytes(wrapped.graph)
    for seed in range(2):
        _same_step(wrapped, eager, lambda out: out["loss"], seed)
    assert wrapped.rebuilds == 0


def test_a_backward_through_the_logits_gets_eager_gradients_and_rebuilds_once(caplog):
    model = _model()
    eager = copy.deepcopy(model)
    wrapped = HRockmate(model, _data(), 0.8, **SOLVE)
    with_logits = (lambda out: out["loss"] + out["logits"].pow(2).mean())
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        _same_step(wrapped, eager, with_logits, 0)
    assert [r for r in caplog.records if "besides its scalar ones" in r.getMessage()]
    assert wrapped.rebuilds == 1
    assert wrapped.hiremate_config.output_gradients == "all"
    assert "untangented_outputs" not in wrapped.graph.meta
    for seed, loss in ((1, with_logits), (2, lambda out: out["loss"])):
        _same_step(wrapped, eager, loss, seed)
    assert wrapped.rebuilds == 1


class Returns(nn.Module):
    """``LossAndLogits`` with its outputs in another form."""

    def __init__(self, form: str):
        super().__init__()
        self.inner, self.form = LossAndLogits(), form

    def forward(self, x, y):
        out = self.inner(x, y)
        if self.form == "tuple":
            return out["loss"], out["logits"]
        # a mixture of experts without labels: an auxiliary loss beside the logits
        return {"aux_loss": out["loss"], "logits": out["logits"]}


@pytest.mark.parametrize("form, untangented", [("tuple", [1]), ("aux-loss", None)])
def test_which_outputs_are_taken_to_get_no_gradient(form, untangented):
    graph = build_graph(Returns(form).double(), _data(), cost_model="flops",
                        output_gradients="scalars")
    assert graph.meta.get("untangented_outputs") == untangented


def test_two_calls_before_one_backward_through_the_logits_rebuild_once():
    """As a siamese or contrastive loss: both calls' backwards reach the logits."""
    model = _model()
    eager = copy.deepcopy(model)
    wrapped = HRockmate(model, _data(), 0.8, **SOLVE)
    x, y = _data()
    grads = []
    for module in (wrapped, eager):
        torch.manual_seed(0)
        a, b = module(x, y), module(x.flip(0), y)
        (a["loss"] + b["loss"] + (a["logits"] - b["logits"]).pow(2).mean()).backward()
        grads.append([p.grad for p in module.parameters()])
    for g, h in zip(*grads):
        assert torch.allclose(g, h, rtol=0, atol=1e-12)
    assert wrapped.rebuilds == 1


def test_a_loaded_module_rebuilds_as_the_saved_one_would(tmp_path):
    model = _model()
    eager = copy.deepcopy(model)
    HRockmate(model, _data(), 0.8, **SOLVE).save(tmp_path / "saved.json")
    loaded = HRockmate.load(model, tmp_path / "saved.json")
    assert loaded.graph.meta["untangented_outputs"] == [1]
    _same_step(loaded, eager, lambda out: out["loss"] + out["logits"].mean(), 0)
    assert loaded.rebuilds == 1


def test_the_rebuild_keeps_the_autocast_of_the_capture(caplog):
    """The backward runs outside the forward's autocast; the module captured again there is
    still the autocast's program, and serves the next calls under it."""
    torch.manual_seed(0)
    model = LossAndLogits()
    eager = copy.deepcopy(model)
    x, y = (t.float() if t.is_floating_point() else t for t in _data())

    def step(module, seed):
        module.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(x, y)
        (out["loss"] + out["logits"].float().pow(2).mean()).backward()
        return [p.grad for p in module.parameters()]

    with torch.autocast("cpu", dtype=torch.bfloat16):
        wrapped = HRockmate(model, (x, y), 0.8, **SOLVE)
    for seed in range(2):
        with caplog.at_level(logging.WARNING, logger="hiremate"):
            ours, theirs = step(wrapped, seed), step(eager, seed)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert wrapped.graph.meta["autocast"] == "bfloat16" and wrapped.rebuilds == 1
    assert not [r for r in caplog.records if "plain forward" in r.getMessage()]


def test_a_rebuild_that_cannot_fit_the_budget_says_why():
    """Bytes that fit the loss's backward but not one that also differentiates the logits."""
    wrapped = HRockmate(_model(), _data(), 600_000, **SOLVE)
    out = wrapped(*_data())
    with pytest.raises(InfeasibleBudgetError, match="besides the loss") as info:
        (out["loss"] + out["logits"].mean()).backward()
    assert info.value.min_budget > 600_000


def test_the_generator_states_kept_for_a_rerun_are_counted():
    """A call keeps its start's generator states (the model has dropout) until its backward,
    in case it must run again: the whole step's peak counts them, and the step fits."""
    wrapped = HRockmate(_model(), _data(), 0.8, **SOLVE)
    graph, schedule = wrapped.graph, wrapped.schedule
    assert replay_state_bytes(graph) == graph.meta["rng_state_bytes"] > 0
    assert step_peak(graph, schedule) >= (step_peak(graph, schedule, rng_states=False)
                                          + replay_state_bytes(graph))
    assert step_peak(graph, schedule) <= wrapped.report()["budget"]
    assert measure(wrapped, *_data()).peak <= 1.02 * wrapped.report()["budget"]


def test_a_bare_module_says_what_to_do():
    model = _model()
    graph = build_graph(model, _data(), cost_model="flops", output_gradients="scalars")
    module = RematModule(model, graph, autodiff_schedule(graph))
    out = module(*_data())
    with pytest.raises(OutputGradientError, match="output_gradients='all'") as info:
        out["logits"].sum().backward()
    assert isinstance(info.value, ExecutionError) and isinstance(info.value, RuntimeError)
    out = module(*_data())
    out["loss"].backward()  # the loss alone runs the schedule
    assert all(p.grad is not None for p in model.parameters())


def test_a_loss_applied_outside_keeps_every_output_differentiated():
    model = _model()
    wrapped = HRockmate(model, _data(), 0.9, loss_fn=lambda out: out["logits"].logsumexp(1).mean(),
                        capture_loss=False, **SOLVE)
    assert "untangented_outputs" not in wrapped.graph.meta


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="output_gradients"):
        HRockmate(_model(), _data(), 0.8, output_gradients="loss", **SOLVE)
    with pytest.raises(ConfigError, match="output_gradients"):
        build_graph(_model(), _data(), output_gradients="auto")


def test_the_measured_loss_is_the_scalar_output_when_there_is_one():
    scalar = torch.tensor(2.0, requires_grad=True)
    logits = torch.ones(3, 4, requires_grad=True)
    assert loss_of((scalar, logits)) is not None
    assert loss_of((scalar, logits)).item() == 2.0
    assert loss_of((logits,)).item() == 12.0
    # named outputs without a "loss" entry (an auxiliary loss beside the logits): all of them
    assert loss_of({"aux_loss": scalar, "logits": logits}).item() == 14.0


class ExpandedAndLabelled(nn.Module):
    """Outputs the capture must give back as they are: an expanded view (a row broadcast over
    columns, which overlaps itself) and, beside it, a string, an int and None."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        row = self.lin(x)[:, :1]
        return {"wide": row.expand(-1, 8), "name": "wide", "steps": 3, "none": None}


def test_an_expanded_output_and_a_string_beside_it_train_as_eager():
    """A string output was read as the name of a program value (``KeyError: 'wide'`` at the
    build); an expanded output's incoming gradient was copied into a tensor laid out like the
    output, which overlaps itself (a ``RuntimeError`` in the backward)."""
    torch.manual_seed(0)
    model = ExpandedAndLabelled().double()
    eager = copy.deepcopy(model)
    x = torch.randn(5, 8, dtype=torch.float64)
    weights = torch.arange(8, dtype=torch.float64)
    wrapped = HRockmate(model, x, 1.0, config={"cost_model": "flops"})
    out, ref = wrapped(x), eager(x)
    assert {k: v for k, v in out.items() if k != "wide"} == {"name": "wide", "steps": 3,
                                                               "none": None}
    (out["wide"] * weights).sum().backward()
    (ref["wide"] * weights).sum().backward()
    torch.testing.assert_close(out["wide"], ref["wide"], rtol=1e-12, atol=0)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-14)


class TwoHeads(nn.Module):
    """A transposed head beside a plain one: a loss on the plain one alone leaves the other's
    gradient None."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(6, 12), nn.Linear(12, 12)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return h, self.head(h).view(4, 3, 12).transpose(1, 2)


def test_an_unused_transposed_output_gets_a_zero_laid_out_as_the_trace_s():
    """The zero standing for an unused output's gradient was contiguous where the trace's
    tangent had the output's transposed strides, and the backward's view of it failed
    (Hugging Face PatchTST's prediction beside its loss, captured with every output
    differentiated)."""
    torch.manual_seed(0)
    model = TwoHeads().double()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    wrapped = HRockmate(model, x, 1.0, config={"cost_model": "flops"})
    assert wrapped.graph.meta.get("untangented_outputs") is None  # both outputs differentiated
    wrapped(x)[0].sum().backward()
    eager(x)[0].sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=0)
