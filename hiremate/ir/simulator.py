"""The simulator: the single source of truth for a schedule's validity, peak memory and time.

Memory model (docs/design.md, "Memory accounting"): only data of the kinds in ``COUNTED_KINDS``
count; parameters, buffers, user inputs and parameter gradients do not. While a compute node
runs, memory holds what is alive, all of the node's outputs (a recomputed output that is still
alive counts twice until the step ends) and the node's temporary overhead. The model's outputs
belong to the caller once produced: a schedule may not delete them.

The rules live in one place, :class:`hiremate.ir.tracker.MemoryTracker`; :func:`simulate` runs it
over a schedule, checking every step first, and :func:`trace` replays a schedule's memory step by
step without judging it (the validity rules are listed in :mod:`hiremate.ir.tracker`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from hiremate.errors import InvalidScheduleError
from hiremate.ir.buffer_writes import snapshot_spans
from hiremate.ir.graph import DataKind, Graph
from hiremate.ir.schedule import Compute, Delete, Schedule
from hiremate.ir.tracker import MemoryTracker, Trace, memory_floor


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """What the simulator predicts for a schedule.

    ``valid`` is False when some step cannot run; ``error`` then says why and ``step`` is the
    index of the first invalid step. ``profile[i]`` is the memory held after step ``i``;
    ``trace`` (when asked for) has the memory during each step and what each step freed.
    """

    valid: bool
    peak: int
    time: float
    error: str | None = None
    step: int | None = None
    peak_step: int | None = None
    profile: tuple[int, ...] = ()
    trace: Trace | None = None

    def raise_if_invalid(self) -> "SimulationResult":
        if not self.valid:
            raise InvalidScheduleError(f"invalid schedule: {self.error}", step=self.step)
        return self


def simulate(graph: Graph, schedule: Schedule, trace: bool = False) -> SimulationResult:
    """Replay ``schedule`` on ``graph``; return validity, predicted peak memory and time (and,
    with ``trace``, the per-step :class:`~hiremate.ir.tracker.Trace`, up to the first invalid
    step)."""
    tracker = MemoryTracker(graph, record=trace)
    try_step = tracker.try_step

    def result(error: str | None = None, step: int | None = None) -> SimulationResult:
        return SimulationResult(
            valid=error is None, peak=tracker.peak, time=tracker.time, error=error, step=step,
            peak_step=tracker.peak_step, profile=tracker.profile,
            trace=tracker.trace() if trace else None,
        )

    for i, step in enumerate(schedule):
        why = try_step(step)
        if why is not None:
            return result(f"step {i} ({step}): {why}", i)
    end = len(schedule)
    why = tracker.end_refusal()
    if why is not None:
        return result(f"end of schedule (step {end}): {why}", end)
    return result()


def replay_state_bytes(graph: Graph) -> int:
    """The generator states a call keeps from the start of its forward to the end of its
    backward when the graph gives some differentiable outputs no tangent
    (``meta["untangented_outputs"]``) and has random ops: a backward that reaches such an
    output runs the call again from them (:mod:`hiremate.runtime.executor`). Counted as the
    other states are: the CPU generator's, on the CPU."""
    per_state = int(graph.meta.get("rng_state_bytes", 0) or 0)
    if per_state and graph.meta.get("untangented_outputs") and any(n.random
                                                                   for n in graph.nodes):
        return per_state
    return 0


def step_peak(graph: Graph, schedule: Schedule, loss_bytes: int = 0, *,
              rng_states: bool = True) -> int:
    """The peak of a whole training step that runs ``schedule``: the simulator's, plus what
    the executor holds that the solvers' memory models leave out (:func:`hiremate.api.solve_graph`
    leaves room for it):

    - what the user's loss allocates between the forward and the backward beyond the output
      gradients the graph already counts (``loss_bytes``, added at the loss node's step);
    - the output gradients (tangents) the schedule deletes: autograd hands them to the
      executor's backward and holds them until that backward returns, so a ``Delete`` of one
      ends its use but frees nothing; each counts from its delete to the end of the schedule;
    - with ``rng_states``, the random-generator states the executor keeps: before the first
      run of a random node that the schedule runs again, it saves the generator state
      (``graph.meta["rng_state_bytes"]``: the CPU generator's, a few KiB, counted when the
      model runs on the CPU; a GPU's is kept in host memory) and frees it after the last
      rerun; during a rerun it also holds the state it interrupted; and the states of the
      call's start, through the whole step, when a backward may have to run the call again
      (:func:`replay_state_bytes`);
    - the copies of buffers that the forward writes, kept for the steps that read the value
      from before the write (:mod:`hiremate.ir.buffer_writes`)."""
    per_state = int(graph.meta.get("rng_state_bytes", 0) or 0) if rng_states else 0
    replay = replay_state_bytes(graph) if rng_states else 0
    data = graph.data
    tangent_deletes = [(i, data[step.data].size) for i, step in enumerate(schedule)
                       if isinstance(step, Delete) and 0 <= step.data < len(data)
                       and data[step.data].kind is DataKind.TANGENT]
    snapshots = snapshot_spans(graph, schedule)
    sim = simulate(graph, schedule, trace=per_state > 0 or loss_bytes > 0 or bool(
        tangent_deletes) or replay > 0 or bool(snapshots))
    if sim.trace is None:
        return sim.peak
    held = [0] * (len(schedule) + 1)  # a difference array over the steps
    for buffer, first, last in snapshots:
        held[first] += buffer.size
        held[last + 1] -= buffer.size
    for i, size in tangent_deletes:
        held[i] += size
    runs: dict[int, list[int]] = {}
    random_nodes = {n.id for n in graph.nodes if n.random} if per_state else set()
    for i, step in enumerate(schedule):
        if isinstance(step, Compute) and step.node in random_nodes:
            runs.setdefault(step.node, []).append(i)
    rerun: set[int] = set()
    for steps in runs.values():
        if len(steps) > 1:
            held[steps[0]] += per_state
            held[steps[-1] + 1] -= per_state
            rerun.update(steps[1:])
    loss_steps = {i for i, step in enumerate(schedule)
                  if isinstance(step, Compute) and step.node == graph.loss}
    peak, running = sim.trace.start + replay, replay
    for i, during in enumerate(sim.trace.during):
        running += held[i]
        # a rerun also keeps the state it interrupts, to continue from it afterwards
        extra = (per_state if i in rerun else 0) + (loss_bytes if i in loss_steps else 0)
        peak = max(peak, during + running + extra)
    return peak


def trace(graph: Graph, schedule: Schedule, alive: Iterable[int] | None = None) -> Trace:
    """Memory during and after each step of ``schedule`` and what each step frees, by the
    simulator's rule, without checking validity (a part of a schedule, a block's option, a
    replay from ``alive`` instead of the sources)."""
    tracker = MemoryTracker(graph, alive=alive, record=True)
    for step in schedule:
        tracker.step(step)
    return tracker.trace()


def autodiff_schedule(graph: Graph) -> Schedule:
    """The store-everything schedule: every node once in order, each datum freed after its
    last reader (what eager PyTorch does)."""
    last_use: dict[int, int] = {}
    for d in graph.data:
        users = graph.users(d.id)
        if d.producer is not None:
            last_use[d.id] = users[-1] if users else d.producer
    keep = set(graph.outputs) | set(graph.final_data)
    frees: dict[int, list[int]] = {}
    for d, node in last_use.items():
        if d not in keep:
            frees.setdefault(node, []).append(d)
    steps: list[Compute | Delete] = []
    for node in graph.nodes:
        steps.append(Compute(node.id))
        steps.extend(Delete(d) for d in sorted(frees.get(node.id, ())))
    return tuple(steps)


def step_memory_floor(graph: Graph, loss_bytes: int = 0) -> int:
    """A lower bound on :func:`step_peak` for every schedule that runs the graph's nodes first
    in the graph's order: :func:`hiremate.ir.tracker.memory_floor`, and the loss's step, where
    every model output, the output gradients it produces and what the loss allocates are in
    memory at once. A budget below it cannot be met by recomputing more."""
    if graph.loss is None:  # no loss step: nothing is known to be held at once
        return memory_floor(graph)
    at_loss = sum(graph.data[o].size for o in graph.outputs) + graph.tangent_bytes + loss_bytes
    return max(memory_floor(graph), at_loss)


def gradients_once_floor(graph: Graph, loss_bytes: int = 0) -> int:
    """:func:`step_memory_floor` for the schedules that also make each gradient once (run every
    backward node once), as every hiremate solver but H-ILP does (H-ILP may recompute one).

    While backward node ``b`` runs, its inputs, outputs and overhead, the model outputs and
    every gradient produced before ``b`` and read after it (or kept to the end) are in memory:
    a gradient freed early could only come back by running its producer again. A residual
    block's skip gradient, held while the branch's backward runs, is the usual one. A schedule
    that recomputes gradients can go below this figure, but never below
    :func:`step_memory_floor`."""
    floor = step_memory_floor(graph, loss_bytes)
    if graph.loss is None:
        return floor
    counted = [d.size if d.counted else 0 for d in graph.data]
    nodes = graph.nodes
    finals = set(graph.final_data)
    spans: list[tuple[int, int, int]] = []  # (producer, last node that needs it, gradient)
    for d in graph.data:
        p = d.producer
        if p is None or nodes[p].is_fwd or not counted[d.id]:
            continue
        users = graph.users(d.id)
        spans.append((p, len(nodes) if d.id in finals else (users[-1] if users else p), d.id))
    outs = set(graph.outputs)
    for node in nodes:
        if node.is_bwd:
            held = set(node.inputs) | outs | {d for p, stop, d in spans if p < node.id < stop}
            floor = max(floor, MemoryTracker(graph, alive=held, sizes=counted).during(node.id))
    return floor
