"""Constant forward values: computed from nothing that needs a gradient.

An attention mask or a tensor of position ids is computed from the inputs' shapes (or from
inputs that need no gradient), so it may run before everything else. User inputs and
parameters already bring no dependency ("HiRemate: Hierarchical Approach for Efficient
Re-materialization of Large Neural Networks", appendix C.1.3); a value whose whole ancestry
needs no gradient is the same kind of thing once computed (docs/design.md, "Constant values").
The partitioners hoist such values into a prologue (:mod:`hiremate.partition.constants`) and
the block IR treats them like inputs (:func:`hiremate.ir.blocks.assign_backward`).

A node is constant when it reads no source that needs a gradient, every predecessor (memory or
soft) is constant, it is not random (moving a random op would change the order in which the
random generator is drawn) and it neither mutates a buffer nor reads a buffer that some node
mutates. Constant nodes are closed under predecessors, so any set of them closed under
predecessors can run first in a valid topological order.
"""

from __future__ import annotations

from hiremate.ir.graph import DataKind, Graph

_FLOAT_DTYPES = ("float", "bfloat", "complex")


def grad_sources(graph: Graph) -> set[int]:
    """Source data that need a gradient: trainable parameters and inputs that require one.

    The graph's meta says which parameters are frozen and which inputs require a gradient
    (:func:`hiremate.build_graph` records both); without it (hand-made graphs), every parameter
    and every floating-point input is taken to need one (the safe side).
    """
    meta = graph.meta
    n_train = len(meta["param_names"]) if "param_names" in meta else None
    input_rg = meta.get("input_requires_grad")
    out: set[int] = set()
    k_param = k_input = 0
    for d in graph.data:
        if d.producer is not None:
            continue
        if d.kind is DataKind.PARAM:
            if n_train is None or k_param < n_train:
                out.add(d.id)
            k_param += 1
        elif d.kind is DataKind.INPUT:
            if input_rg is not None and k_input < len(input_rg):
                needs = bool(input_rg[k_input])
            else:
                needs = d.dtype.startswith(_FLOAT_DTYPES)
            if needs:
                out.add(d.id)
            k_input += 1
    return out


def constant_nodes(graph: Graph) -> set[int]:
    """Forward compute ids of the constant nodes (module docstring)."""
    sources = grad_sources(graph)
    mutated = any(n.mutates for n in graph.nodes)
    data = graph.data
    const: set[int] = set()
    for node in graph.fwd_nodes:  # topological order: predecessors are decided first
        if node.random or node.mutates:
            continue
        ok = True
        for d in node.inputs + node.soft_inputs:
            dn = data[d]
            if dn.producer is None:
                if d in sources or (mutated and dn.kind is DataKind.BUFFER):
                    ok = False
                    break
            elif dn.producer not in const:
                ok = False
                break
        if ok:
            const.add(node.id)
    return const
