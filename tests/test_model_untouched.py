"""Building leaves the model as the caller left it, and gradients are None where eager's are.

Every check compares with eager PyTorch on a deep copy of the model: the state before and after
building (``state_dict`` bit for bit, the global RNG state), the loss and gradients of a step,
and which parameters end with ``.grad is None``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import hiremate
from hiremate import HRockmate
from hiremate.errors import InfeasibleBudgetError
from hiremate.runtime.preserve import preserved

# hierarchical_above: the flat path alone (these graphs are small), so a build takes seconds
FAST = {"progress": False, "n_jobs": 1, "cache": False, "hierarchical_above": 100.0,
        "solver_params": {"hilp": {"time_limit": 2.0}, "rk-rotor": {"slots": 100}}}
# the conv net at 0.5: blocks and rk-Rotor (a time-limited flat H-ILP finds a schedule that
# recomputes each node about 15 times, slow to run on a loaded machine); its first schedule
# measures above the budget, so calibration solves again
# (Rockmate's two levels: the sequence partitioner's chain of blocks, each flattened)
CONV = {**FAST, "flat_max_nodes": 0, "top": ["rk-rotor"], "partitioner": "sequence",
        "partitioner_params": {}, "middle": [], "middle_flat": [], "total_options": None}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a shared, loaded CPU two threads contend (an op's time grows a
    thousandfold), and these tests compare values, not speeds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ConvNet(nn.Module):
    """Convolutions with BatchNorm (running statistics: buffers a training forward writes) and
    dropout (draws from the global RNG)."""

    def __init__(self, depth: int = 10, width: int = 8):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(3 if i == 0 else width, width, 3, padding=1)
                                   for i in range(depth))
        self.bns = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(depth))
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(width, 4)

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = torch.relu(bn(conv(x)))
        return self.fc(self.drop(x).mean((2, 3)))


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, f"changed by the build: {changed}"


def assert_grads_match(ours: nn.Module, eager: nn.Module) -> None:
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), (name, p.grad is None, q.grad is None)
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.fixture(scope="module")
def convnet():
    torch.manual_seed(0)
    model = ConvNet().double()
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    return model, x


def test_build_with_calibration_leaves_buffers_and_rng_untouched(convnet):
    model, x = convnet
    before = snapshot(model)
    eager = copy.deepcopy(model)
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    h = HRockmate(model, x, 0.5, **CONV)
    report = h.report()
    assert report["calibration"], "calibration (config calibrate: 2) did not run"
    assert report["predicted_peak"] < report["autodiff_peak"]  # it does recompute
    assert torch.equal(torch.get_rng_state(), rng)
    assert_same_state(model, before)
    assert all(p.grad is None for p in model.parameters())

    # one training step from the same RNG state: loss, gradients and buffers as eager's
    for _ in range(2):
        for m in (model, eager):
            m.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        loss = h(x).square().sum()
        loss.backward()
        rng_after = torch.get_rng_state()
        torch.manual_seed(7)
        eager_loss = eager(x).square().sum()
        eager_loss.backward()
        torch.testing.assert_close(loss, eager_loss, rtol=1e-12, atol=0)
        assert_grads_match(model, eager)
        for (name, b), c in zip(model.named_buffers(), eager.buffers()):
            torch.testing.assert_close(b, c, rtol=1e-12, atol=0, msg=name)
        assert torch.equal(rng_after, torch.get_rng_state())  # the same numbers were drawn


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_build_on_cuda_leaves_buffers_and_cuda_rng_untouched():
    torch.manual_seed(0)
    model = ConvNet().cuda()
    x = torch.randn(4, 3, 8, 8, device="cuda")
    before = snapshot(model)
    cpu_rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state()
    HRockmate(model, x, 0.5, **CONV)
    assert_same_state(model, before)
    assert torch.equal(torch.get_rng_state(), cpu_rng)
    assert torch.equal(torch.cuda.get_rng_state(), cuda_rng)


def test_measure_restores_buffers_and_rng(convnet):
    model, x = convnet
    before = snapshot(model)
    rng = torch.get_rng_state()
    hiremate.measure(model, x, repeats=1, warmup=1)
    assert_same_state(model, before)
    assert torch.equal(torch.get_rng_state(), rng)


def test_preserved_puts_back_replaced_tensors_and_leaves_unchanged_buffers_unwritten():
    bn = nn.BatchNorm1d(3)
    bn.train()
    mean, var = bn.running_mean, bn.running_var
    with preserved(bn):
        bn(torch.randn(5, 3))  # writes the running statistics in place
        bn._buffers["running_var"] = torch.full((3,), 7.0)  # replaces a buffer's tensor
        torch.randn(3)
    assert bn.running_mean is mean and bn.running_var is var
    assert torch.equal(mean, torch.zeros(3)) and torch.equal(var, torch.ones(3))
    # an unchanged buffer is not written: a pending backward that saved it stays valid
    version = var._version
    with preserved(bn):
        pass
    assert var._version == version


# -- gradients the loss does not reach ------------------------------------------------------------
class TwoHeads(nn.Module):
    """As a CLIP vision model: ``last`` from the encoder, ``pooled`` from a head on the first
    token (``head``'s parameters reach only ``pooled``); ``extra`` is mixed into ``pooled``
    alone; ``unused`` never runs (no gradient in the graph at all)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16))
        self.unused = nn.Linear(16, 16)

    def forward(self, x, extra):
        last = self.norm(self.enc(x))
        pooled = self.head(last[:, 0] + extra)
        return {"last": last, "pooled": pooled}


LOSSES = {
    "last only": lambda out: out["last"].square().sum(),
    "both": lambda out: out["last"].square().sum() + out["pooled"].sum(),
    # the head is reached, with a zero gradient: eager gives zeros, not None
    "pooled times zero": lambda out: out["last"].sum() + 0.0 * out["pooled"].sum(),
    "pooled only": lambda out: out["pooled"].sum(),
}


@pytest.fixture(scope="module")
def two_heads():
    torch.manual_seed(1)
    model = TwoHeads().double()
    sample = {"x": torch.randn(2, 5, 8, dtype=torch.float64),
              "extra": torch.randn(2, 16, dtype=torch.float64, requires_grad=True)}
    h = HRockmate(model, sample, 0.95, calibrate=0, **FAST)
    return model, sample, h


@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_grad_is_none_exactly_where_eager_leaves_it_none(two_heads, loss_name):
    model, sample, h = two_heads
    loss_fn = LOSSES[loss_name]
    eager = copy.deepcopy(model)
    results = []
    for module, params in ((h, model), (eager, eager)):
        params.zero_grad(set_to_none=True)
        extra = sample["extra"].detach().clone().requires_grad_()
        loss = loss_fn(module(x=sample["x"], extra=extra))
        loss.backward()
        results.append((loss, extra.grad))
    (loss, extra_grad), (eager_loss, eager_extra_grad) = results
    torch.testing.assert_close(loss, eager_loss, rtol=1e-12, atol=0)
    assert_grads_match(model, eager)
    assert (extra_grad is None) == (eager_extra_grad is None)
    if eager_extra_grad is not None:
        torch.testing.assert_close(extra_grad, eager_extra_grad, rtol=1e-12, atol=0)
    # the cases are what they claim to be
    head_none = all(p.grad is None for p in eager.head.parameters())
    assert head_none == (loss_name == "last only")
    assert all(p.grad is None for p in eager.unused.parameters())


def test_clip_vision_model_post_layernorm_grad_is_none():
    """The reported case: transformers' CLIPVisionModel with the loss on last_hidden_state
    only; post_layernorm (it feeds pooler_output alone) keeps ``.grad is None``, as in eager."""
    transformers = pytest.importorskip("transformers")
    config = transformers.CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        image_size=8, patch_size=4, num_channels=3)
    torch.manual_seed(0)
    model = transformers.CLIPVisionModel(config).double()
    pixels = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    before = snapshot(model)
    h = HRockmate(model, {"pixel_values": pixels}, 1.0, calibrate=0, **FAST)
    assert_same_state(model, before)
    eager = copy.deepcopy(model)
    h(pixel_values=pixels).last_hidden_state.sum().backward()
    eager(pixel_values=pixels).last_hidden_state.sum().backward()
    post = [p for n, p in eager.named_parameters() if "post_layernorm" in n]
    assert post and all(p.grad is None for p in post)
    assert_grads_match(model, eager)


class SparseGraphNet(nn.Module):
    """A graph network whose adjacency is a sparse buffer (``torch.equal`` has no sparse
    kernel: the build's restore of the buffers used it, and its error hid the real one)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        edges = torch.randint(0, 30, (2, 90), generator=torch.Generator().manual_seed(0))
        self.register_buffer("adjacency", torch.sparse_coo_tensor(
            edges, torch.ones(90), (30, 30), check_invariants=True).coalesce())

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(torch.sparse.mm(self.adjacency, layer(x))) + x
        return x


def test_a_sparse_buffer_is_kept_and_errors_are_the_builds():
    torch.manual_seed(0)
    model = SparseGraphNet()
    x = torch.randn(30, 16)
    before = model.adjacency
    with pytest.raises(InfeasibleBudgetError):
        HRockmate(model, x, 0.05, calibrate=0)
    eager = copy.deepcopy(model)
    wrapper = HRockmate(model, x, 1.0, calibrate=0)
    assert model.adjacency is before
    wrapper(x).square().sum().backward()
    eager(x).square().sum().backward()
    for a, b in zip(model.parameters(), eager.parameters()):
        assert torch.equal(a.grad, b.grad)


class Counting(nn.Module):
    """A forward that keeps Python state: a call counter, a list and a dict it adds to."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0
        self.seen: list[int] = []
        self.last: dict[str, float] = {"scale": 1.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen.append(self.calls)
        self.last["scale"] = float(self.calls)
        return torch.relu(self.lin(x))


def test_a_build_puts_back_the_forwards_python_state_and_says_so(caplog):
    """Building runs the forward several times; before, a counter read 3 after the build and
    a list had grown, with nothing said. They are put back, and the warning says that the
    wrapper's steps will not change them."""
    model = Counting()
    seen, last = model.seen, model.last
    with caplog.at_level("WARNING", logger="hiremate"):
        wrapped = HRockmate(model, torch.randn(4, 8), 1.0)
    assert model.calls == 0 and model.seen == [] and model.last == {"scale": 1.0}
    assert model.seen is seen and model.last is last  # the same objects, the user's references
    warned = [r.getMessage() for r in caplog.records if "Python attribute" in r.getMessage()]
    assert len(warned) == 1 and "Counting.calls" in warned[0] and "Counting.seen" in warned[0]
    wrapped(torch.randn(4, 8)).sum().backward()
    assert model.calls == 0  # the schedule runs, not the forward's Python code


def test_preserved_puts_back_attributes_quietly_outside_a_build(caplog):
    model = Counting()
    with caplog.at_level("DEBUG", logger="hiremate"), preserved(model):
        model(torch.randn(2, 8))
        model.seen.extend([7, 8])
    assert model.calls == 0 and model.seen == [] and model.last == {"scale": 1.0}
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def _lazy_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(),
                         nn.LazyLinear(2)).double()


def test_lazy_modules_are_initialised_before_the_build_as_by_their_first_call(caplog):
    """Lazy modules have no parameters to trace until their first call. Before, a lazy
    BatchNorm or convolution failed the capture ("Attempted to use an uninitialized
    parameter"), and a lone ``LazyLinear`` was initialised by the build's runs with an
    error-level log calling its parameters written in place. One eval-mode forward without
    autograd now initialises them first: the parameters are those of eager's first call, no
    buffer moves, the global generator is left where it was."""
    model, eager = _lazy_net(), _lazy_net()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    rng = torch.get_rng_state()
    with caplog.at_level("WARNING", logger="hiremate"):
        wrapped = HRockmate(model, x, 1.0)
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert torch.equal(rng, torch.get_rng_state()) and model.training
    assert type(model[4]) is nn.Linear and model[4].in_features == 64
    assert int(model[1].num_batches_tracked) == 0
    wrapped(x).sum().backward()
    eager(x).sum().backward()  # its first call initialises it from the same generator state
    assert wrapped.recaptures == 0
    for a, b in zip(model.parameters(), eager.parameters()):
        assert torch.equal(a, b) and torch.allclose(a.grad, b.grad, rtol=1e-12, atol=0)
    assert torch.allclose(model[1].running_mean, eager[1].running_mean, rtol=1e-12, atol=0)
