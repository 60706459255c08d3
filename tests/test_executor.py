"""RematModule gives eager PyTorch's outputs, gradients and buffer updates, for the autodiff
schedule and for schedules that recompute (checked with the simulator first)."""

from __future__ import annotations

import pytest
import torch

import hiremate
from hiremate.errors import InvalidGraphError, InvalidScheduleError
from hiremate.runtime.executor import RematModule
from hiremate.runtime.codegen import generate
from hiremate.ir.schedule import Compute, recomputations
from test_executor_util import compare, get_model, graph_of, schedules_of

SCHEDULES = ["autodiff", "keep-none", "keep-half", "keep-third"]
FAST_MODELS = ["mlp", "gpt2", "resnet", "convbn", "dictout", "gather"]
SLOW_MODELS = ["small_gpt2", "neox", "vit", "transformer", "unet", "regnet", "mlpmixer", "fno1d",
               "fno3d"]


@pytest.mark.parametrize("name", FAST_MODELS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_same_as_eager_float64(name: str, schedule: str) -> None:
    remat = compare(name, schedule)
    if schedule != "autodiff":
        assert recomputations(remat.schedule) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_MODELS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_same_as_eager_float64_whole_zoo(name: str, schedule: str) -> None:
    compare(name, schedule)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_same_as_eager_float32(schedule: str) -> None:
    compare("gpt2", schedule, dtype=torch.float32, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "convbn", "small_gpt2"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_same_as_eager_float32_more(name: str, schedule: str) -> None:
    compare(name, schedule, dtype=torch.float32, rtol=1e-5, atol=1e-6)


def test_exposes_graph_schedule_prediction() -> None:
    graph = graph_of("mlp")
    sched = schedules_of(graph)["keep-half"]
    model, _ = get_model("mlp")
    remat = RematModule(model, graph, sched)
    assert remat.graph is graph and remat.schedule == sched
    assert remat.predicted == hiremate.simulate(graph, sched)
    assert list(remat.parameters()) == list(model.parameters())


def test_a_step_reads_no_graph_meta(monkeypatch) -> None:
    """``Graph.meta`` hands out a copy (a JSON round trip); a step that read it was slower by
    that copy on every call, which a small model's step time shows. The module reads what it
    needs once, when it is built."""
    from hiremate.ir.graph import Graph

    graph = graph_of("mlp")
    model, x = get_model("mlp")
    remat = RematModule(model, graph, schedules_of(graph)["keep-half"])
    remat(x).sum().backward()  # the first step generates the programs
    reads = []
    copy = Graph.meta.fget
    monkeypatch.setattr(Graph, "meta", property(lambda g: reads.append(1) or copy(g)))
    for _ in range(2):
        remat(x).sum().backward()
    assert not reads


def test_invalid_schedule_is_refused() -> None:
    graph = graph_of("mlp")
    sched = schedules_of(graph)["autodiff"]
    model, _ = get_model("mlp")
    with pytest.raises(InvalidScheduleError, match="step"):
        RematModule(model, graph, sched[1:])  # the first node never runs


def test_generated_code_holds_only_generated_names() -> None:
    graph = graph_of("gpt2")
    fwd, bwd = generate(graph, schedules_of(graph)["keep-half"], torch.device("cpu"))
    names = {d.name for d in graph.data} | {a for d in graph.data for a in d.aliases}
    for src in (fwd.source, bwd.source):
        compile(src, "<check>", "exec")
        tokens = set(src.replace("(", " ").replace(")", " ").replace(",", " ").split())
        assert not (tokens & (names - {"T", "S", "P", "I", "B", "Z", "C"}))


def test_graph_value_names_never_reach_the_code() -> None:
    """A hostile value name is mapped to a generated identifier, not pasted into the text."""
    from dataclasses import replace

    from hiremate.ir.graph import Graph, Op, Ref

    graph = graph_of("mlp")
    evil = "x; import os #"
    first = graph.nodes[0]
    old = first.ops[-1].out
    renamed = []
    for n in graph.nodes:
        ops = tuple(replace(o, out=evil if o.out == old else o.out,
                            args=_rename(o.args, old, evil)) for o in n.ops)
        renamed.append(replace(n, ops=ops))
    data = [replace(d, name=evil if d.name == old else d.name) for d in graph.data]
    meta = graph.meta
    meta["output_values"] = [evil if v == old else v for v in meta["output_values"]]
    g2 = Graph(renamed, data, graph.outputs, meta)
    fwd, bwd = generate(g2, hiremate.autodiff_schedule(g2), torch.device("cpu"))
    assert "import" not in fwd.source and "import" not in bwd.source
    assert Op and Ref  # imported names used


def _rename(args, old, new):
    from hiremate.ir.graph import Ref

    if isinstance(args, Ref):
        return Ref(new) if args.name == old else args
    if isinstance(args, (list, tuple)):
        return type(args)(_rename(a, old, new) for a in args)
    return args


def test_unknown_op_target_is_refused() -> None:
    from dataclasses import replace

    from hiremate.ir.graph import Graph

    graph = graph_of("mlp")
    nodes = list(graph.nodes)
    op = replace(nodes[0].ops[-1], target="os.system.default")
    nodes[0] = replace(nodes[0], ops=nodes[0].ops[:-1] + (op,))
    g2 = Graph(nodes, graph.data, graph.outputs, graph.meta)
    with pytest.raises(InvalidGraphError, match="os.system"):
        generate(g2, hiremate.autodiff_schedule(g2), torch.device("cpu"))


def test_skipped_buffer_update_is_added_back() -> None:
    """A schedule that never runs the num_batches_tracked update still updates it once."""
    graph = graph_of("convbn")
    only_effect = {n.id for n in graph.nodes if n.mutates and not n.outputs}
    assert only_effect
    sched = tuple(s for s in hiremate.autodiff_schedule(graph)
                  if not (isinstance(s, Compute) and s.node in only_effect))
    model, sample = get_model("convbn")
    remat = RematModule(model, graph, sched)
    remat(*sample).sum().backward()
    counts = [b.item() for n, b in model.named_buffers() if n.endswith("num_batches_tracked")]
    assert counts == [1, 1]


def test_capture_device_is_replaced_by_the_device_in_use() -> None:
    """Device constants of the graph name the capture device; the code uses the device of
    the parameters at call time (here a graph that claims capture on cuda:1, run on CPU)."""
    from hiremate.ir.graph import Graph

    graph = graph_of("gpt2")
    payload = graph.to_dict()
    text = __import__("json").dumps(payload).replace('"value": "cpu"', '"value": "cuda:1"')
    moved = Graph.from_dict(__import__("json").loads(text.replace(
        '"device": "cpu"', '"device": "cuda:1"')))
    assert "cuda:1" in moved.dumps()
    fwd, _ = generate(moved, hiremate.autodiff_schedule(moved), torch.device("cpu"))
    consts = [v for k, v in fwd.fn.__globals__.items() if k.startswith("k")]
    devices = [c for c in consts if isinstance(c, torch.device)]
    assert devices and all(d == torch.device("cpu") for d in devices)


def test_a_step_at_other_cpu_threads_than_the_build_warns_once(caplog) -> None:
    """A CPU convolution's scratch follows the intra-op thread count, so a module run at
    another count than its graph was built at warns, once; at the build's count it is quiet."""
    graph = graph_of("mlp")
    assert graph.meta["cpu_threads"] >= 1
    model, sample = get_model("mlp")
    args = (sample,) if isinstance(sample, torch.Tensor) else tuple(sample)
    built = graph.meta["cpu_threads"]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(built)
        quiet = RematModule(model, graph, schedules_of(graph)["autodiff"])
        with caplog.at_level("WARNING", logger="hiremate.runtime.executor"):
            quiet(*args).sum().backward()
        assert not [r for r in caplog.records if "intra-op threads" in r.getMessage()]
        torch.set_num_threads(built + 1)
        other = RematModule(model, graph, schedules_of(graph)["autodiff"])
        with caplog.at_level("WARNING", logger="hiremate.runtime.executor"):
            other(*args).sum().backward()
            other(*args).sum().backward()
        warned = [r for r in caplog.records if "intra-op threads" in r.getMessage()]
        assert len(warned) == 1 and f"built at {built} " in warned[0].getMessage()
    finally:
        torch.set_num_threads(before)
