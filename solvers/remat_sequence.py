"""Compute sequences: the common output of the general-graph heuristics (TW-Remat, FastSA).

Both heuristics decide only *which compute nodes run, in which order* (a node may appear several
times: that is recomputation). Where to free memory then follows from the sequence alone: a
value is freed right after its last use before it is produced again (FastSA's lifetime
function ``L_S``). Keeping that rule in one place means both solvers, their tests and the
simulator agree on memory: the schedule returned by :func:`sequence_to_schedule` is exactly what
``hiremate.simulate`` replays.

:func:`option_from_schedule` cuts a whole-subgraph schedule at the loss node into the forward and
backward parts of an :class:`~hiremate.option.Option`, for menus.
"""

from __future__ import annotations

import math
from typing import Sequence

from hiremate.errors import SolverError
from hiremate.graph import FINAL_KINDS, SOURCE_KINDS, DataKind, Graph
from hiremate.option import Option
from hiremate.schedule import Compute, Delete, Schedule


def kept_data(graph: Graph) -> set[int]:
    """Data a schedule may never free: model outputs and the gradients required at the end."""
    return set(graph.outputs) | {d.id for d in graph.data if d.kind in FINAL_KINDS}


def sequence_to_schedule(graph: Graph, sequence: Sequence[int]) -> Schedule:
    """Turn a sequence of compute-node ids into a schedule with the frees it implies.

    Each produced copy of a value is freed right after its last reader that runs before the
    value is produced again (or right after its production when nothing reads that copy).
    Sources are never freed; model outputs and final gradients are kept to the end.
    Validity (inputs alive) is not checked here: ``hiremate.simulate`` does that.
    """
    nodes = graph.nodes
    data = graph.data
    keep = kept_data(graph)
    skip = [d.kind in SOURCE_KINDS or d.id in keep for d in data]
    # walk backwards: a value is freed after position i if i is its last use before the next
    # production (seen later in the sequence), i.e. the first time we meet it going backwards
    # since its last production.
    frees_after: list[list[int]] = [[] for _ in sequence]
    pending = [True] * len(data)  # True: no use of the current copy seen yet (going backwards)
    for i in range(len(sequence) - 1, -1, -1):
        node = nodes[sequence[i]]
        for d in node.outputs:
            if not skip[d] and pending[d]:
                frees_after[i].append(d)  # a copy that nothing reads: free at once
            pending[d] = True
        for d in node.inputs:
            if not skip[d] and pending[d]:
                frees_after[i].append(d)
                pending[d] = False
    steps: list[Compute | Delete] = []
    for i, nid in enumerate(sequence):
        steps.append(Compute(nid))
        steps.extend(Delete(d) for d in sorted(set(frees_after[i])))
    return tuple(steps)


def interface_data(graph: Graph) -> set[int]:
    """Data of a subgraph that the level above accounts for: outputs and boundary gradients."""
    iface = set(graph.outputs)
    iface.update(graph.nodes[graph.loss].outputs)
    iface.update(d.id for d in graph.data if d.kind in (DataKind.INPUT_GRAD, DataKind.TANGENT))
    return iface


def option_from_schedule(graph: Graph, schedule: Schedule, solver: str = "") -> Option:
    """Cut a whole-graph schedule of a subgraph at its loss step into an :class:`Option`.

    The loss step itself belongs to the level above and is in neither part. Memory figures
    exclude the interface (:func:`interface_data`); the phantom is what is alive, above the
    interface, when the forward part ends.
    """
    loss = graph.loss
    cut = [i for i, s in enumerate(schedule) if isinstance(s, Compute) and s.node == loss]
    if len(cut) != 1:
        raise SolverError(
            f"a subgraph schedule must run the loss node exactly once, found {len(cut)} times"
        )
    iface = interface_data(graph)
    counted = [0 if (d.id in iface or not d.counted) else d.size for d in graph.data]
    alive = [d.kind in SOURCE_KINDS for d in graph.data]
    memory = 0
    phases: list[tuple[list, list[int], list[float], list[int]]] = []
    steps: list = []
    profile: list[int] = []
    times: list[float] = []
    peak = [0]

    def close() -> None:
        phases.append((steps.copy(), profile.copy(), times.copy(), peak.copy()))
        steps.clear(), profile.clear(), times.clear()
        peak[0] = memory

    for i, step in enumerate(schedule):
        if i == cut[0]:
            close()
            node = graph.nodes[loss]
            for d in node.outputs:
                if not alive[d]:
                    alive[d] = True
                    memory += counted[d]
            peak[0] = memory
            continue
        steps.append(step)
        if isinstance(step, Compute):
            node = graph.nodes[step.node]
            during = memory + sum(counted[d] for d in node.outputs) + node.overhead
            peak[0] = max(peak[0], during)
            for d in node.outputs:
                if not alive[d]:
                    alive[d] = True
                    memory += counted[d]
            times.append(node.time)
        else:
            if alive[step.data]:
                alive[step.data] = False
                memory -= counted[step.data]
        profile.append(memory)
        peak[0] = max(peak[0], memory)
    fwd_steps, fwd_prof, fwd_times, fwd_peak = phases[0]
    phantom = fwd_prof[-1] if fwd_prof else 0
    return Option(
        fwd=tuple(fwd_steps), bwd=tuple(steps), fwd_time=math.fsum(fwd_times),
        bwd_time=math.fsum(times), fwd_peak=fwd_peak[0], bwd_peak=peak[0], phantom=phantom,
        fwd_profile=tuple(fwd_prof), bwd_profile=tuple(profile), solver=solver,
    )
