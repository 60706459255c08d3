"""``HRockmate(..., loss_fn=..., target=...)``: the loss captured into the graph and scheduled
with the model (hiremate.runtime.loss_step). A call returns the loss; targets are call
arguments, never frozen; gradients equal eager's; the measured step fits the budget."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hiremate
from hiremate import HRockmate, zoo
from hiremate.errors import ConfigError, InputMismatchError
from hiremate.runtime.loss_step import outside_tensors

FAST = {"progress": False, "n_jobs": 1, "cache": False, "calibrate": 0,
        "solver_params": {"hilp": {"time_limit": 2.0}, "rk-rotor": {"slots": 100}}}


def classifier(classes: int = 96) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(16, 128), nn.GELU()]
    for _ in range(4):
        layers += [nn.Linear(128, 128), nn.GELU()]
    layers.append(nn.Linear(128, classes))
    return nn.Sequential(*layers).double()


def batch(seed: int, n: int = 64, classes: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 16, dtype=torch.float64, generator=g),
            torch.randint(0, classes, (n,), generator=g))


def grads_close(model: nn.Module, eager: nn.Module) -> None:
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m: f"{name}: {m}")


def test_captured_loss_follows_each_calls_target_and_matches_eager() -> None:
    """The loss's nodes are in the graph, the call returns the scalar loss, and every call
    trains against its own target: a frozen sample target would give other losses and
    gradients from the second batch on."""
    model = classifier()
    eager = copy.deepcopy(model)
    x, y = batch(0)
    plain = hiremate.build_graph(model, x, cost_model="flops")
    remat = HRockmate(model, x, 0.6, loss_fn=F.cross_entropy, target=y, cost_model="flops",
                      **FAST)
    assert remat.report()["loss_captured"] and remat.report()["loss_bytes"] == 0
    assert len(remat.graph.nodes) > len(plain.nodes)  # log-softmax, nll and their backward
    assert remat.graph.tangent_bytes == 8  # the loss's gradient: one float64
    assert remat.report()["predicted_peak"] <= remat.report()["budget"]
    for seed in (1, 2, 3):
        x, y = batch(seed)
        loss = remat(x, target=y)
        assert loss.dim() == 0
        loss.backward()
        expected = F.cross_entropy(eager(x), y)
        expected.backward()
        torch.testing.assert_close(loss.detach(), expected.detach())
        grads_close(model, eager)
    with torch.no_grad():  # no backward can follow: the plain model and the loss
        torch.testing.assert_close(remat(x, target=y), F.cross_entropy(eager(x), y))


def test_captured_loss_reaches_budgets_a_reserved_loss_cannot() -> None:
    """With a wide output (1,024 classes) the loss holds the step's largest tensors. Reserved
    outside the schedule (measured, or the two-tensor estimate), they cannot be freed; captured,
    the logits and log-softmax are freed and recomputed like any other activation. At 0.6 of
    eager's measured step only the captured loss fits, and its measured step, calibration
    off, is within its budget; at 0.8 the estimate's measured step fits too."""
    model = classifier(classes=1024)
    x, y = batch(0, n=256, classes=1024)

    def loss_of_y(out):
        return F.cross_entropy(out, y)

    eager = hiremate.measure(model, x, loss_fn=loss_of_y, repeats=1, warmup=1).peak
    budget = int(0.6 * eager)
    captured = HRockmate(model, x, budget, loss_fn=F.cross_entropy, target=y, **FAST)
    measured = hiremate.measure(captured, x, target=y, repeats=1, warmup=0).peak
    assert measured <= budget * 1.02, (measured, budget)
    assert measured <= captured.report()["predicted_peak"] * 1.02 + 4096
    for outside in ({}, {"loss_fn": loss_of_y, "capture_loss": False}):
        with pytest.raises(hiremate.InfeasibleBudgetError):
            HRockmate(model, x, budget, **outside, **FAST)
    budget = int(0.8 * eager)
    estimated = HRockmate(model, x, budget, **FAST)
    measured = hiremate.measure(estimated, x, loss_fn=loss_of_y, repeats=1, warmup=0).peak
    assert measured <= budget * 1.02, (measured, budget)


def test_hugging_face_causal_lm_with_cross_entropy_on_its_logits() -> None:
    """A Hugging Face model (keyword inputs, a ModelOutput, use_cache switched off) with the
    loss written outside it: same loss and gradients as eager at two batches."""
    model, sample = zoo.get("gpt2", layers=2, width=32, dtype=torch.float64)
    eager = copy.deepcopy(model)

    def lm_loss(out, labels):
        return F.cross_entropy(out.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())

    # a small menu grid and no polish: the loss's capture is what is checked, not the solve
    remat = HRockmate(model, sample, 0.6, loss_fn=lm_loss, target=sample["input_ids"], **FAST,
                      menu_peaks=3, menu_saves=1, polish=[])
    for seed in (5, 6):
        ids = torch.randint(0, 512, sample["input_ids"].shape,
                            generator=torch.Generator().manual_seed(seed))
        labels = ids.roll(1, dims=1)
        loss = remat(input_ids=ids, target=labels)
        loss.backward()
        expected = lm_loss(eager(input_ids=ids), labels)
        expected.backward()
        torch.testing.assert_close(loss.detach(), expected.detach())
        grads_close(model, eager)


def test_loss_without_target_and_new_shapes_recaptured() -> None:
    """A loss of the output alone takes no target; a batch of another size is captured and
    solved again with the loss."""
    model = classifier()
    eager = copy.deepcopy(model)
    x, _ = batch(0)
    remat = HRockmate(model, x, 0.8, loss_fn=lambda out: out.pow(2).mean(), **FAST)
    x2, _ = batch(1, n=32)
    loss = remat(x2)
    loss.backward()
    eager(x2).pow(2).mean().backward()
    assert remat.recaptures == 1
    grads_close(model, eager)


def test_loss_module_with_class_weights_and_label_smoothing() -> None:
    """A loss that is a module: its class weights are a buffer, captured as one (not frozen
    from outside); label smoothing and weights give eager's loss and gradients."""
    model = classifier()
    eager = copy.deepcopy(model)
    x, y = batch(0)
    weights = torch.linspace(0.5, 2.0, 96, dtype=torch.float64)
    loss_fn = nn.CrossEntropyLoss(weight=weights, label_smoothing=0.1)
    remat = HRockmate(model, x, 0.8, loss_fn=loss_fn, target=y, **FAST)
    x, y = batch(7)
    loss = remat(x, target=y)
    loss.backward()
    expected = loss_fn(eager(x), y)
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach())
    grads_close(model, eager)
    assert "loss_fn.weight" in remat.graph.meta["buffer_names"]


def test_captured_loss_round_trips_through_save(tmp_path) -> None:
    model = classifier()
    x, y = batch(0)
    remat = HRockmate(model, x, 0.8, loss_fn=F.cross_entropy, target=y, **FAST)
    remat.save(tmp_path / "m.json")
    with pytest.raises(ConfigError, match="same loss_fn"):
        HRockmate.load(model, tmp_path / "m.json")
    loaded = HRockmate.load(model, tmp_path / "m.json", loss_fn=F.cross_entropy)
    assert loaded.schedule == remat.schedule
    torch.testing.assert_close(loaded(x, target=y), remat(x, target=y))


def test_mistakes_are_told() -> None:
    model = classifier()
    x, y = batch(0)
    with pytest.raises(ConfigError, match="freeze"):
        HRockmate(model, x, 0.8, loss_fn=lambda out: F.cross_entropy(out, y), **FAST)
    with pytest.raises(ConfigError, match="freeze"):
        HRockmate(model, x, 0.8, loss_fn=functools.partial(F.cross_entropy, target=y), **FAST)
    with pytest.raises(ConfigError, match="target"):
        HRockmate(model, x, 0.8, target=y, **FAST)
    with pytest.raises(ConfigError, match="scalar"):
        HRockmate(model, x, 0.8, loss_fn=lambda out, t: F.cross_entropy(out, t, reduction="none"),
                  target=y, **FAST)
    remat = HRockmate(model, x, 0.8, loss_fn=F.cross_entropy, target=y, **FAST)
    with pytest.raises(InputMismatchError, match="target="):
        remat(x)
    graph = hiremate.build_graph(model, x, cost_model="flops")
    with pytest.raises(ConfigError, match="capture_loss=False"):
        HRockmate.from_graph(model, graph, 0.8, loss_fn=F.cross_entropy, **FAST)

    class TakesTarget(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 96).double()

        def forward(self, x, target=None):
            return self.lin(x)

    with pytest.raises(ConfigError, match="'target' argument"):
        HRockmate(TakesTarget(), x, 0.8, loss_fn=F.cross_entropy, target=y, **FAST)


def test_outside_tensors_tells_constants_from_arguments() -> None:
    w = torch.ones(3)
    assert outside_tensors(lambda out, t: F.cross_entropy(out, t)) == set()
    assert outside_tensors(lambda out, t: F.cross_entropy(out, t, weight=w)) == {"w"}
    assert outside_tensors(nn.CrossEntropyLoss(weight=w)) == set()  # a buffer: traced as one
    loss = nn.MSELoss()
    loss.scale = w  # a plain attribute, not a buffer: it would be frozen
    assert outside_tensors(loss) == {"scale"}
    assert outside_tensors(F.cross_entropy) == set()
