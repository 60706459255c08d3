"""RematModule behaves like an nn.Module under autograd: several calls before one backward,
outputs feeding further computation, keyword and integer inputs, structured outputs,
accumulation into .grad, optimizer steps, no_grad inference and clear errors."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as pytree

import hiremate
from hiremate.errors import (
    BackwardTwiceError,
    DoubleBackwardError,
    HiremateError,
    InputMismatchError,
    ModifiedInPlaceError,
)
from hiremate.runtime.executor import RematModule
from hiremate.runtime.measurement import _cpu_allocation_events, _cpu_profile
from test_executor_util import (
    assert_close, fresh_sample, get_model, graph_of, schedules_of, split)


def _pair(name: str, schedule: str = "keep-half", dtype=torch.float64):
    graph = graph_of(name, dtype)
    model, sample = get_model(name, dtype)
    ref = copy.deepcopy(model)
    return RematModule(model, graph, schedules_of(graph)[schedule]), ref, sample


def test_paper_example_two_calls_one_backward() -> None:
    """HiRemate, appendix C.2.2: y = linear(inp); z1 = m(y); z2 = m(x);
    loss(z1 + z2).backward() gives eager's gradients everywhere."""
    model, _ = get_model("mlp")
    x = torch.randn(8, 32, dtype=torch.float64)
    graph = hiremate.build_graph(model, x.clone().requires_grad_(), cost_model="flops")
    remat = RematModule(model, graph, schedules_of(graph)["keep-third"])
    ref = copy.deepcopy(model)
    results = []
    for m in (remat, ref):
        torch.manual_seed(3)
        linear = torch.nn.Linear(16, 32, dtype=torch.float64)
        inp = torch.randn(8, 16, dtype=torch.float64)
        tgt = torch.randn(8, 10, dtype=torch.float64)
        y = linear(inp)
        z1 = m(y)
        z2 = m(x)
        loss = torch.nn.functional.mse_loss(z1 + z2, tgt)
        loss.backward()
        params = m.model.parameters() if m is remat else m.parameters()
        results.append([loss.detach(), linear.weight.grad, linear.bias.grad,
                        *[p.grad for p in params]])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_input_gradient_and_further_computation() -> None:
    remat, ref, sample = _pair("dictout")
    outs = []
    for m in (remat, ref):
        s = fresh_sample(sample)
        out = m(**s)
        # outputs feed more computation, and only part of the outputs gets a gradient
        loss = (out["h"] ** 2).sum() * out["pair"][0].mean()
        loss.backward()
        assert out["n"] == 3 and out["pair"][1].dtype == torch.int64
        model = m.model if m is remat else m
        outs.append((out, s["scale"].grad, [p.grad for p in model.parameters()]))
    assert_close(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-12, atol=1e-12)
    for a, b in zip(outs[0][2], outs[1][2]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_input_without_grad_and_output_without_grad() -> None:
    remat, ref, sample = _pair("dictout")
    s = fresh_sample(sample)
    s["scale"] = s["scale"].detach()  # built with a grad-requiring scale, called without
    out = remat(**s)
    out_ref = ref(**s)
    assert_close(out, out_ref)
    assert not out["pair"][1].requires_grad
    out["h"].sum().backward()  # the other outputs receive no gradient: zeros are used
    out_ref["h"].sum().backward()
    for p, q in zip(remat.model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["gpt2", pytest.param("small_gpt2", marks=pytest.mark.slow)])
def test_model_output_of_transformers(name: str) -> None:
    remat, ref, sample = _pair(name, "keep-third")
    out = remat(**sample)
    assert type(out).__name__ == "CausalLMOutputWithCrossAttentions"
    assert out.logits.shape == ref(**sample).logits.shape


def test_grad_accumulates_across_calls_and_sgd_steps() -> None:
    remat, ref, sample = _pair("gpt2", "keep-third")
    opt_r = torch.optim.SGD(remat.parameters(), lr=0.1)
    opt_e = torch.optim.SGD(ref.parameters(), lr=0.1)
    args, kwargs = split(sample)
    for step in range(3):
        for m, opt in ((remat, opt_r), (ref, opt_e)):
            opt.zero_grad()
            for _ in range(2):  # two calls accumulate into .grad before the step
                m(*args, **kwargs).logits.pow(2).mean().backward()
            opt.step()
    for p, q in zip(remat.model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


def test_inference_under_no_grad_keeps_nothing() -> None:
    remat, ref, sample = _pair("resnet")
    args, _ = split(sample)
    with torch.no_grad():
        expected = ref(*args)
        with _cpu_profile() as prof:
            out = remat(*args)
    assert out.grad_fn is None and not out.requires_grad
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    # what is still allocated when the call returns: the output and nothing else
    live = {}
    for addr, nbytes in _cpu_allocation_events(prof):
        if nbytes > 0:
            live[addr] = nbytes
        else:
            live.pop(addr, None)
    assert sum(live.values()) == out.numel() * out.element_size()
    for b, c in zip(remat.model.buffers(), ref.buffers()):  # BatchNorm updates as eager
        torch.testing.assert_close(b, c, rtol=0, atol=0)
    # a frozen model with inputs that need no grad: also inference, with grad mode on
    for p in remat.parameters():
        p.requires_grad_(False)
    assert remat(*args).grad_fn is None


def test_double_backward_raises() -> None:
    remat, _, sample = _pair("mlp")
    out = remat(*split(sample)[0])
    with pytest.raises(DoubleBackwardError, match="double backward"):
        torch.autograd.grad(out.sum(), list(remat.parameters()), create_graph=True)
    assert issubclass(DoubleBackwardError, HiremateError)


def test_backward_twice_raises() -> None:
    remat, _, sample = _pair("mlp")
    loss = remat(*split(sample)[0]).sum()
    loss.backward()
    with pytest.raises(BackwardTwiceError, match="pass retain_graph=True to the first"):
        loss.backward()


def test_shape_and_dtype_mismatch_raise() -> None:
    remat, _, sample = _pair("mlp", "autodiff")
    (x,) = split(sample)[0]
    with pytest.raises(InputMismatchError,
                       match=r"\[0\]\[0\].*shape \(3, 32\) instead of \(8, 32\)"):
        remat(x[:3])
    with pytest.raises(InputMismatchError, match="dtype float32 instead of float64"):
        remat(x.float())
    with pytest.raises(InputMismatchError, match="unexpected tensor input"):
        remat(x, x)
    gpt, _, gs = _pair("gpt2", "autodiff")
    with pytest.raises(InputMismatchError, match="missing tensor input.*input_ids"):
        gpt(gs["input_ids"])  # positional instead of keyword
    with pytest.raises(InputMismatchError, match="requires grad"):
        remat(x.clone().requires_grad_())


def test_on_mismatch_rebuilds_for_new_inputs() -> None:
    model, sample = get_model("mlp")
    graph = graph_of("mlp")
    built = []

    def rebuild(args, kwargs, error):
        built.append(str(error))
        g = hiremate.build_graph(model, args, cost_model="flops")
        return RematModule(model, g, hiremate.autodiff_schedule(g))

    remat = RematModule(model, graph, hiremate.autodiff_schedule(graph), on_mismatch=rebuild)
    x = torch.randn(3, 32, dtype=torch.float64)
    for _ in range(2):
        torch.testing.assert_close(remat(x), model(x), rtol=1e-12, atol=1e-12)
    assert len(built) == 1 and "shape" in built[0]


def test_sample_given_at_construction() -> None:
    model, sample = get_model("dictout")
    graph = graph_of("dictout")
    remat = RematModule(model, graph, hiremate.autodiff_schedule(graph), sample=sample)
    out = remat(**fresh_sample(sample))
    assert pytree.tree_structure(out) == pytree.tree_structure(model(**sample))


def test_pickles_and_deep_copies() -> None:
    import io

    remat, _, sample = _pair("mlp")
    (x,) = split(sample)[0]
    expected = remat(x)
    buf = io.BytesIO()
    torch.save(remat, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
    torch.testing.assert_close(copy.deepcopy(remat)(x), expected, rtol=0, atol=0)


def test_in_place_change_before_backward_raises_as_eager() -> None:
    remat, ref, sample = _pair("mlp")
    (x,) = split(sample)[0]
    for m, params in ((remat, list(remat.parameters())), (ref, list(ref.parameters()))):
        loss = m(x).sum()
        with torch.no_grad():
            params[-2].add_(1.0)  # the last weight (eager saves it), e.g. an optimizer step
        with pytest.raises(RuntimeError, match="modified") as info:
            loss.backward()
        assert isinstance(info.value, ModifiedInPlaceError) == (m is remat)


@pytest.mark.filterwarnings("error:Dynamo detected:UserWarning")
def test_torch_compile_around_a_wrapper_leaves_its_schedule_alone() -> None:
    """A user who compiles a wrapper (or a model holding one) gets the schedule run as it was
    solved: the compiler sees none of the model's ops, whose frees and reruns keep the step
    within its budget, and the step's outputs and gradients are eager's; Dynamo has nothing
    to warn about in the wrapper's code."""
    import torch._dynamo

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
                                  for _ in range(4)]).double()
    x = torch.randn(8, 16, dtype=torch.float64)
    wrapper = hiremate.HRockmate(model, x, 0.5, cache=False, calibrate=0)
    seen: list[str] = []

    def recording(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    try:
        out = torch.compile(wrapper, backend=recording)(x)
        out.square().sum().backward()
    finally:
        torch._dynamo.reset()
    assert not [t for t in seen if "linear" in t or "gelu" in t]
    twin = copy.deepcopy(model)
    expected = twin(x)
    expected.square().sum().backward()
    assert torch.equal(out, expected)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad), name
