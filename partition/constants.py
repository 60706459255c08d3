"""The prologue: constant forward values that the partitioners hoist before everything else.

An attention mask or a tensor of position ids is computed from the inputs' shapes (or from
inputs that need no gradient) and read by every layer. As an edge of the forward DAG such a
value links the first layer with the last, so no node in between is a 1-separator and the
sequence partitioner finds a single block for the whole stack. User inputs and parameters
already bring no dependency ("HiRemate: Hierarchical Approach for Efficient Re-materialization
of Large Neural Networks", appendix C.1.3): they are alive throughout and need no gradient. A
value whose whole ancestry needs no gradient is the same kind of thing once computed, so the
partitioners may *hoist* it: its nodes run before everything else (a *prologue*), and the
value is then an external input of the blocks that read it, kept alive by the top level.

Which nodes are constant is decided on the CD-graph (:func:`hiremate.ir.constants.constant_nodes`,
also in docs/design.md, "Constant values"); this module only chooses which of them to hoist.
Constant nodes are closed under predecessors, so any set of them closed under predecessors can
run first in a valid topological order.

Holding hoisted values costs their size from the prologue until their last reader, so the size
is bounded (:func:`prologue`): at most ``fraction`` of the bytes of all forward values, the
smallest values first. The composers count what they keep (see
:func:`hiremate.ir.blocks.long_lived`), so the bound only keeps the cost low, it is not what
makes schedules fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from .dag import ForwardDag

#: default share of all forward values' bytes that hoisted constant values may hold: a mask
#: and position ids are well below 1% of a transformer's activations; 5% leaves room for
#: models with several such tensors while bounding what every schedule must hold on to
DEFAULT_FRACTION = 0.05

def prologue(dag: "ForwardDag", fraction: float = DEFAULT_FRACTION) -> list[int]:
    """DAG nodes to hoist, sorted: constant nodes closed under predecessors, whose values read
    by the other nodes hold at most ``fraction`` of the bytes of all forward values.

    Greedy, smallest value first: a constant value read by a non-constant node joins with the
    constant nodes it depends on when the hoisted values' total still fits; ``[]`` when nothing
    fits or the DAG has no constant node.
    """
    if fraction <= 0 or not dag.constant or not any(dag.constant):
        return []
    const = dag.constant
    cap = fraction * sum(dag.value_size)
    wanted = [v for v, users in enumerate(dag.value_users)
              if const[dag.value_producer[v]]
              and (dag.value_is_output[v] or any(not const[u] for u in users))]
    if not wanted:
        return []
    wanted.sort(key=lambda v: (dag.value_size[v], v))
    _, writes = dag.node_values()
    chosen: set[int] = set()
    for v in wanted:
        if dag.value_producer[v] in chosen:
            continue
        trial = chosen | _ancestors(dag, dag.value_producer[v])
        if all(const[u] for u in trial) and _held(dag, trial, writes) <= cap:
            chosen = trial
    return sorted(chosen)


def _ancestors(dag: "ForwardDag", node: int) -> set[int]:
    """``node`` and every node it depends on (memory or soft)."""
    seen = {node}
    stack = [node]
    while stack:
        for p in dag.preds[stack.pop()]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


def _held(dag: "ForwardDag", members: set[int], writes: list[list[int]]) -> int:
    """Bytes of the values produced in ``members`` and read outside (or returned)."""
    total = 0
    for u in members:
        for v in writes[u]:
            if dag.value_is_output[v] or any(w not in members for w in dag.value_users[v]):
                total += dag.value_size[v]
    return total
