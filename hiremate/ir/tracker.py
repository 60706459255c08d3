"""The memory model, step by step: one implementation of the simulator's rules.

:class:`MemoryTracker` is fed the steps of a schedule one at a time. It answers the memory held
now, the peak so far, what a compute step would hold while it runs, and whether a step may run
(the validity rules, :meth:`MemoryTracker.refusal`). :func:`hiremate.ir.simulator.simulate` is
this tracker run over a whole schedule, and every solver that needs per-step figures (option
summaries, H-ILP's warm starts, the grouping of FastSA, the tails of the chain solvers) feeds a
tracker instead of writing the rule again.

The step rule (docs/design.md, "Memory accounting"): only the sizes of counted data (see
:data:`~hiremate.ir.graph.COUNTED_KINDS`) count. While compute node ``k`` runs, memory is what is
alive plus *all* of ``k``'s outputs (a recomputed output still alive counts twice until the step
ends) plus ``k``'s temporary overhead; after it, the outputs that were not alive are added. A
delete frees its datum.

The validity rules are those of the executor (``hiremate.runtime``), so that a schedule the
simulator accepts is one :class:`~hiremate.runtime.executor.RematModule` runs: inputs alive, the
loss once and before any backward node that reads a gradient, sources and model outputs never
deleted, gradients present at the end; random nodes first computed in the graph's order (a
recomputation replays the numbers of the first execution, so first executions must draw in the
order eager PyTorch draws) and every random forward node computed; every buffer-writing forward
node computed, unless it is an effect the executor adds by itself (:func:`is_effect_only`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, Union

from hiremate.errors import HiremateError
from hiremate.ir.graph import SOURCE_KINDS, ComputeNode, DataKind, Graph, NodeKind
from hiremate.ir.schedule import Compute, Delete, Step

Sizes = Union[Sequence[int], Mapping[int, int]]
_LOSS, _BWD = NodeKind.LOSS, NodeKind.BWD


def counted_sizes(graph: Graph) -> list[int]:
    """Bytes each data node adds to memory: its size when its kind is counted, else 0."""
    return [d.size if d.counted else 0 for d in graph.data]


def is_effect_only(graph: Graph, node: ComputeNode) -> bool:
    """A forward buffer write with no output, no randomness and only sources as inputs (BatchNorm's
    ``num_batches_tracked += 1``): the executor runs it once by itself when a schedule skips it."""
    return (not node.outputs and not node.random
            and all(graph.data[d].producer is None for d in node.inputs))


@dataclass(frozen=True, slots=True)
class Trace:
    """Per step of a schedule: the highest memory while it runs (for a delete, the memory after
    it), the memory after it, and the data it freed (a delete's datum; nothing for a compute)."""

    during: tuple[int, ...]
    after: tuple[int, ...]
    freed: tuple[tuple[int, ...], ...]
    start: int = 0

    @property
    def peak(self) -> int:
        """Highest memory over the steps (the memory before the first step included)."""
        return max(self.start, max(self.during, default=self.start))


class MemoryTracker:
    """Incremental replay of a schedule on ``graph`` under the simulator's rules.

    ``alive``: the data alive at the start (default: the sources, as at the start of a
    schedule). ``sizes``: bytes per data id (default :func:`counted_sizes`); a mapping that
    covers the data the steps touch lets a replay of a few nodes skip the whole graph (zero
    sizes leave a datum out of the figures). ``record``: keep a :class:`Trace` of the steps.

    :meth:`compute` and :meth:`delete` apply a step without checking it (a solver replaying its
    own schedule); :meth:`refusal` says why a step may not run, and :meth:`end_refusal` why
    the schedule may not end here (the simulator checks each step before applying it).
    """

    __slots__ = ("graph", "_nodes", "_data", "sizes", "alive", "memory", "peak", "peak_step",
                 "steps", "times", "computed", "loss_done", "last_random", "_outputs", "_start",
                 "_during", "_after", "_freed")

    def __init__(self, graph: Graph, alive: Iterable[int] | None = None,
                 sizes: Sizes | None = None, record: bool = False):
        self.graph = graph
        self._nodes = graph.nodes
        self._data = graph.data
        self.sizes: Sizes = counted_sizes(graph) if sizes is None else sizes
        if alive is None:
            self.alive: set[int] = {d.id for d in graph.data if d.kind in SOURCE_KINDS}
            self.memory = 0  # sources are never counted
        else:
            self.alive = set(alive)
            self.memory = sum(self.sizes[d] for d in self.alive)
        self.peak = self.memory
        self.peak_step: int | None = None
        self.steps = 0
        self.times: list[float] = []
        self.computed: set[int] = set()
        self.loss_done = False
        self.last_random = -1  # the latest random node computed so far (first executions)
        self._outputs: frozenset[int] | None = None  # model outputs, made on the first delete
        self._start = self.memory
        self._during: list[int] | None = [] if record else None
        self._after: list[int] = []
        self._freed: list[tuple[int, ...]] = []

    # -- the step rule ---------------------------------------------------------------------------
    def during(self, node: int) -> int:
        """Memory while compute node ``node`` would run now: alive data, all its outputs, its
        overhead."""
        nd = self._nodes[node]
        sizes = self.sizes
        return self.memory + sum(sizes[d] for d in nd.outputs) + nd.overhead

    def compute(self, node: int) -> int:
        """Run compute node ``node``; return the memory while it ran."""
        nd = self._nodes[node]
        sizes, alive = self.sizes, self.alive
        mem = self.memory
        during = mem + sum(sizes[d] for d in nd.outputs) + nd.overhead
        for d in nd.outputs:
            if d not in alive:
                alive.add(d)
                mem += sizes[d]
        self.memory = mem
        if nd.kind is _LOSS:
            self.loss_done = True
        if nd.random and node not in self.computed and node > self.last_random:
            self.last_random = node
        self.computed.add(node)
        self.times.append(nd.time)
        if during > self.peak:
            self.peak, self.peak_step = during, self.steps
        if self._during is not None:
            self._during.append(during)
            self._freed.append(())
        self._after.append(mem)
        self.steps += 1
        return during

    def delete(self, data: int) -> None:
        """Free ``data`` (nothing changes when it is not alive)."""
        freed = data in self.alive
        if freed:
            self.alive.discard(data)
            self.memory -= self.sizes[data]
        if self._during is not None:
            self._during.append(self.memory)
            self._freed.append((data,) if freed else ())
        self._after.append(self.memory)
        self.steps += 1

    def step(self, step: Step) -> int:
        """Apply ``step``; return the memory while it ran (after it, for a delete)."""
        if isinstance(step, Compute):
            return self.compute(step.node)
        self.delete(step.data)
        return self.memory

    # -- figures ---------------------------------------------------------------------------------
    @property
    def time(self) -> float:
        """Total compute time of the steps so far."""
        return math.fsum(self.times)

    @property
    def profile(self) -> tuple[int, ...]:
        """Memory after each step so far."""
        return tuple(self._after)

    def trace(self) -> Trace:
        """The recorded steps (the tracker must have been made with ``record=True``)."""
        if self._during is None:
            raise HiremateError("MemoryTracker(record=True) keeps a trace; this one does not")
        return Trace(tuple(self._during), tuple(self._after), tuple(self._freed), self._start)

    # -- validity --------------------------------------------------------------------------------
    def refusal(self, step: Step) -> str | None:
        """Why ``step`` may not run now (None when it may)."""
        if type(step) is Compute:
            k = step.node
            nodes = self._nodes
            if step.option is not None or not 0 <= k < len(nodes):
                return self._compute_refusal(step)
            node = nodes[k]
            alive = self.alive
            for d in node.inputs:
                if d not in alive:
                    return self._compute_refusal(step)
            kind = node.kind
            if (kind is _LOSS and self.loss_done) or (kind is _BWD and not self.loss_done) or (
                    node.random and k < self.last_random and k not in self.computed):
                return self._compute_refusal(step)
            return None
        if type(step) is Delete:
            d = step.data
            outputs = self._outputs
            if outputs is None:
                outputs = self._outputs = frozenset(self.graph.outputs)
            if 0 <= d < len(self._data) and d in self.alive and d not in outputs \
                    and self._data[d].kind not in SOURCE_KINDS:
                return None
            return self._delete_refusal(d)
        return f"unknown step type {type(step).__name__}"

    def try_step(self, step: Step) -> str | None:
        """Apply ``step`` when it may run; otherwise leave the state and say why not."""
        why = self.refusal(step)
        if why is None:
            if type(step) is Delete:
                self.delete(step.data)
            else:
                self.compute(step.node)
        return why

    def _compute_refusal(self, step: Compute) -> str | None:
        nodes = self._nodes
        if not 0 <= step.node < len(nodes):
            return f"there is no compute node {step.node}"
        if step.option is not None:
            return f"node {step.node} is a plain compute node and takes no option"
        node = nodes[step.node]
        data, alive = self._data, self.alive
        missing = [data[d].name for d in node.inputs if d not in alive]
        if missing:
            phase = "backward " if node.is_bwd else ""
            return (f"{phase}node {node.name!r} needs {', '.join(repr(m) for m in missing)}, "
                    "which is not in memory (never computed, or deleted)")
        if node.is_loss:
            if self.loss_done:
                return "the loss node runs twice"
        elif node.is_bwd and not self.loss_done:
            uses_grad = any(data[d].kind in (DataKind.TANGENT, DataKind.GRAD) for d in node.inputs)
            if uses_grad or not node.inputs:
                return f"backward node {node.name!r} runs before the loss node"
        if node.random and node.id < self.last_random and node.id not in self.computed:
            return (f"it computes the random node {node.name!r} for the first time after the "
                    f"later random node {nodes[self.last_random].name!r}: random numbers would "
                    "be drawn in another order than in the model; compute random nodes first "
                    "in the graph's order")
        return None

    def _delete_refusal(self, d: int) -> str | None:
        data = self._data
        if not 0 <= d < len(data):
            return f"there is no data node {d}"
        if data[d].kind in SOURCE_KINDS:
            return f"{data[d].name!r} is a {data[d].kind.value}: it cannot be deleted"
        if d in frozenset(self.graph.outputs):
            return f"{data[d].name!r} is a model output, owned by the caller"
        if d not in self.alive:
            return f"{data[d].name!r} is not in memory"
        return None

    def end_refusal(self) -> str | None:
        """Why the schedule may not end after the steps so far (None when it may)."""
        graph = self.graph
        if not self.loss_done:
            return "the loss node never ran"
        missing = [graph.data[d].name for d in graph.final_data if d not in self.alive]
        if missing:
            shown = ", ".join(repr(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
            return f"gradients missing: {shown}"
        computed = self.computed
        skipped = [n.name for n in graph.nodes if n.random and n.is_fwd and n.id not in computed]
        if skipped:
            return (f"the schedule never computes the random node(s) {', '.join(skipped[:3])}: "
                    "the random state after a call would differ from the model's; compute every "
                    "random forward node once")
        unwritten = [n for n in graph.nodes if n.is_fwd and n.mutates and n.id not in computed
                     and not is_effect_only(graph, n)]
        if unwritten:
            n = unwritten[0]
            return (f"the schedule never computes node {n.name!r}, which writes the buffers "
                    f"{', '.join(n.mutates)}: the buffers would not be updated; compute it once "
                    "in the forward phase")
        return None


def memory_floor(graph: Graph) -> int:
    """A lower bound on the budget of any schedule that first runs the nodes in the graph's
    order (H-ILP's schedules, and every phase-form schedule): the largest of
    :func:`first_run_floors`. A solver that reorders independent nodes (FastSA) can go lower:
    a model output produced later in its order is not yet held
    (``tests/test_fuzz_solvers.py::test_reordering_forward_ops_can_beat_memory_floor``)."""
    return max(first_run_floors(graph), default=0)


def first_run_floors(graph: Graph) -> list[int]:
    """Per node, the memory while it runs for the first time in any schedule that first runs
    the nodes in the graph's order, whatever else is freed: its inputs, its outputs, its
    overhead and the model outputs produced before it (never freed) are in memory."""
    counted = counted_sizes(graph)
    outs = [o for o in graph.outputs if graph.data[o].producer is not None]
    floors = []
    for node in graph.nodes:
        held = set(node.inputs) | {o for o in outs if graph.data[o].producer < node.id}
        floors.append(MemoryTracker(graph, alive=held, sizes=counted).during(node.id))
    return floors
