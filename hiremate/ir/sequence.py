"""Compute sequences: the common output of the general-graph heuristics (TW-Remat, FastSA).

Both heuristics decide only *which compute nodes run, in which order* (a node may appear several
times: that is recomputation). Where to free memory then follows from the sequence alone: a
value is freed right after its last use before it is produced again (the lifetime function
``L_S`` of "A fast heuristic to optimize time-space tradeoff for large models", section 2.1).
Keeping that rule in one place means both solvers, their tests and the simulator agree on
memory: the schedule returned by :func:`sequence_to_schedule` is exactly what
``hiremate.simulate`` replays. Menus cut such schedules into options with the shared
``hiremate.solvers.menu.option_from_schedule``, so every solver's options mean the same.
"""

from __future__ import annotations

from typing import Sequence

from hiremate.ir.graph import FINAL_KINDS, SOURCE_KINDS, Graph
from hiremate.ir.schedule import Compute, Delete, Schedule


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


def complete_effects(graph: Graph, schedule: Schedule) -> Schedule:
    """``schedule`` with the buffer writes it never computes, and whose only effect is to write
    a buffer (:func:`~hiremate.ir.tracker.is_effect_only`, such as BatchNorm's
    ``num_batches_tracked += 1``), run just before the loss node: every call then updates
    every buffer once, as eager PyTorch does. The executor runs this schedule, so the composer
    ranks and reports candidates by it too (their time includes these nodes, as autodiff's
    does). Other skipped buffer writes are left for the simulator to refuse; the same object
    comes back when nothing is missing."""
    from hiremate.ir.tracker import is_effect_only

    steps = tuple(schedule)
    computed = {s.node for s in steps if isinstance(s, Compute)}
    missing = [n for n in graph.nodes if n.is_fwd and n.mutates and n.id not in computed
               and is_effect_only(graph, n)]
    loss_at = next((i for i, s in enumerate(steps)
                    if isinstance(s, Compute) and s.node == graph.loss), None)
    if not missing or loss_at is None:
        return schedule
    return steps[:loss_at] + tuple(Compute(n.id) for n in missing) + steps[loss_at:]


def drop_unused_recomputations(graph: Graph, schedule: Schedule) -> Schedule:
    """``schedule`` without the recomputations that nothing needs: a node run again (never its
    first run) each of whose outputs is either still alive from an earlier run (which then
    serves every later read) or, before any step reads it, deleted or made again. Such steps
    come from whole subgraph forwards rerun for one of their values (a menu option's
    sequence) and cost their time for nothing; the Deletes that freed their own copies go with
    them, until none is left (a dropped step may have been the only reader of another). The
    same object comes back when nothing is dropped; the caller simulates the result (it is
    valid whenever the input was, and no step of it holds more memory)."""
    out = schedule
    while True:
        shorter = _drop_once(graph, out)
        if shorter is out:
            return out
        out = shorter


def _drop_once(graph: Graph, schedule: Schedule) -> Schedule:
    """One forward pass of :func:`drop_unused_recomputations`."""
    steps = tuple(schedule)
    alive: set[int] = set()
    seen: set[int] = set()
    dropped: set[int] = set()
    for i, step in enumerate(steps):
        if i in dropped:
            continue
        if isinstance(step, Delete):
            alive.discard(step.data)
            continue
        node = graph.nodes[step.node]
        if step.node in seen and node.outputs and step.node != graph.loss:
            frees = _frees_if_unneeded(graph, steps, i, node.outputs, alive, dropped)
            if frees is not None:
                dropped.add(i)
                dropped.update(frees)
                continue
        seen.add(step.node)
        alive.update(node.outputs)
    if not dropped:
        return schedule
    return tuple(s for i, s in enumerate(steps) if i not in dropped)


def _frees_if_unneeded(graph: Graph, steps: tuple, at: int, outputs: Sequence[int],
                       alive: set[int], dropped: set[int]) -> list[int] | None:
    """For the Compute at ``at``: the Deletes of its own copies to drop with it when none of
    its ``outputs`` is needed (see :func:`drop_unused_recomputations`), else None."""
    frees: list[int] = []
    for d in outputs:
        if d in alive:  # the earlier copy serves the reads; its Delete stays
            continue
        for j in range(at + 1, len(steps)):
            if j in dropped:
                continue
            step = steps[j]
            if isinstance(step, Delete):
                if step.data == d:
                    frees.append(j)
                    break
                continue
            other = graph.nodes[step.node]
            if d in other.inputs:
                return None
            if d in other.outputs:
                break
        else:  # this copy is the one alive at the end
            return None
    return frees
