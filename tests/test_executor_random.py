"""Random nodes and buffer writes: recomputation replays the random numbers of the first
execution, the global RNG state after a call is eager's, and BatchNorm statistics are updated
exactly once per call (also when the BatchNorm node is recomputed)."""

from __future__ import annotations

import copy

import pytest
import torch

import hiremate
from hiremate.errors import InvalidScheduleError
from hiremate.runtime.executor import RematModule
from hiremate.ir.schedule import Compute, Delete, recomputations
from test_executor_util import get_model, graph_of, run_step, schedules_of

SCHEDULES = ["autodiff", "keep-none", "keep-half", "keep-third"]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name,n_random", [("dropnet", 2), ("attnlayer", 4)])
def test_dropout_same_as_eager_with_same_seed(schedule: str, name: str, n_random: int) -> None:
    """Also where dropout fills a transposed tensor (``attnlayer``): the functional form of
    ``bernoulli_`` would draw its numbers into a contiguous tensor, onto other elements."""
    graph = graph_of(name)
    assert sum(n.random for n in graph.nodes) == n_random
    sched = schedules_of(graph)[schedule]
    recomputed = {s.node for i, s in enumerate(sched) if isinstance(s, Compute)
                  and any(isinstance(t, Compute) and t.node == s.node for t in sched[:i])}
    if schedule == "keep-none":
        assert any(graph.nodes[n].random for n in recomputed), "no random node recomputed"
    model, sample = get_model(name)
    ref = copy.deepcopy(model)
    remat = RematModule(model, graph, sched)
    results = []
    for m in (ref, remat):
        torch.manual_seed(1234)
        for _ in range(2):  # the second call starts from the state the first one left
            out, grads = run_step(m, sample)
        results.append((out, [g.clone() for g in grads], torch.get_rng_state()))
    (o1, g1, s1), (o2, g2, s2) = results
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    assert torch.equal(s1, s2), "the RNG state after the calls differs from eager's"


def test_dropout_masks_differ_between_calls() -> None:
    graph = graph_of("dropnet")
    model, (x,) = get_model("dropnet")
    remat = RematModule(model, graph, schedules_of(graph)["keep-none"])
    assert not torch.equal(remat(x), remat(x))


def test_random_nodes_out_of_order_are_refused() -> None:
    graph = graph_of("twobranch")
    random_nodes = [n.id for n in graph.nodes if n.random]
    assert len(random_nodes) == 2
    sched = _latest_first_schedule(graph)
    first = [s.node for s in sched if isinstance(s, Compute) and s.node in random_nodes]
    assert first == sorted(random_nodes, reverse=True)
    # the simulator holds the executor's rule: every solver and fuzz test sees it
    res = hiremate.simulate(graph, sched)
    assert not res.valid and "random node" in res.error
    assert sched[res.step] == Compute(min(random_nodes))
    model, _ = get_model("twobranch")
    with pytest.raises(InvalidScheduleError, match="random node"):
        RematModule(model, graph, sched)


def _latest_first_schedule(graph: hiremate.Graph) -> hiremate.Schedule:
    """A valid schedule whose forward always runs the ready node of highest id (Kahn)."""
    fwd = [n for n in graph.nodes if n.is_fwd]
    done: set[int] = set()
    alive = {d.id for d in graph.data if d.producer is None}
    steps: list = []
    while len(done) < len(fwd):
        ready = [n for n in fwd if n.id not in done and all(d in alive for d in n.inputs)]
        n = max(ready, key=lambda n: n.id)
        steps.append(Compute(n.id))
        done.add(n.id)
        alive.update(n.outputs)
    steps += [Compute(n.id) for n in graph.nodes if not n.is_fwd]
    return tuple(steps)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_batchnorm_statistics_updated_once(schedule: str) -> None:
    graph = graph_of("convbn")
    sched = schedules_of(graph)[schedule]
    bn_nodes = {n.id for n in graph.nodes if any("batch_norm" in o.target and o.mutated_args
                                                 for o in n.ops)}
    assert len(bn_nodes) == 2
    if schedule == "keep-none":
        computed = [s.node for s in sched if isinstance(s, Compute) and s.node in bn_nodes]
        assert len(computed) > len(bn_nodes), "BatchNorm is never recomputed"
    model, sample = get_model("convbn")
    ref = copy.deepcopy(model)
    remat = RematModule(model, graph, sched)
    for _ in range(2):
        run_step(ref, sample)
        run_step(remat, sample)
    for (name, b), c in zip(model.named_buffers(), ref.buffers()):
        assert torch.equal(b, c), name
    assert [b.item() for n, b in model.named_buffers() if "num_batches" in n] == [2, 2]


def test_recomputation_of_dropout_keeps_memory_prediction() -> None:
    graph = graph_of("dropnet")
    sched = schedules_of(graph)["keep-none"]
    assert recomputations(sched) > 0 and any(isinstance(s, Delete) for s in sched)
    model, (x,) = get_model("dropnet")
    remat = RematModule(model, graph, sched)
    m = hiremate.measure(remat, x, repeats=1, warmup=0)
    assert m.peak <= remat.predicted.peak * 1.05 + 2 ** 20


def test_generator_state_saved_only_for_recomputed_random_nodes() -> None:
    """Store-everything runs each random node once: no generator state is saved (5 KiB each on
    CPU, which the cost model does not count); a schedule that recomputes dropout saves one
    state per recomputed random node, and no more."""
    graph = graph_of("dropnet")
    model, _ = get_model("dropnet")
    for name in ("autodiff", "keep-none"):
        sched = schedules_of(graph)[name]
        runs: dict[int, int] = {}
        for s in sched:
            if isinstance(s, Compute):
                runs[s.node] = runs.get(s.node, 0) + 1
        again = {k for k, n in runs.items() if n > 1 and graph.nodes[k].random}
        fwd_src, bwd_src = RematModule(model, graph, sched).generated_source()
        assert fwd_src.count("_rng_save(") == len(again), name
        assert bwd_src.count("_rng_replay(") + fwd_src.count("_rng_replay(") >= len(again)
    assert again, "keep-none recomputes no random node: the test would prove nothing"


def test_generator_state_released_after_the_last_replay() -> None:
    """A saved generator state lives until the last recomputation of its node, then goes: the
    program releases each one once, after that node's last replay, and a call keeps none."""
    graph = graph_of("dropnet")
    model, (x,) = get_model("dropnet")
    sched = schedules_of(graph)["keep-none"]
    remat = RematModule(model, graph, sched)
    fwd_src, bwd_src = remat.generated_source()
    source = fwd_src + bwd_src
    saved = source.count("_rng_save(")
    assert saved > 0 and source.count("_rng_release(") == saved
    for line in source.splitlines():
        if "_rng_release(" in line:
            k = line.split("(C, ")[1].rstrip(")")
            after = source[source.index(line):]
            assert f"_rng_replay(C, {k})" not in after, f"state {k} replayed after its release"
    # every call state the program saved into holds no generator state after the backward
    import hiremate.runtime.codegen as codegen
    from hiremate.runtime.rng import rng_save

    calls = []

    def spy(call, k):
        calls.append(call)
        rng_save(call, k)

    namespace = codegen._namespace
    codegen._namespace = lambda: {**namespace(), "_rng_save": spy}
    try:
        remat._programs.clear()
        remat(x).sum().backward()
    finally:
        codegen._namespace = namespace
    assert calls and all(call.rng == {} for call in calls)
