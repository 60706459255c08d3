"""The cost models: deterministic ones give identical graphs, the roofline fit is made once and
reused, scratch memory is counted under all of them, and the fit is exact where it can be."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

import hiremate
from hiremate.errors import ConfigError
from hiremate.graphbuilder.costs import check_cost_model, resolve_cost_model
from hiremate.graphbuilder.costs import roofline
from hiremate.graphbuilder.costs.analytic import OP_CLASSES
from hiremate.paths import default_cache_dir, exclusive_lock


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.b(torch.relu(self.a(x))))
        return self.head(h.mean((2, 3)))


@pytest.fixture(scope="module")
def fit_dir():
    """The test run's machine cache (``conftest.py``): the tests that only use a roofline fit
    share the run's (a fit takes seconds)."""
    return default_cache_dir()


def _model():
    torch.manual_seed(0)
    return ConvNet(), torch.randn(2, 3, 16, 16)


@pytest.mark.parametrize("cost_model", ["flops", "roofline"])
def test_deterministic_cost_models_give_identical_graphs(cost_model, fit_dir):
    model, x = _model()
    first = hiremate.build_graph(model, x, cost_model=cost_model, cache_dir=fit_dir)
    second = hiremate.build_graph(model, x, cost_model=cost_model, cache_dir=fit_dir)
    assert first.dumps() == second.dumps()
    assert first.meta["cost_model"] == cost_model
    assert all(n.time > 0 for n in first.nodes if n.ops and not n.is_loss)


def test_roofline_fit_is_made_once_and_reused(tmp_path, monkeypatch):
    model, x = _model()
    hiremate.build_graph(model, x, cost_model="roofline", cache_dir=tmp_path)
    files = list((tmp_path / "roofline").glob("*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert set(stored["coefficients"]) == set(OP_CLASSES)
    assert all(c >= 0 for row in stored["coefficients"].values() for c in row)

    def refuse(*_):
        raise AssertionError("the cached fit should have been used")
    monkeypatch.setattr(roofline, "calibrate", refuse)
    hiremate.build_graph(model, x, cost_model="roofline", cache_dir=tmp_path)
    # a fit for another machine (fingerprint) is not taken for this one
    stored["fingerprint"]["processor"] = "another processor"
    files[0].write_text(json.dumps(stored))
    with pytest.raises(AssertionError, match="cached fit"):
        hiremate.build_graph(model, x, cost_model="roofline", cache_dir=tmp_path)


def test_a_process_finding_another_fitting_waits_and_takes_its_fit(tmp_path, monkeypatch,
                                                                  fit_dir):
    """Two processes without a fit (DDP ranks, test workers): the second waits on the first's
    lock and reads its fit instead of calibrating beside it (a lock held here, a build in a
    thread; flock holds between two opens of the file within one process too)."""
    import threading

    device, dtype = torch.device("cpu"), torch.float32
    fit = roofline.load_or_fit(device, dtype, fit_dir)  # the run's fit, the one to be "made"
    path = roofline.fit_path(tmp_path, fit.fingerprint)

    def refuse(*_):
        raise AssertionError("calibrated although another process was fitting")
    monkeypatch.setattr(roofline, "calibrate", refuse)
    got = []
    with exclusive_lock(path.with_suffix(".lock")):  # "another process" is fitting
        waiter = threading.Thread(target=lambda: got.append(
            roofline.load_or_fit(device, dtype, tmp_path)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and not got  # it waits for the lock
        path.write_text(json.dumps(fit.to_dict()))  # ... which stores its fit and lets go
    waiter.join(30)
    assert got == [fit]


def test_scratch_memory_is_counted_under_every_cost_model(fit_dir):
    """CPU convolutions allocate scratch no tensor of the graph shows; the analytic models
    left it out (measured peaks then exceeded the simulator's by up to 1.9x)."""
    model, x = _model()
    temps = {}
    for cost_model in ("flops", "roofline", "measured"):
        graph = hiremate.build_graph(model, x, cost_model=cost_model, cache_dir=fit_dir,
                                     repeats=1)
        temps[cost_model] = [n.overhead for n in graph.nodes]
    assert temps["flops"] == temps["roofline"] == temps["measured"]
    assert any(t > 0 for t in temps["flops"])


def test_auto_is_measured_on_gpu_and_roofline_on_cpu():
    assert resolve_cost_model("auto", torch.device("cpu")) == "roofline"
    assert resolve_cost_model("auto", torch.device("cuda", 0)) == "measured"
    assert check_cost_model("measure") == "measured"  # the former name
    with pytest.raises(ConfigError, match="roofline"):
        check_cost_model("fast")
    with pytest.raises(ConfigError, match="cost_model"):
        hiremate.load_config("hiremate", cost_model="exact")


def test_the_configured_cost_model_builds_the_graph(tmp_path):
    model, x = _model()
    wrapped = hiremate.HRockmate(model, x, 1.0, cost_model="flops", cache=False, n_jobs=1,
                                 calibrate=0, progress=False)
    expected = hiremate.build_graph(model, x, cost_model="flops")
    assert wrapped.graph.dumps() == expected.dumps()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(1e2, 1e9), st.floats(1e2, 1e9)), min_size=4, max_size=12),
       st.floats(1e-7, 1e-4), st.floats(0, 1e-10), st.floats(0, 1e-10))
def test_roofline_fit_recovers_exact_coefficients(points, per_op, per_flop, per_byte):
    """On times that follow the model exactly, the non-negative fit reproduces them."""
    rows = [(f, b, per_op + per_flop * f + per_byte * b) for f, b in points]
    fitted = roofline._nnls_relative(rows)
    assert min(fitted) >= 0
    for f, b, t in rows:
        predicted = fitted[0] + fitted[1] * f + fitted[2] * b
        assert predicted == pytest.approx(t, rel=1e-3)


def test_roofline_fit_never_goes_negative():
    """Times that fall with size would need a negative coefficient: it is held at zero."""
    rows = [(1e6, 1e6, 1e-3), (2e6, 2e6, 5e-4), (4e6, 4e6, 2e-4)]
    assert min(roofline._nnls_relative(rows)) >= 0


def test_cpu_clock_with_one_thread_does_not_count_time_given_to_others():
    """With one intra-op thread ops are timed in the thread's CPU time: time the thread spends
    off the CPU (here asleep, under load preempted) is not counted, and the cost of reading the
    clock is taken off each interval."""
    import time

    from hiremate.graphbuilder.costs.timing import cpu_clock

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        clock, cost = cpu_clock()
        assert clock is time.thread_time and 0 <= cost < 1e-3
        start = clock()
        time.sleep(0.05)
        assert clock() - start - cost < 0.01
        torch.set_num_threads(2)
        clock, _ = cpu_clock()
        assert clock is time.perf_counter  # worker threads' CPU time would be missed
    finally:
        torch.set_num_threads(before)


def test_roofline_fit_round_trips_with_its_step_terms():
    from hiremate.graphbuilder.costs.roofline import RooflineFit

    fit = RooflineFit({k: (1e-6, 1e-11, 1e-10) for k in OP_CLASSES}, {"processor": "x"},
                      dispatch=2e-6, scale=1.05)
    assert RooflineFit.from_dict(fit.to_dict()) == fit


def _traced_step(fn, *shapes):
    """The ATen ops of ``fn``'s forward and backward on random inputs of ``shapes``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = [torch.randn(s, requires_grad=True) for s in shapes]
    gm = make_fx(fn)(*inputs)
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def test_op_classes_tell_pointwise_grouped_and_strided_convolutions_apart():
    """A 1x1 convolution with unit stride and one group is a matrix product (its own class, a
    tenth of a general convolution's fixed cost on a CPU); grouped, strided or wider kernels
    are general convolutions, forward and backward alike."""
    import torch.nn.functional as F

    from hiremate.graphbuilder.costs.analytic import op_class

    def classes(x_shape, w_shape, **kw):
        def step(x, w):
            return torch.autograd.grad(F.conv2d(x, w, **kw).sum(), (x, w))
        return {op_class(n) for n in _traced_step(step, x_shape, w_shape)
                if "convolution" in str(n.target)}

    assert classes((2, 8, 5, 5), (4, 8, 1, 1)) == {"conv_pointwise", "conv_pointwise_backward"}
    assert classes((2, 8, 5, 5), (4, 8, 3, 3), padding=1) == {"conv", "conv_backward"}
    assert classes((2, 8, 5, 5), (8, 2, 1, 1), groups=4) == {"conv", "conv_backward"}
    assert classes((2, 8, 6, 6), (4, 8, 1, 1), stride=2) == {"conv", "conv_backward"}


def test_fourier_transforms_have_a_class_of_their_own():
    """An FFT makes log n passes over its data: priced with the elementwise ops, a Fourier
    layer (FNO) looked several times cheaper than it runs."""
    from hiremate.graphbuilder.costs.analytic import op_class

    def spectral(x, wr, wi):
        spectrum = torch.fft.rfft(x)[..., :4]
        mixed = torch.einsum("bim,iom->bom", spectrum, torch.complex(wr, wi))
        return torch.autograd.grad(torch.fft.irfft(mixed, n=16).sum(), (x, wr, wi))

    nodes = _traced_step(spectral, (2, 3, 16), (3, 5, 4), (3, 5, 4))
    ffts = {str(n.target) for n in nodes if op_class(n) == "fft"}
    assert ffts >= {"aten._fft_r2c.default", "aten._fft_c2r.default"}
    assert all(op_class(n) != "fft" for n in nodes if "fft" not in str(n.target))


def test_scratch_leaves_out_parameter_gradients_wherever_they_fall():
    """An op's scratch from its allocation events: a weight gradient's block is memory no
    budget counts, whether the op allocates it before its scratch peak or after it; a block
    at an address that a gradient later reuses is still counted where it was scratch."""
    from hiremate.graphbuilder.costs.memory import temps_from_events

    grad_at, out_at, tmp_at = 100, 200, 300
    per_node = [
        # scratch at the gradient's future address, freed, then a 64-byte output: 4096 - 64
        ("fwd", [(grad_at, 4096), (grad_at, -4096), (out_at, 64)]),
        # scratch peaks before the gradient is allocated: 1000
        ("bwd_scratch_first", [(tmp_at, 1000), (tmp_at, -1000), (grad_at, 4096)]),
    ]
    assert temps_from_events(per_node, {grad_at}) == {"fwd": 4032, "bwd_scratch_first": 1000}
    # the gradient first, then the scratch: still 1000
    late = [("bwd_grad_first", [(grad_at, 4096), (tmp_at, 1000), (tmp_at, -1000)])]
    assert temps_from_events(late, {grad_at}) == {"bwd_grad_first": 1000}
    # counted as an output, the gradient would hide the scratch made before it
    assert temps_from_events(per_node, set())["bwd_scratch_first"] == 0


def test_the_graph_says_how_much_of_its_time_is_the_in_situ_share(fit_dir):
    """``measured`` costs add to every op an even share of what the whole program's replay
    takes beyond the ops timed alone; the graph keeps how much of its time that share is, so a
    launch-bound capture can be told from a compute-bound one. Other cost models have none."""
    model, x = _model()
    measured = hiremate.build_graph(model, x, cost_model="measured")
    share = measured.meta["in_situ_share"]
    assert 0.0 <= share < 1.0
    flops = hiremate.build_graph(model, x, cost_model="flops", cache_dir=fit_dir)
    assert flops.meta["in_situ_share"] == 0.0


def test_a_bfloat16_model_is_fitted_and_wrapped_with_eagers_gradients(tmp_path, monkeypatch):
    """bfloat16 training is common, and the roofline's calibration has a program that
    bfloat16 cannot run on a CPU (its FFT). That program is skipped, the FFT class keeps a
    fit, and the wrapper's gradients are eager's to the bit (before, the FFT's "Unsupported
    dtype" stopped every bfloat16 model on the CPU)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[layer for _ in range(6) for layer in (nn.Linear(32, 32), nn.GELU())],
                          nn.Linear(32, 8)).to(torch.bfloat16)
    x = torch.randn(256, 32, dtype=torch.bfloat16)
    reference = copy.deepcopy(model)
    # the fit is the machine's ($HIREMATE_CACHE), not the menus' (cache_dir)
    monkeypatch.setenv("HIREMATE_CACHE", str(tmp_path / "machine"))
    wrapped = hiremate.HRockmate(model, x, 0.6, cost_model="roofline",
                                 cache_dir=str(tmp_path / "menus"), calibrate=0)
    assert not (tmp_path / "menus" / "roofline").exists()
    [fit] = (tmp_path / "machine" / "roofline").glob("*.json")
    stored = json.loads(fit.read_text())
    assert "bfloat16" in stored["fingerprint"]["dtype"]
    assert all(c >= 0 for row in stored["coefficients"].values() for c in row)
    assert sum(stored["coefficients"]["fft"]) > 0
    wrapped(x).float().square().sum().backward()
    reference(x).float().square().sum().backward()
    for ours, theirs in zip(wrapped.parameters(), reference.parameters()):
        assert torch.equal(ours.grad, theirs.grad)


def test_activations_softmaxes_and_random_draws_are_priced_per_element(fit_dir):
    """tanh, GELU, SiLU, softmax and dropout's Bernoulli draw cost far more per element on a
    CPU than a copy does (priced as copies, GPT2's dropouts read far cheaper than they run, so
    the solvers reran them freely): each has a class whose per-element rate is fitted, above
    the elementwise fixed cost they share with the ``memory`` class; an op of the family that
    the calibration does not run falls in the generic ``transcendental`` class."""
    import torch.nn.functional as F

    from hiremate.graphbuilder.costs.analytic import op_class

    def step(x):
        mask = torch.ops.aten.bernoulli.p(torch.empty_like(x), 0.9)
        y = torch.tanh(x) + F.gelu(x) + F.silu(x) + torch.log1p(x.abs()) + x * mask
        return torch.autograd.grad((y * x.softmax(-1)).sum(), (x,))

    nodes = _traced_step(step, (8, 16))
    classes = {str(n.target).split(".")[1]: op_class(n) for n in nodes}
    assert classes["bernoulli"] == "random"
    assert classes["tanh"] == "tanh" and classes["gelu"] == "gelu" and classes["silu"] == "silu"
    assert classes["_softmax"] == "_softmax" and classes["log1p"] == "transcendental"
    assert classes["mul"] == "memory" and classes["abs"] == "memory"
    fit = roofline.load_or_fit(torch.device("cpu"), torch.float32, fit_dir)
    memory = fit.coefficients["memory"]
    for kind in ("random", "tanh", "_safe_softmax", "transcendental"):
        per_op, per_element, per_byte = fit.coefficients[kind]
        assert per_op == memory[0]
        # per element of a float32 result: above what a copy's eight bytes cost
        assert per_element + 8 * per_byte > 8 * memory[2], kind
