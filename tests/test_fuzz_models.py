"""Fuzzing the whole pipeline with random small PyTorch models (residuals, concatenations,
several outputs, a submodule used twice, dropout, LayerNorm/BatchNorm) at random budgets:
HRockmate's outputs and gradients equal eager PyTorch's in float64 (rtol = atol = 1e-12), with
the same seed for models with dropout. A budget no configured solver meets is replaced by the
``min_budget`` the error reports, so every example runs a schedule (usually a recomputing one).

CI runs HIREMATE_FUZZ_MODELS (5) derandomised examples; ``pytest -m slow`` runs 100 random ones.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from hiremate import HRockmate
from hiremate.errors import InfeasibleBudgetError

CI_MODELS = int(os.environ.get("HIREMATE_FUZZ_MODELS", "5"))
SLOW_MODELS = int(os.environ.get("HIREMATE_FUZZ_SLOW_MODELS", "100"))
FAST = {"progress": False, "n_jobs": 1, "cache": False, "calibrate": 0,
        "solver_params": {"hilp": {"time_limit": 1.0}, "rk-rotor": {"slots": 100}}}
KINDS = ["linear", "residual", "concat", "shared", "dropout", "layernorm", "batchnorm", "output"]
W = 6


class Layer(nn.Module):
    """One random layer on a ``(batch, W)`` tensor; ``output`` also returns its value."""

    def __init__(self, kind: str, shared: nn.Module):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(W, W)
        self.shared = shared if kind == "shared" else None
        self.extra = {"concat": nn.Linear(2 * W, W), "dropout": nn.Dropout(0.3),
                      "layernorm": nn.LayerNorm(W), "batchnorm": nn.BatchNorm1d(W)}.get(kind)

    def forward(self, h):
        k = self.kind
        if k == "residual":
            return h + torch.tanh(self.lin(h))
        if k == "concat":
            return self.extra(torch.cat([torch.relu(self.lin(h)), torch.sigmoid(h)], dim=-1))
        if k == "shared":
            return self.shared(torch.tanh(self.shared(h)))
        if k in ("dropout", "layernorm", "batchnorm"):
            return self.extra(torch.tanh(self.lin(h)))
        return torch.tanh(self.lin(h))


class Net(nn.Module):
    def __init__(self, kinds: list[str]):
        super().__init__()
        shared = nn.Linear(W, W)
        self.layers = nn.ModuleList(Layer(k, shared) for k in kinds)

    def forward(self, x):
        outs = []
        h = x
        for layer in self.layers:
            h = layer(h)
            if layer.kind == "output":
                outs.append(h * 2)
        return (h, *outs) if outs else h


def loss_of(out):
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o.sin() * (i + 1)).sum() for i, o in enumerate(outs))


def run(model, x, seed, params_of=None):
    torch.manual_seed(seed)
    xx = x.clone().requires_grad_()
    out = model(xx)
    loss_of(out).backward()
    outs = out if isinstance(out, tuple) else (out,)
    params = (params_of or model).named_parameters()
    return [o.detach() for o in outs], xx.grad, {n: p.grad for n, p in params}


def check_model(kinds: list[str], fraction: float, seed: int) -> None:
    torch.manual_seed(seed)
    eager = Net(kinds).double()
    x = torch.randn(5, W, dtype=torch.float64)
    ours = copy.deepcopy(eager)
    sample = x.clone().requires_grad_()
    try:
        h = HRockmate(ours, sample, fraction, **FAST)
    except InfeasibleBudgetError as exc:
        assert exc.min_budget is not None, str(exc)
        h = HRockmate(ours, sample, exc.min_budget, **FAST)
    got = run(h, x, seed + 1, params_of=ours)
    want = run(eager, x, seed + 1)
    tol = dict(rtol=1e-12, atol=1e-12)
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b, **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], **tol, msg=name)
    for (n, b1), (_, b2) in zip(ours.named_buffers(), eager.named_buffers()):
        torch.testing.assert_close(b1, b2, **tol, msg=n)  # running statistics updated once


models = st.tuples(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
                   st.floats(0.2, 1.0), st.integers(0, 2**16))
FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck))


@settings(max_examples=CI_MODELS, derandomize=True, **FUZZ)
@given(case=models)
def test_fuzz_models_match_eager(case):
    check_model(*case)


@pytest.mark.parametrize("kinds", [KINDS, KINDS[::-1]], ids=["forward", "reversed"])
def test_every_layer_kind_at_a_low_budget(kinds):
    """All kinds in one model at 30% of the autodiff peak (or the least the solvers reach), in
    both orders (each kind before and after every other)."""
    check_model(kinds, 0.3, 7)


@pytest.mark.slow
def test_every_layer_kind_twice_at_a_low_budget():
    """Both orders in one model of 16 layers (two random ops: a whole-step walk that ends in
    the solve without random reruns, the slowest case of this file)."""
    check_model(KINDS + KINDS[::-1], 0.3, 7)


@pytest.mark.slow
@settings(max_examples=SLOW_MODELS, **FUZZ)
@given(case=st.tuples(st.lists(st.sampled_from(KINDS), min_size=1, max_size=12),
                      st.floats(0.1, 1.0), st.integers(0, 2**16)))
def test_fuzz_models_match_eager_slow(case):
    check_model(*case)
