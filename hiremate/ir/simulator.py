"""The simulator: the single source of truth for a schedule's validity, peak memory and time.

Memory model (DESIGN.md, "Memory accounting"): only data of the kinds in ``COUNTED_KINDS``
count; parameters, buffers, user inputs and parameter gradients do not. While a compute node
runs, memory holds what is alive, all of the node's outputs (a recomputed output that is still
alive counts twice until the step ends) and the node's temporary overhead. The model's outputs
belong to the caller once produced: a schedule may not delete them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hiremate.errors import InvalidScheduleError
from hiremate.ir.graph import SOURCE_KINDS, DataKind, Graph
from hiremate.ir.schedule import Compute, Delete, Schedule


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """What the simulator predicts for a schedule.

    ``valid`` is False when some step cannot run; ``error`` then says why and ``step`` is the
    index of the first invalid step. ``profile[i]`` is the memory held after step ``i``.
    """

    valid: bool
    peak: int
    time: float
    error: str | None = None
    step: int | None = None
    peak_step: int | None = None
    profile: tuple[int, ...] = ()

    def raise_if_invalid(self) -> "SimulationResult":
        if not self.valid:
            raise InvalidScheduleError(f"invalid schedule: {self.error}", step=self.step)
        return self


def simulate(graph: Graph, schedule: Schedule) -> SimulationResult:
    """Replay ``schedule`` on ``graph``; return validity, predicted peak memory and time."""
    data = graph.data
    nodes = graph.nodes
    alive = [d.kind in SOURCE_KINDS for d in data]
    counted = [d.size if d.counted else 0 for d in data]
    protected = set(graph.outputs)
    memory = 0
    peak = 0
    peak_step: int | None = None
    times: list[float] = []
    profile: list[int] = []
    loss_done = False

    def fail(i: int, why: str) -> SimulationResult:
        return SimulationResult(
            valid=False, peak=peak, time=math.fsum(times), error=f"step {i} ({schedule[i]}): {why}",
            step=i, peak_step=peak_step, profile=tuple(profile),
        )

    for i, step in enumerate(schedule):
        if isinstance(step, Compute):
            if not 0 <= step.node < len(nodes):
                return fail(i, f"there is no compute node {step.node}")
            if step.option is not None:
                return fail(i, f"node {step.node} is a plain compute node and takes no option")
            node = nodes[step.node]
            missing = [data[d].name for d in node.inputs if not alive[d]]
            if missing:
                phase = "backward " if node.is_bwd else ""
                return fail(
                    i, f"{phase}node {node.name!r} needs {', '.join(repr(m) for m in missing)}, "
                    "which is not in memory (never computed, or deleted)",
                )
            if node.is_loss:
                if loss_done:
                    return fail(i, "the loss node runs twice")
                loss_done = True
            elif node.is_bwd and not loss_done:
                uses_grad = any(
                    data[d].kind in (DataKind.TANGENT, DataKind.GRAD) for d in node.inputs
                )
                if uses_grad or not node.inputs:
                    return fail(i, f"backward node {node.name!r} runs before the loss node")
            during = memory + sum(counted[d] for d in node.outputs) + node.overhead
            if during > peak:
                peak, peak_step = during, i
            for d in node.outputs:
                if not alive[d]:
                    alive[d] = True
                    memory += counted[d]
            times.append(node.time)
        elif isinstance(step, Delete):
            d = step.data
            if not 0 <= d < len(data):
                return fail(i, f"there is no data node {d}")
            if data[d].kind in SOURCE_KINDS:
                return fail(i, f"{data[d].name!r} is a {data[d].kind.value}: it cannot be deleted")
            if d in protected:
                return fail(i, f"{data[d].name!r} is a model output, owned by the caller")
            if not alive[d]:
                return fail(i, f"{data[d].name!r} is not in memory")
            alive[d] = False
            memory -= counted[d]
        else:
            return fail(i, f"unknown step type {type(step).__name__}")
        profile.append(memory)
        if memory > peak:
            peak, peak_step = memory, i

    end = len(schedule)
    if not loss_done:
        return SimulationResult(
            valid=False, peak=peak, time=math.fsum(times), step=end, peak_step=peak_step,
            error=f"end of schedule (step {end}): the loss node never ran", profile=tuple(profile),
        )
    missing = [data[d].name for d in graph.final_data if not alive[d]]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
        return SimulationResult(
            valid=False, peak=peak, time=math.fsum(times), step=end, peak_step=peak_step,
            error=f"end of schedule (step {end}): gradients missing: {shown}",
            profile=tuple(profile),
        )
    return SimulationResult(
        valid=True, peak=peak, time=math.fsum(times), peak_step=peak_step, profile=tuple(profile)
    )


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
