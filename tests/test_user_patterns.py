"""Patterns users write that the zoo does not have: each wrapped at the lowest of a few budget
fractions that some schedule meets, one seeded training step compared with eager's (outputs,
every gradient, the RNG state after it). Found by probing models written the way tutorials and
papers write them; the ones that failed are fixed and pinned here."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hiremate import HRockmate
from hiremate.errors import InfeasibleBudgetError


class VAE(nn.Module):
    """Reparameterised draw with ``randn_like``."""

    def __init__(self):
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.decode = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        mean, log_var = self.encode(x).chunk(2, -1)
        return self.decode(mean + torch.randn_like(mean) * (0.5 * log_var).exp())


class DropPath(nn.Module):
    """Stochastic depth as timm writes it: a per-sample ``bernoulli_`` mask."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.GELU())
                                    for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            keep = x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(0.8)
            x = x + block(x) * keep / 0.8
        return x


class ChannelsLastDropout(nn.Module):
    """Convolutions, BatchNorm and dropout on channels-last tensors (dropout fills a permuted
    layout) and a ``Dropout2d``."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(8, 8, 3, padding=1) for _ in range(2))
        self.norms = nn.ModuleList(nn.BatchNorm2d(8) for _ in range(2))
        self.channel_drop = nn.Dropout2d(0.2)

    def forward(self, x):
        x = self.channel_drop(self.stem(x))
        for conv, norm in zip(self.convs, self.norms):
            x = x + F.dropout(F.relu(norm(conv(x))), 0.2, True)
        return x.mean((2, 3))


class GumbelRouter(nn.Module):
    def __init__(self):
        super().__init__()
        self.route, self.mix = nn.Linear(16, 8), nn.Linear(8, 16)

    def forward(self, x):
        return self.mix(F.gumbel_softmax(self.route(x), tau=0.5, hard=True))


class MessagePassing(nn.Module):
    """A graph network written with ``index_add_`` into zeros."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        edges = torch.randint(0, 20, (2, 60), generator=torch.Generator().manual_seed(0))
        self.register_buffer("edges", edges)

    def forward(self, x):
        for layer in self.layers:
            messages = layer(x)[self.edges[0]]
            x = F.relu(torch.zeros_like(x).index_add_(0, self.edges[1], messages) + x)
        return x


class GradientReversal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -0.5 * grad


class DomainAdversarial(nn.Module):
    """A custom ``autograd.Function`` (gradient reversal) between two heads."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.label, self.domain = nn.Linear(32, 4), nn.Linear(32, 2)

    def forward(self, x):
        h = self.features(x)
        return torch.cat([self.label(h), self.domain(GradientReversal.apply(h))], -1)


class Distillation(nn.Module):
    """A frozen teacher run under ``no_grad`` inside the forward."""

    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
        self.teacher = copy.deepcopy(self.student).requires_grad_(False)

    def forward(self, x):
        with torch.no_grad():
            target = self.teacher(x).softmax(-1)
        return -(target * self.student(x).log_softmax(-1)).sum(-1, keepdim=True)


class StraightThrough(nn.Module):
    """Vector quantisation with the straight-through ``.detach()`` trick."""

    def __init__(self):
        super().__init__()
        self.encode, self.decode = nn.Linear(16, 8), nn.Linear(8, 16)
        self.codebook = nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        z = self.encode(x)
        q = self.codebook[torch.cdist(z, self.codebook).argmin(-1)]
        return self.decode(z + (q - z).detach()) + ((z - q.detach()) ** 2).sum(-1, keepdim=True)


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.out = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)
        self.group, self.instance = nn.GroupNorm(2, 8), nn.InstanceNorm2d(8, affine=True)

    def forward(self, x):
        return self.out(self.instance(F.silu(self.group(self.conv(x)))))


CASES = {
    "vae": (VAE, (32, 16)),
    "drop-path": (DropPath, (4, 4, 8, 8)),
    "channels-last-dropout": (ChannelsLastDropout, (4, 3, 8, 8)),
    "gumbel-softmax": (GumbelRouter, (32, 16)),
    "message-passing": (MessagePassing, (20, 8)),
    "gradient-reversal": (DomainAdversarial, (32, 16)),
    "no-grad-teacher": (Distillation, (32, 16)),
    "straight-through": (StraightThrough, (32, 16)),
    "group-instance-norm": (Norms, (4, 4, 8, 8)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_user_pattern_trains_as_eager(name):
    build, shape = CASES[name]
    torch.manual_seed(0)
    model = build().double()
    x = torch.randn(*shape, dtype=torch.float64)
    if name == "channels-last-dropout":
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(
            memory_format=torch.channels_last)
    eager = copy.deepcopy(model)
    for fraction in (0.5, 0.7, 1.0):
        try:
            wrapper = HRockmate(model, x, fraction, cost_model="flops", calibrate=0)
            break
        except InfeasibleBudgetError:
            continue
    results = []
    for module in (wrapper, eager):
        torch.manual_seed(3)
        out = module(x)
        out.square().sum().backward()
        results.append((out.detach(), torch.get_rng_state()))
    (ours, our_rng), (theirs, their_rng) = results
    assert torch.equal(ours, theirs) and torch.equal(our_rng, their_rng)
    for a, b in zip(model.parameters(), eager.parameters()):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(),
                         nn.Linear(32, 4)).double()


def _trains_like_eager(wrapped: nn.Module, eager: nn.Module, x: torch.Tensor) -> None:
    out, expected = wrapped(x), eager(x)
    out.square().sum().backward()
    expected.square().sum().backward()
    assert torch.equal(out, expected)
    for p, q in zip(wrapped.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("where", ["no_grad", "inference_mode"])
def test_a_wrapper_built_without_autograd_still_trains(where):
    """Built inside ``torch.no_grad()`` (an evaluation helper, a decorated setup) or from a
    sample made under ``inference_mode``: before, the capture failed (no output needed a
    gradient; inference tensors cannot be saved for backward)."""
    torch.manual_seed(0)
    model = _mlp()
    eager = copy.deepcopy(model)
    x = torch.randn(8, 16, dtype=torch.float64)
    if where == "no_grad":
        with torch.no_grad():
            wrapped = HRockmate(model, x, 1.0)
    else:
        with torch.inference_mode():
            sample = torch.randn(8, 16, dtype=torch.float64)
        wrapped = HRockmate(model, sample, 1.0)
    _trains_like_eager(wrapped, eager, x)


def test_an_empty_batch_trains_like_eager():
    """A batch of zero rows holds nothing to schedule: before, its calibration lowered the
    one-byte budget below zero and raised ``ConfigError`` on a call eager runs."""
    torch.manual_seed(0)
    model = _mlp()
    eager = copy.deepcopy(model)
    wrapped = HRockmate(model, torch.randn(8, 16, dtype=torch.float64), 0.8)
    _trains_like_eager(wrapped, eager, torch.randn(0, 16, dtype=torch.float64))


def test_torch_func_transforms_run_the_plain_forward(caplog):
    """``torch.vmap`` or ``torch.func.grad`` over the wrapper (per-sample gradients): the
    schedule's autograd function has no batching rule, so the call runs the plain forward,
    with one warning (before: torch's error about ``setup_context``)."""
    torch.manual_seed(0)
    model = _mlp()
    wrapped = HRockmate(model, torch.randn(8, 16, dtype=torch.float64), 1.0)
    batch = torch.randn(3, 8, 16, dtype=torch.float64)
    with caplog.at_level("WARNING", logger="hiremate"):
        assert torch.equal(torch.vmap(wrapped)(batch), torch.vmap(model)(batch))
        x = batch[0]
        assert torch.equal(torch.func.grad(lambda v: wrapped(v).sum())(x),
                           torch.func.grad(lambda v: model(v).sum())(x))
    notes = [r for r in caplog.records if r.name.startswith("hiremate")
             and "torch.func" in r.getMessage()]
    assert len(notes) == 1
    _trains_like_eager(wrapped, copy.deepcopy(model), x)  # outside a transform: the schedule


class _Parent(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.trunk = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))

    def forward(self, x):
        return self.trunk(torch.relu(self.stem(x)))


@pytest.mark.parametrize("nesting", ["wrapped child", "wrapper of a wrapper"])
def test_a_model_holding_a_wrapper_is_wrapped(nesting):
    """A model one of whose submodules is already wrapped (library code, an earlier
    experiment) wrapped as a whole, or a wrapper wrapped again. Before: the capture traced the
    inner wrapper's executor and hung (a child) or failed (``KeyError: '__import__'``). A
    capture now runs inner wrappers as their plain models, so the outer graph holds the
    model's own ops."""
    torch.manual_seed(0)
    model = _Parent().double()
    eager = copy.deepcopy(model)
    x = torch.randn(8, 16, dtype=torch.float64)
    if nesting == "wrapped child":
        model.trunk = HRockmate(model.trunk, torch.randn(8, 32, dtype=torch.float64), 1.0)
        wrapped = HRockmate(model, x, 0.8)
    else:
        wrapped = HRockmate(HRockmate(model, x, 1.0), x, 0.8)
    import hiremate

    plain = hiremate.build_graph(copy.deepcopy(eager), x)
    assert len(wrapped.graph.nodes) == len(plain.nodes)  # the model's ops, not the executor's
    _trains_like_eager(wrapped, eager, x)
