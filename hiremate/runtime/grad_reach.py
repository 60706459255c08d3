"""Which output gradients reach each parameter and input gradient of a CD-graph.

The traced backward computes every gradient from a tangent per differentiable output, and the
executor passes zeros for the outputs that the caller's loss does not use (autograd hands the
function ``None`` for them). Eager PyTorch leaves ``.grad`` as ``None`` for a parameter that the
loss does not reach, while a zero tangent would give it a real zero gradient (a transformers
``CLIPVisionModel`` with the loss on ``last_hidden_state`` alone: ``post_layernorm`` only feeds
``pooler_output``). With the sets computed here the executor returns ``None`` for a gradient
when none of the tangents that reach it came from the loss, as eager does; a gradient that a
used output reaches is returned even when it is zero, as eager does.

Reachability follows the graph's data dependencies (memory and shape-only) through compute
nodes; a node's outputs all count as reached when any of its inputs is. A node groups ops, so
this can over-approximate (never miss) what reaches a gradient.
"""

from __future__ import annotations

from hiremate.ir.graph import DataKind, Graph


def tangents_reaching(graph: Graph) -> list[frozenset[int]]:
    """For each entry of ``graph.meta["grad_values"]`` (parameters, then inputs that require
    grad), the indices of the tangents (in ``meta["tangent_for_output"]`` order) it depends on;
    an entry that is ``None`` in the graph gets the empty set."""
    tangents = [d.id for d in graph.data if d.kind is DataKind.TANGENT]
    everything = frozenset(range(len(tangents)))
    reached: dict[int, set[int]] = {d: {k} for k, d in enumerate(tangents)}
    # nodes are numbered in a topological order: one sweep in that order propagates everything
    for node in graph.nodes:
        sources: set[int] = set()
        for d in (*node.inputs, *node.soft_inputs):
            sources |= reached.get(d, set())
        if sources:
            for d in node.outputs:
                reached.setdefault(d, set()).update(sources)
    by_name: dict[str, int] = {}
    for d in graph.data:
        by_name[d.name] = d.id
        for alias in d.aliases:
            by_name.setdefault(alias, d.id)
    result = []
    for name in graph.meta.get("grad_values", []):
        if name is None:
            result.append(frozenset())
        elif name in by_name:
            result.append(frozenset(reached.get(by_name[name], ())))
        else:  # not a data node of the graph: assume every tangent reaches it
            result.append(everything)
    return result


__all__ = ["tangents_reaching"]
