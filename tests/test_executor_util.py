"""Shared pieces of the executor tests: small models, cached graphs, eager references."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch.utils._pytree as pytree
import torch.nn.functional as F
from torch import nn

import hiremate
from hiremate import zoo
from hiremate.runtime.executor import RematModule
from hiremate.runtime.measurement import loss_of
from test_executor_schedules import recomputing_schedules


class ConvBN(nn.Module):
    """A small conv net with BatchNorm (running statistics and num_batches_tracked)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.b1 = nn.BatchNorm2d(6)
        self.c2 = nn.Conv2d(6, 8, 3, padding=1, stride=2)
        self.b2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        h = torch.relu(self.b2(self.c2(h)))
        return self.fc(h.mean((2, 3)))


class DropNet(nn.Module):
    """An MLP with dropout in two places, so recomputation must replay random numbers."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.d1 = nn.Dropout(0.3)
        self.l2 = nn.Linear(16, 16)
        self.d2 = nn.Dropout(0.5)
        self.l3 = nn.Linear(16, 4)

    def forward(self, x):
        h = self.d1(torch.tanh(self.l1(x)))
        h = self.d2(torch.tanh(self.l2(h)))
        return self.l3(h)


class TwoBranchDrop(nn.Module):
    """Two independent dropout branches: a schedule may start either one first."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.tanh(self.a(x))) * self.drop(torch.tanh(self.b(x)))


class AttentionLayer(nn.Module):
    """A batch-first Transformer layer with dropout: its attention output is transposed
    back to batch-first, so the dropout after it fills a transposed tensor."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.2, batch_first=True)

    def forward(self, x):
        return self.layer(x)


class DictOut(nn.Module):
    """Keyword inputs (one integer, one that may need a gradient) and a dict output."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.lin = nn.Linear(6, 6)

    def forward(self, ids, scale, shift=None):
        h = self.lin(self.emb(ids)) * scale
        if shift is not None:
            h = h + shift
        return {"h": torch.tanh(h), "pair": (h.sum(-1), ids + 1), "n": 3}


class Spectral(nn.Module):
    """A 1-D spectral convolution (FNO's layer): rfft's backward pads the gradient with a
    functional ``copy`` of a slice, which allocates the slice's whole base."""

    def __init__(self, channels: int = 4, modes: int = 12) -> None:
        super().__init__()
        self.modes = modes
        self.wr = nn.Parameter(torch.randn(channels, channels, modes) / channels)
        self.wi = nn.Parameter(torch.randn(channels, channels, modes) / channels)
        self.scale = nn.Parameter(torch.randn(channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.scale  # so that rfft's input needs a gradient
        xf = torch.fft.rfft(x)[..., :self.modes]
        yf = torch.einsum("bim,iom->bom", xf, torch.complex(self.wr, self.wi))
        return torch.tanh(torch.fft.irfft(yf, n=x.shape[-1]) + x)


class Gather(nn.Module):
    """Advanced indexing of some dimensions only (``h[:, idx]``, ``h[..., idx]``, and a write
    ``h[:, idx] = v``): the index lists hold None for the other dimensions, in the forward's
    ``index`` and ``index_put`` and in their backwards (an ``index_put`` that accumulates)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("idx", torch.tensor([0, 2, 5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        picked = torch.tanh(h[:, self.idx]) + h[..., self.idx] * 2
        h = h.clone()
        h[:, self.idx] = picked * h[:, self.idx]
        return torch.tanh(h)


class Fold(nn.Module):
    """Patches mixed by a linear layer and folded back (``F.unfold``, ``F.fold``): CPU
    ``col2im`` allocates its output like its input and shrinks it, keeping the storage."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(18, 18)
        self.conv = nn.Conv2d(2, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.mix(F.unfold(x, 3, padding=1).transpose(1, 2)).transpose(1, 2)
        return torch.tanh(self.conv(F.fold(patches, x.shape[-2:], 3, padding=1)))


class _ScaledInputGrad(torch.autograd.Function):
    """``x @ w`` whose backward scales the input's gradient: ``gy @ w.T`` is a temporary of
    the backward node, freed before the weight's gradient ``x.T @ gy`` is made."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad @ w.T * 1.5, x.T @ grad


class ScaledGrad(nn.Module):
    """A Linear layer, then :class:`_ScaledInputGrad` with a weight of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.weight = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(_ScaledInputGrad.apply(self.lin(x), self.weight))


class RunningShift(nn.Module):
    """Moves a running mean towards the batch's and subtracts it: the forward reads the buffer
    it writes, so a recomputation after the write must see the value from before it."""

    def __init__(self, width: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.5).add_(0.5 * x.mean(0))
        return torch.tanh(x - self.mean)


class Running(nn.Module):
    """Three layers, each followed by a :class:`RunningShift`."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(3)])
        self.shifts = nn.ModuleList([RunningShift(16) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, shift in zip(self.layers, self.shifts):
            x = shift(torch.sin(layer(x)))
        return x


def small_gpt2(dtype: torch.dtype = torch.float64) -> tuple[nn.Module, dict]:
    import transformers

    config = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=32, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).to(dtype)
        ids = torch.randint(0, 128, (2, 16))
    return model, {"input_ids": ids}


def _seeded(build, dtype):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build().to(dtype)
    return model


def get_model(name: str, dtype: torch.dtype = torch.float64) -> tuple[nn.Module, Any]:
    """A fresh model and its sample; the same weights at every call."""
    gen = torch.Generator().manual_seed(1)
    if name == "convbn":
        return _seeded(ConvBN, dtype), (torch.randn(2, 3, 8, 8, generator=gen, dtype=dtype),)
    if name == "dropnet":
        return _seeded(DropNet, dtype), (torch.randn(5, 8, generator=gen, dtype=dtype),)
    if name == "attnlayer":
        return _seeded(AttentionLayer, dtype), (torch.randn(2, 6, 16, generator=gen, dtype=dtype),)
    if name == "twobranch":
        return _seeded(TwoBranchDrop, dtype), (torch.randn(4, 6, generator=gen, dtype=dtype),)
    if name == "dictout":
        return _seeded(DictOut, dtype), {
            "ids": torch.randint(0, 10, (3, 4), generator=gen),
            "scale": torch.randn(3, 4, 1, generator=gen, dtype=dtype).requires_grad_(),
            "shift": torch.randn(6, generator=gen, dtype=dtype),
        }
    if name == "gather":
        return _seeded(Gather, dtype), (torch.randn(4, 8, generator=gen, dtype=dtype),)
    if name == "fold":
        return _seeded(Fold, dtype), (torch.randn(2, 2, 8, 8, generator=gen, dtype=dtype),)
    if name == "scaled_grad":
        return _seeded(ScaledGrad, dtype), (torch.randn(5, 8, generator=gen, dtype=dtype),)
    if name == "spectral":
        return _seeded(Spectral, dtype), (torch.randn(2, 4, 256, generator=gen, dtype=dtype),)
    if name == "running":
        return _seeded(Running, dtype), (torch.randn(8, 16, generator=gen, dtype=dtype),)
    if name == "small_gpt2":
        return small_gpt2(dtype)
    return zoo.get(name, dtype=dtype)


@functools.cache
def graph_of(name: str, dtype: torch.dtype = torch.float64) -> hiremate.Graph:
    model, sample = get_model(name, dtype)
    return hiremate.build_graph(model, sample, cost_model="flops")


def schedules_of(graph: hiremate.Graph) -> dict[str, hiremate.Schedule]:
    return {"autodiff": hiremate.autodiff_schedule(graph), **recomputing_schedules(graph)}


def split(sample: Any) -> tuple[tuple, dict]:
    return zoo.split_sample(sample)


def run_step(module: Any, sample: Any) -> tuple[Any, list[torch.Tensor | None]]:
    """One forward and backward of ``loss_of``; returns the outputs and the gradients of the
    parameters and of the sample's tensors that require grad."""
    args, kwargs = split(sample)
    out = module(*args, **kwargs)
    loss_of(out).backward()
    model = module.model if isinstance(module, RematModule) else module
    grads = [p.grad for p in model.parameters()]
    grads += [t.grad for t in pytree.tree_leaves((args, kwargs))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    return out, grads


def fresh_sample(sample: Any) -> Any:
    """A copy of the sample with new leaf tensors (so input gradients start at None)."""
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.requires_grad), sample)


def assert_close(a: Any, b: Any, rtol: float = 1e-12, atol: float = 1e-12) -> None:
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    assert sa == sb, f"structures differ: {sa} vs {sb}"
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol)
        else:
            assert x == y


def compare(name: str, schedule_name: str, dtype: torch.dtype = torch.float64,
            rtol: float = 1e-12, atol: float = 1e-12) -> RematModule:
    """Eager and hiremate on the same model and sample: outputs, gradients, buffers."""
    graph = graph_of(name, dtype)
    schedule = schedules_of(graph)[schedule_name]
    assert hiremate.simulate(graph, schedule).valid
    model, sample = get_model(name, dtype)
    ref = copy.deepcopy(model)
    remat = RematModule(model, graph, schedule)
    out_ref, grads_ref = run_step(ref, fresh_sample(sample))
    out, grads = run_step(remat, fresh_sample(sample))
    assert_close(out, out_ref, rtol, atol)
    assert len(grads) == len(grads_ref)
    for g, gr in zip(grads, grads_ref):
        assert (g is None) == (gr is None)
        if g is not None:
            torch.testing.assert_close(g, gr, rtol=rtol, atol=atol)
    for b, br in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b, br, rtol=0, atol=0)
    return remat


def schedule_calls(wrapper: Any) -> list[int]:
    """A list that grows by one at each call of ``wrapper`` (an ``HRockmate``) that runs its
    schedule, rather than the model's plain forward."""
    calls: list[int] = []
    executor = wrapper.executor
    original = executor.forward
    executor.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    return calls
