"""Calls with other input shapes than the sample's: captured and solved again once per shape
(config ``on_new_inputs: recapture``), at most ``max_shapes`` kept, the budget resolved again,
the model left untouched; outputs and gradients compared with eager PyTorch's."""

from __future__ import annotations

import collections
import copy
import logging
import math

import pytest
import torch
from torch import nn

import hiremate
from hiremate import HRockmate
from hiremate.ir.budget import autodiff_peak
from hiremate.config import load_config
from hiremate.errors import ConfigError, InputMismatchError
from hiremate.ir.simulator import autodiff_schedule, step_peak
from test_model_untouched import CONV, FAST, ConvNet, assert_grads_match
from test_model_untouched import one_thread  # noqa: F401 (an autouse fixture)


def whole_step(variant: dict) -> int:
    """The reference of a variant's fractional budget: its whole step's autodiff peak (the
    loss's memory and the output gradients autograd holds included)."""
    graph = variant["module"].graph
    return step_peak(graph, autodiff_schedule(graph), variant["report"]["loss_bytes"])


def step(module: nn.Module, params: nn.Module, x: torch.Tensor, seed: int):
    """One forward+backward from a fixed RNG state: loss, and the RNG state after it."""
    params.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = module(x).square().sum()
    loss.backward()
    return loss.detach(), torch.get_rng_state()


def compare_with_eager(h: HRockmate, model: nn.Module, eager: nn.Module, x: torch.Tensor,
                       seed: int) -> None:
    ours, rng_ours = step(h, model, x, seed)
    ref, rng_ref = step(eager, eager, x, seed)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=0)
    assert_grads_match(model, eager)
    # a re-capture in the call leaves buffers (BatchNorm's statistics) and the RNG as eager's
    for (name, b), c in zip(model.named_buffers(), eager.buffers()):
        torch.testing.assert_close(b, c, rtol=1e-12, atol=0, msg=name)
    assert torch.equal(rng_ours, rng_ref)


def test_new_batch_size_is_captured_once_with_the_fraction_resolved_again(caplog):
    torch.manual_seed(0)
    model = ConvNet().double()
    eager = copy.deepcopy(model)
    x4 = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    x6 = torch.randn(6, 3, 8, 8, dtype=torch.float64)
    h = HRockmate(model, x4, 0.5, **CONV)  # calibrate: 2 (default), on the re-capture too
    with caplog.at_level(logging.INFO, logger="hiremate.api"):
        for seed in (1, 2):
            compare_with_eager(h, model, eager, x6, seed)
    assert h.recaptures == 1
    assert sum("capturing and solving for these inputs" in r.getMessage()
               for r in caplog.records) == 1
    (variant,) = h.variants()
    assert variant["inputs"] == [("[0][0]", (6, 3, 8, 8), "float64")]
    # the budget keeps its meaning: half of the new shape's autodiff peak
    report = variant["report"]
    new_peak = autodiff_peak(variant["module"].graph)
    assert new_peak > autodiff_peak(h.graph)
    assert report["budget"] == math.floor(0.5 * whole_step(variant)) != h.report()["budget"]
    assert report["predicted_peak"] <= report["budget"]
    assert report["calibration"]
    # the sample's shape still runs its own schedule, with no new capture
    compare_with_eager(h, model, eager, x4, 3)
    assert h.recaptures == 1


def steps_at_two_threads(h: HRockmate, model: nn.Module, eager: nn.Module, x: torch.Tensor,
                         caplog, level: int, logger: str) -> None:
    """Two steps at two intra-op threads (the module was built at one, the autouse fixture's
    count, restored after), each compared with eager's; ``logger``'s records at ``level``
    captured."""
    try:
        torch.set_num_threads(2)
        with caplog.at_level(level, logger=logger):
            for seed in (1, 2):
                compare_with_eager(h, model, eager, x, seed)
    finally:
        torch.set_num_threads(1)


def test_a_step_at_another_cpu_thread_count_is_built_for_it(caplog):
    """CPU convolutions take scratch of another size at another intra-op thread count, so a
    training step at another count than the build's is captured and solved at that count,
    once, as new inputs are; the build's count keeps the sample's module."""
    torch.manual_seed(0)
    model = ConvNet().double()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    # built at one thread (the autouse fixture); the recapture is what is checked, so no
    # calibration's re-solves, and FLOP costs (the roofline would be fitted at two threads)
    h = HRockmate(model, x, 0.5, **{**CONV, "calibrate": 0, "cost_model": "flops"})
    assert h.graph.meta["cpu_threads"] == 1
    steps_at_two_threads(h, model, eager, x, caplog, logging.INFO, "hiremate.api")
    assert h.recaptures == 1
    assert sum("built at 1 intra-op threads and the step runs at 2" in r.getMessage()
               for r in caplog.records) == 1
    (variant,) = h.variants()
    assert variant["cpu_threads"] == 2 and variant["module"].graph.meta["cpu_threads"] == 2
    assert variant["inputs"] == [("[0][0]", (4, 3, 8, 8), "float64")]
    assert variant["report"]["predicted_peak"] <= variant["report"]["budget"]
    compare_with_eager(h, model, eager, x, 3)  # back at the build's count: no new capture
    assert h.recaptures == 1


def test_with_on_new_inputs_raise_another_thread_count_runs_after_a_warning(caplog):
    """``on_new_inputs: raise`` builds nothing after the wrapper: a step at another thread
    count runs the build's schedule, warned about once, with eager's gradients."""
    torch.manual_seed(0)
    model = MLP().double()
    eager = copy.deepcopy(model)
    (x,) = mlp_inputs(4)
    h = HRockmate(model, x, 1.0, on_new_inputs="raise", calibrate=0, **FAST)
    steps_at_two_threads(h, model, eager, x, caplog, logging.WARNING, "hiremate.runtime.executor")
    assert h.recaptures == 0 and h.variants() == []
    assert sum("built at 1 intra-op threads and runs at 2" in r.getMessage()
               for r in caplog.records) == 1


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 32),
                                 nn.Tanh(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


def mlp_inputs(*batches: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randn(b, 8, generator=gen, dtype=torch.float64) for b in batches]


def test_max_shapes_evicts_the_least_recently_used_and_bytes_stay_bytes(caplog):
    torch.manual_seed(0)
    model = MLP().double()
    eager = copy.deepcopy(model)
    x3, x5, x6 = mlp_inputs(3, 5, 6)
    budget = 10**8  # bytes: the same number at every shape
    h = HRockmate(model, x3, budget, max_shapes=1, calibrate=0, **FAST)
    with caplog.at_level(logging.INFO, logger="hiremate.runtime.executor"):
        compare_with_eager(h, model, eager, x5, 1)
        compare_with_eager(h, model, eager, x5, 2)
        assert h.recaptures == 1
        compare_with_eager(h, model, eager, x6, 3)  # beyond max_shapes=1: x5's is evicted
        assert h.recaptures == 2
        assert [v["inputs"][0][1] for v in h.variants()] == [(6, 8)]
        assert any("evicted" in r.getMessage() for r in caplog.records)
        assert not any(r.levelno >= logging.WARNING and r.name.startswith("hiremate")
                       for r in caplog.records)
        compare_with_eager(h, model, eager, x5, 4)  # captured again: shapes come in turn
        assert h.recaptures == 3
        assert [v["inputs"][0][1] for v in h.variants()] == [(5, 8)]
        compare_with_eager(h, model, eager, x6, 5)
        assert h.recaptures == 4
    thrashing = [r for r in caplog.records
                 if r.levelno == logging.WARNING and "max_shapes" in r.getMessage()]
    assert len(thrashing) == 1  # once, however often they come back
    assert h.variants()[0]["report"]["budget"] == budget == h.report()["budget"]
    compare_with_eager(h, model, eager, x3, 6)
    assert h.recaptures == 4


def test_least_recently_used_is_evicted_not_the_oldest():
    torch.manual_seed(0)
    model = MLP().double()
    x3, x4, x5, x6 = mlp_inputs(3, 4, 5, 6)
    h = HRockmate(model, x3, 1.0, max_shapes=2, calibrate=0, **FAST)
    for x in (x4, x5, x4, x6):  # x4 used again after x5: x5 is the least recently used
        h(x)
    assert h.recaptures == 3
    assert [v["inputs"][0][1] for v in h.variants()] == [(4, 8), (6, 8)]
    # a copy keeps each variant with its report
    copied = copy.deepcopy(h)
    assert [v["report"]["budget"] for v in copied.variants()] == [
        v["report"]["budget"] for v in h.variants()]
    assert all(v["module"].model is copied.executor.model for v in copied.variants())


def test_saved_fraction_is_resolved_again_after_load(tmp_path):
    torch.manual_seed(0)
    model = MLP().double()
    x3, x7 = mlp_inputs(3, 7)
    h = HRockmate(model, x3, 0.9, calibrate=0, **FAST)
    h.save(tmp_path / "h.json")
    loaded = HRockmate.load(model, tmp_path / "h.json")
    eager = copy.deepcopy(model)
    compare_with_eager(loaded, model, eager, x7, 1)
    (variant,) = loaded.variants()
    assert variant["report"]["budget"] == math.floor(0.9 * whole_step(variant))


def test_on_new_inputs_raise_keeps_the_error():
    torch.manual_seed(0)
    model = MLP().double()
    x3, x5 = mlp_inputs(3, 5)
    h = HRockmate(model, x3, 1.0, on_new_inputs="raise", calibrate=0, **FAST)
    with pytest.raises(InputMismatchError, match=r"shape \(5, 8\) instead of \(3, 8\)"):
        h(x5)
    assert h.recaptures == 0


@pytest.mark.parametrize("overrides, message", [
    ({"on_new_inputs": "ignore"}, "on_new_inputs must be one of 'recapture', 'raise'"),
    ({"max_shapes": 0}, "max_shapes must be a positive integer"),
    ({"max_shapes": True}, "max_shapes must be a positive integer"),
])
def test_new_input_keys_are_validated(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("hiremate", **overrides)


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_new_shape_first_seen_without_grad_then_trains(context):
    """A first call with a new shape under no_grad / inference_mode runs the model's plain
    forward (no backward can follow: nothing is captured); the first training call at that
    shape captures it, once."""
    torch.manual_seed(0)
    model = MLP().double()
    eager = copy.deepcopy(model)
    x3, x5 = mlp_inputs(3, 5)
    h = HRockmate(model, x3, 1.0, calibrate=0, **FAST)
    with context():
        torch.manual_seed(1)
        ours = h(x5)
        torch.manual_seed(1)
        ref = eager(x5)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=0)
    assert h.recaptures == 0
    compare_with_eager(h, model, eager, x5, 2)
    assert h.recaptures == 1
    compare_with_eager(h, model, eager, x5, 3)
    assert h.recaptures == 1


class Embedded(nn.Module):
    """An embedding, a trunk, a head: a user wraps the trunk alone, from a plain sample."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(50, 16)
        self.trunk = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(16, 16), nn.GELU())])
        self.head = nn.Linear(16, 50)

    def forward(self, ids):
        return self.head(self.trunk(self.embedding(ids)))


@pytest.mark.parametrize("on_new_inputs", ["recapture", "raise"])
def test_a_wrapped_submodule_whose_input_needs_a_gradient(on_new_inputs):
    """The trunk's sample needs no gradient, its input in the model does (the embedding's):
    captured and solved again for it, so the embedding gets eager's gradient; under
    ``on_new_inputs='raise'`` (and for a bare executor) the mismatch is an error."""
    torch.manual_seed(0)
    model = Embedded().double()
    eager = copy.deepcopy(model)
    ids = torch.randint(0, 50, (8, 12))
    model.trunk = HRockmate(model.trunk, torch.randn(8, 12, 16, dtype=torch.float64), 0.6,
                            calibrate=0, on_new_inputs=on_new_inputs)
    if on_new_inputs == "raise":
        with pytest.raises(InputMismatchError, match="requires grad"):
            model(ids)
        return
    for _ in range(2):
        for m in (model, eager):
            m.zero_grad(set_to_none=True)
            m(ids).square().sum().backward()
        for a, b in zip(model.parameters(), eager.parameters()):
            assert torch.equal(a.grad, b.grad)
    assert model.trunk.recaptures == 1
    with torch.no_grad():  # no gradient can be asked for: the sample's module serves
        assert torch.equal(model(ids), eager(ids))
    assert model.trunk.recaptures == 1


class Scaled(nn.Module):
    """Plain constants among the arguments: ``scale`` is part of the computation, ``step`` (a
    counter passed along, as training loops do) is not."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))

    def forward(self, x, step=0, scale=1.0):
        return self.layers(x) * scale


def test_a_constant_argument_with_another_value_is_not_run_with_the_samples():
    """The capture bakes ``scale`` into the program: a call with another value used to return
    the sample's result silently. Now it is captured again (and that module reused for the
    value); ``step`` gives the same program, so after one capture it is no longer checked."""
    torch.manual_seed(0)
    model = Scaled().double()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 8, dtype=torch.float64)
    h = HRockmate(model, {"x": x, "step": 0, "scale": 2.0}, 1.0, calibrate=0, **FAST)
    for step in range(1, 4):
        assert torch.equal(h(x=x, step=step, scale=2.0), eager(x=x, step=step, scale=2.0))
    assert h.recaptures == 1
    for scale in (3.0, 2.0, 3.0, 2.0):
        assert torch.equal(h(x=x, step=7, scale=scale), eager(x=x, step=7, scale=scale))
    assert h.recaptures == 2


def test_the_executor_alone_refuses_another_constant():
    from hiremate.runtime.executor import RematModule

    torch.manual_seed(0)
    model = Scaled().double()
    x = torch.randn(4, 8, dtype=torch.float64)
    graph = hiremate.build_graph(model, {"x": x, "scale": 2.0}, cost_model="flops")
    module = RematModule(model, graph, autodiff_schedule(graph))
    module(x=x, scale=2.0)
    with pytest.raises(InputMismatchError, match=r"scale.*3\.0.*2\.0"):
        module(x=x, scale=3.0)
    with pytest.raises(InputMismatchError, match="captured with 2.0"):
        module(x=x, scale=2)  # an int is not the float the program holds


def test_a_constant_that_takes_many_values_is_named(caplog):
    torch.manual_seed(0)
    model = Scaled().double()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 8, dtype=torch.float64)
    h = HRockmate(model, {"x": x, "scale": 2.0}, 1.0, calibrate=0, max_shapes=1, **FAST)
    with caplog.at_level(logging.WARNING, logger="hiremate"):
        for scale in (3.0, 4.0, 5.0):  # an annealed factor: a new program every time
            assert torch.equal(h(x=x, scale=scale), eager(x=x, scale=scale))
    named = [r for r in caplog.records if "pass it as a tensor" in r.getMessage()]
    assert len(named) == 1 and "scale" in named[0].getMessage()



class _Masked(nn.Module):
    """A forward with an optional argument, as Hugging Face models take ``attention_mask``."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(16, 32)
        self.outer = nn.Linear(32, 8)

    def forward(self, x, mask=None, *, scale=1.0):
        h = torch.tanh(self.inner(x))
        if mask is not None:
            h = h * mask
        return self.outer(h) * scale


def test_arguments_passed_by_keyword_or_by_position_are_the_same_call():
    """A call that passes by keyword what the sample passed by position (or the other way)
    runs the sample's schedule: it is the same call to the model. An argument left out takes
    its default, which is another program, captured once. Outputs and gradients are eager's."""
    torch.manual_seed(0)
    x, mask = torch.randn(8, 16), (torch.rand(8, 32) > 0.3).double()
    model = _Masked().double()
    reference = copy.deepcopy(model)
    for sample, calls in (((x.double(), mask), [((x.double(),), {"mask": mask}),
                                                ((), {"x": x.double(), "mask": mask})]),
                          ({"x": x.double(), "mask": mask}, [((x.double(), mask), {}),
                                                             ((x.double(),), {"mask": mask})])):
        wrapped = HRockmate(model, sample, 1.0, calibrate=0)
        for args, kwargs in calls:
            for m in (wrapped, reference):
                m.zero_grad(set_to_none=True)
            out = wrapped(*args, **kwargs)
            out.square().sum().backward()
            expected = reference(*args, **kwargs)
            expected.square().sum().backward()
            assert torch.equal(out, expected)
            assert_grads_match(wrapped, reference)
        assert wrapped.recaptures == 0
    wrapped = HRockmate(model, (x.double(), mask), 1.0, calibrate=0)
    out = wrapped(x.double())  # mask left out: its default, None, is another program
    assert wrapped.recaptures == 1 and torch.equal(out, reference(x.double()))
    with pytest.raises(InputMismatchError, match="scale"):  # keyword-only: not in the sample
        wrapped(x.double(), mask, scale=2.0)


def test_a_sample_that_is_a_mapping_but_not_a_dict_is_keyword_arguments():
    """A tokenizer's ``BatchEncoding`` is a ``UserDict``: a mapping, not a dict. Before, the
    capture passed it whole as the first positional argument and failed with a bare
    ``AttributeError``; it is the keyword arguments, as ``model(**batch)`` takes them."""
    torch.manual_seed(0)
    x, mask = torch.randn(8, 16).double(), (torch.rand(8, 32) > 0.3).double()
    model = _Masked().double()
    reference = copy.deepcopy(model)
    batch = collections.UserDict({"x": x, "mask": mask})
    wrapped = HRockmate(model, batch, 1.0, calibrate=0)
    out = wrapped(**batch)
    out.square().sum().backward()
    expected = reference(**batch)
    expected.square().sum().backward()
    assert torch.equal(out, expected) and wrapped.recaptures == 0
    assert_grads_match(wrapped, reference)


def test_a_captured_loss_takes_its_inputs_by_keyword_too():
    torch.manual_seed(0)
    x, mask, y = torch.randn(8, 16).double(), torch.ones(8, 32).double(), torch.randn(8, 8)
    model = _Masked().double()
    loss_fn = lambda out, target: (out - target.double()).square().mean()  # noqa: E731
    wrapped = HRockmate(model, (x, mask), 1.0, loss_fn=loss_fn, target=y, calibrate=0)
    assert torch.equal(wrapped(x, mask=mask, target=y), loss_fn(model(x, mask), y))
    assert wrapped.recaptures == 0


def test_a_constant_argument_the_sample_did_not_pass_is_not_ignored():
    """A plain argument that the sample did not pass (``scale=2.0``), or that it passed and a
    call leaves out (the model's default then applies), changes the program: it is captured
    again, never run with the sample's program; a bare RematModule refuses it."""
    torch.manual_seed(0)
    x, mask = torch.randn(8, 16).double(), torch.ones(8, 32).double()
    model = _Masked().double()
    wrapped = HRockmate(model, {"x": x, "mask": mask}, 1.0, calibrate=0)
    assert torch.equal(wrapped(x, mask, scale=2.0), model(x, mask, scale=2.0))
    assert wrapped.recaptures == 1
    scaled = HRockmate(model, {"x": x, "mask": mask, "scale": 2.0}, 1.0, calibrate=0)
    assert torch.equal(scaled(x, mask), model(x, mask)) and scaled.recaptures == 1

    from hiremate.runtime.executor import RematModule

    for graph, call, match in ((wrapped.graph, {"scale": 3.0}, r"did not pass \[1\]\['scale'\]"),
                               (scaled.graph, {}, r"missing argument\(s\) \[1\]\['scale'\]")):
        module = RematModule(model, graph, autodiff_schedule(graph))
        with pytest.raises(InputMismatchError, match=match):
            module(x=x, mask=mask, **call)
