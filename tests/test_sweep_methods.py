"""Tests of the sweep's peer methods: block finding, checkpoint wrapping (same gradients as
eager, lower measured peak), checkpoint_sequential applicability, torch.compile's budget."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hiremate import measure, zoo
from hiremate.errors import SolverError
from hiremate.sweep.methods import (
    CheckpointedBlock,
    NotApplicable,
    SequentialCheckpoint,
    as_sequential,
    find_blocks,
    run_compile,
    wrap_blocks,
)
from hiremate.sweep.spec import parse_spec


def _grads(model, sample):
    args, kwargs = zoo.split_sample(sample)
    model.zero_grad(set_to_none=True)
    loss = zoo.output_loss(model(*args, **kwargs))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("name, kwargs, expected", [
    ("gpt2", {"layers": 2}, ["transformer.h"]),
    ("transformer", {"layers": 2}, ["decoder.layers", "encoder.layers"]),
    ("resnet", {}, ["blocks"]),
    ("mlp", {}, [""]),
])
def test_find_blocks_on_zoo_models(name, kwargs, expected):
    model, _ = zoo.get(name, **kwargs)
    assert sorted(n for n, _ in find_blocks(model)) == sorted(expected)


@pytest.mark.parametrize("name, kwargs", [
    ("gpt2", {"layers": 2, "width": 32}), ("transformer", {"layers": 1, "width": 16}),
    ("mlp", {"layers": 2, "width": 16}),
])
def test_checkpointed_model_has_eager_gradients(name, kwargs):
    ref_model, sample = zoo.get(name, dtype=torch.float64, **kwargs)
    model, _ = zoo.get(name, dtype=torch.float64, **kwargs)
    wrapped = wrap_blocks(model)
    assert wrapped and all(isinstance(model.get_submodule(w), CheckpointedBlock) for w in wrapped)
    loss_ref, g_ref = _grads(ref_model, sample)
    loss, g = _grads(model, sample)
    torch.testing.assert_close(loss, loss_ref, rtol=0, atol=0)
    assert len(g) == len(g_ref)
    for n_ref, grad in g_ref.items():
        n = next(k for k in g if k.replace(".inner", "") == n_ref)
        torch.testing.assert_close(g[n], grad, rtol=1e-12, atol=1e-12)


def test_checkpointed_transformer_runs_in_float32():
    """nn.TransformerEncoder reads attributes of its first layer: the wrapper shows them."""
    model, sample = zoo.get("transformer", layers=2, width=16)
    wrap_blocks(model)
    assert model.encoder.layers[0].self_attn is model.encoder.layers[0].inner.self_attn
    loss, grads = _grads(model, sample)
    assert torch.isfinite(loss) and grads


def test_wrapping_twice_wraps_nothing_new():
    model, _ = zoo.get("gpt2", layers=2, width=32)
    assert len(wrap_blocks(model)) == 2
    assert wrap_blocks(model) == []


def test_checkpoint_lowers_the_measured_peak_of_a_deep_chain():
    """Storing only block boundaries: a deep MLP of wide blocks must use less memory."""
    blocks = [nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU())
              for _ in range(6)]
    model = nn.Sequential(nn.Linear(32, 256), nn.Sequential(*blocks), nn.Linear(256, 10))
    x = torch.randn(64, 32)
    eager = measure(model, x, repeats=1, warmup=0).peak
    assert [n for n, _ in find_blocks(model)] == ["1"]
    wrap_blocks(model)
    ckpt = measure(model, x, repeats=1, warmup=0).peak
    assert ckpt < 0.6 * eager


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return self.b(self.a(x)) + x


class _Chain(_Residual):
    def forward(self, x):
        return self.b(self.a(x))


def test_as_sequential_accepts_chains_and_refuses_the_rest():
    mlp, x = zoo.get("mlp")
    assert as_sequential(mlp, x) is mlp
    chain = _Chain()
    seq = as_sequential(chain, torch.randn(2, 8))
    assert list(seq) == [chain.a, chain.b]
    with pytest.raises(NotApplicable, match="does not compute the chain"):
        as_sequential(_Residual(), torch.randn(2, 8))
    gpt, sample = zoo.get("gpt2", layers=1, width=32)
    with pytest.raises(NotApplicable, match="one tensor"):
        as_sequential(gpt, sample)


def test_checkpoint_sequential_module_keeps_eager_gradients():
    model, x = zoo.get("mlp", layers=3, width=16, dtype=torch.float64)
    ref, _ = zoo.get("mlp", layers=3, width=16, dtype=torch.float64)
    _, g_ref = _grads(ref, x)
    wrapper = SequentialCheckpoint(model, 2)
    _, g = _grads(wrapper, x)
    for n, grad in g_ref.items():
        torch.testing.assert_close(g["seq." + n], grad, rtol=1e-12, atol=1e-12)


def test_compile_records_its_budget_and_backend():
    spec = parse_spec({"models": ["mlp"], "budgets": [0.5], "methods": ["compile"],
                       "repeats": 1, "warmup": 0})
    model, x = zoo.get("mlp", layers=1, width=16)
    result = run_compile(model, x, spec, 0.5)
    assert result.extra == {"compile_backend": "aot_eager_decomp_partition",
                            "activation_memory_budget": 0.5, "compiled_graphs": 1,
                            "recompiled_graphs": 0}
    assert result.solve_time > 0 and result.measurement.peak > 0
    # the restored functorch config: the patch does not leak out of the cell
    import torch._functorch.config as functorch_config

    assert functorch_config.activation_memory_budget == 1.0


def test_a_compile_that_compiles_nothing_is_not_reported_as_compile(monkeypatch):
    """A model that dynamo runs eagerly (here: told to skip its forward) measures as eager
    PyTorch; the cell must fail saying so, not stand in the table as compile's result."""
    import torch._dynamo

    spec = parse_spec({"models": ["mlp"], "budgets": [0.5], "methods": ["compile"],
                       "repeats": 1, "warmup": 0})
    model, x = zoo.get("mlp", layers=1, width=16)
    monkeypatch.setattr(model, "forward", torch._dynamo.disable(model.forward))
    with pytest.raises(SolverError, match="compiled no graph"):
        run_compile(model, x, spec, 0.5)
