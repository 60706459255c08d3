"""A simple generic generator of recomputing schedules, for the executor's tests.

``keep_schedule(graph, keep)``: the forward computes every forward node in order and keeps
only the activations in ``keep`` (and the model's outputs), freeing the others after their
last forward use; the backward computes the backward nodes in order and, before each one,
recomputes its missing inputs by recursively recomputing their producers, freeing what no
later backward node reads. It is deliberately independent of the solvers, so that the
executor is tested on schedules no solver was tuned for; the simulator checks each one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from hiremate import autodiff_schedule, simulate
from hiremate.ir.graph import SOURCE_KINDS, DataKind, Graph
from hiremate.ir.schedule import Compute, Delete, Schedule, recomputations
from hiremate.testing.synthetic import chain_graph, random_graph


def keep_schedule(graph: Graph, keep: Iterable[int] | Callable[[int], bool]) -> Schedule:
    """See the module docstring; ``keep`` is a set of data ids or a predicate on them."""
    keep_fn = keep if callable(keep) else set(keep).__contains__
    data, nodes = graph.data, graph.nodes
    protected = set(graph.outputs) | set(graph.final_data)
    alive = {d.id for d in data if d.kind in SOURCE_KINDS}
    steps: list[Compute | Delete] = []
    fwd = [n for n in nodes if n.is_fwd]
    bwd = [n for n in nodes if n.is_bwd]

    def free(d: int) -> None:
        alive.discard(d)
        steps.append(Delete(d))

    last_fwd_use: dict[int, int] = {}
    for n in fwd:
        for d in n.inputs:
            last_fwd_use[d] = n.id
    for n in fwd:
        steps.append(Compute(n.id))
        alive.update(n.outputs)
        for d in n.outputs + n.inputs:
            if (d in alive and data[d].producer is not None and d not in protected
                    and not keep_fn(d) and last_fwd_use.get(d, -1) <= n.id):
                free(d)
    loss = nodes[graph.loss]
    steps.append(Compute(loss.id))
    alive.update(loss.outputs)

    def ensure(d: int) -> None:
        if d in alive:
            return
        producer = nodes[data[d].producer]
        for i in producer.inputs:
            ensure(i)
        steps.append(Compute(producer.id))
        alive.update(producer.outputs)

    for n in bwd:
        for d in n.inputs:
            ensure(d)
        steps.append(Compute(n.id))
        alive.update(n.outputs)
        later = {d for m in bwd if m.id > n.id for d in m.inputs}
        for d in sorted(alive):
            if data[d].producer is not None and d not in protected and d not in later:
                free(d)
    return tuple(steps)


def activations(graph: Graph) -> list[int]:
    return [d.id for d in graph.data if d.kind is DataKind.ACTIVATION]


def recomputing_schedules(graph: Graph) -> dict[str, Schedule]:
    """Three schedules that recompute: keep nothing, keep every other activation, keep every
    third one (in data order)."""
    acts = activations(graph)
    return {
        "keep-none": keep_schedule(graph, ()),
        "keep-half": keep_schedule(graph, acts[::2]),
        "keep-third": keep_schedule(graph, acts[1::3]),
    }


@pytest.mark.parametrize("seed", range(8))
def test_generator_gives_valid_recomputing_schedules(seed: int) -> None:
    graph = (random_graph(seed, 12, n_inputs=2) if seed % 2
             else chain_graph([4, 8, 2, 6, 3, 5], [1.0, 2.0, 1.0, 3.0, 1.0, 2.0]))
    base = simulate(graph, autodiff_schedule(graph)).raise_if_invalid()
    for name, sched in recomputing_schedules(graph).items():
        res = simulate(graph, sched).raise_if_invalid()
        assert res.time >= base.time - 1e-9
        assert (res.time > base.time) == (recomputations(sched) > 0)


def test_keep_everything_is_autodiff_peak() -> None:
    graph = chain_graph([4, 8, 2, 6, 3], [1.0] * 5)
    sched = keep_schedule(graph, activations(graph))
    assert recomputations(sched) == 0
    assert simulate(graph, sched).peak == simulate(graph, autodiff_schedule(graph)).peak
