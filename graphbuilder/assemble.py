"""Assemble a :class:`hiremate.Graph` from grouped ops and their measured costs."""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from hiremate.errors import GraphCaptureError
from hiremate.ir.graph import (COUNTED_KINDS, ComputeNode, DataKind, DataNode, Graph,
                               NodeKind, Op, Ref)
from hiremate.graphbuilder.capture import JointCapture
from hiremate.graphbuilder.costs import OpCost
from hiremate.graphbuilder.encode import encode_arg
from hiremate.graphbuilder.grouping import Group, Grouping, inline_root
from hiremate.graphbuilder.opinfo import op_kind, qualified_name


@dataclass
class _Ctx:
    cap: JointCapture
    grp: Grouping
    costs: dict[str, OpCost]


def _value_size(node: torch.fx.Node, costs: dict[str, OpCost] | None = None) -> int:
    """Bytes of the storage that ``node``'s value owns: its fake storage where that is larger
    than its elements (the functional ``copy`` of a slice clones the slice's whole base, as
    eager does: FNO's rfft backward allocated 32 KiB where 16.5 KiB were counted), and the
    storage the real run's value holds where that is larger still (``OpCost.stored``: a
    kernel that keeps more than its result, CPU ``col2im``)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        dense = int(val.numel()) * val.element_size()
        try:
            stored = int(val.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError, TypeError):  # no storage (sparse, symbolic)
            stored = 0
        real = costs[node.name].stored if costs is not None and node.name in costs else 0
        return max(dense, stored, real)
    return 0


def _reads(node: torch.fx.Node, grp: Grouping) -> list[str]:
    """Value names an op reads, through renames, with inlined view chains expanded to roots."""
    names: list[str] = []
    for a in node.all_input_nodes:
        name = grp.rename.get(a.name, a.name)
        names.append(inline_root(name, grp.inline, grp.rename) if name in grp.inline else name)
    return names


def _inline_chain(node: torch.fx.Node, grp: Grouping, seen: set[str], out: list[torch.fx.Node]):
    for a in node.all_input_nodes:
        name = grp.rename.get(a.name, a.name)
        if name in grp.inline and name not in seen:
            seen.add(name)
            _inline_chain(grp.inline[name], grp, seen, out)
            out.append(grp.inline[name])


def assemble(cap: JointCapture, grp: Grouping, costs: dict[str, OpCost],
             meta: dict[str, Any]) -> Graph:
    nodes_by_name = {n.name: n for n in cap.gm.graph.nodes}
    groups: list[Group] = list(grp.fwd) + list(grp.bwd)
    home: dict[str, Group] = dict(grp.producer)
    owner = grp.owner

    # gradients that do not live in storage allocated by a backward node get a copy
    grad_values = list(grp.grads)
    # storages counted on the original list: replacing a gradient by its copy in the loop must
    # not make the last of two gradients sharing a storage look unshared (it would keep the
    # whole storage as an uncounted parameter gradient, e.g. FNO's real/imaginary weight parts)
    sharers: dict[str, int] = {}
    for name in grad_values:
        if name is not None:
            sharers[owner.get(name, name)] = sharers.get(owner.get(name, name), 0) + 1
    # a copy runs right after the backward group that makes its storage (node ids follow this
    # order, and solvers that keep the node order would otherwise hold every such storage
    # until the end of the backward)
    copies_after: dict[int, list[Group]] = {}
    placeholders = [n for n in cap.gm.graph.nodes if n.op == "placeholder"]
    n_params = len(cap.param_names)
    for i, name in enumerate(grad_values):
        if name is None:
            continue
        o = owner.get(name, name)
        in_bwd = o in home and home[o].kind is NodeKind.BWD
        shared = sharers[o] > 1
        param = placeholders[i] if i < n_params else None
        if not in_bwd or shared or not _stealable(nodes_by_name[name], param):
            g = Group(NodeKind.BWD, len(grp.bwd) + i + 1)
            # contiguous, like the parameter: autograd then keeps the copy as .grad instead of
            # copying it again (a view's clone keeps its permuted strides)
            fake = cap.gm.graph.create_node("call_function", torch.ops.aten.clone.default,
                                            (nodes_by_name[name],),
                                            {"memory_format": torch.contiguous_format},
                                            name=f"{name}_grad_copy")
            fake.meta["val"] = nodes_by_name[name].meta.get("val")
            nodes_by_name[fake.name] = fake
            g.ops.append(fake)
            if in_bwd:
                copies_after.setdefault(id(home[o]), []).append(g)
            else:
                groups.append(g)
            owner[fake.name] = fake.name
            home[fake.name] = g
            grad_values[i] = fake.name
            costs[fake.name] = OpCost(costs.get(name, OpCost(0.0, 0, 0.0)).time, 0,
                                      float(fake.meta["val"].numel()) if fake.meta["val"] is not None else 0.0)

    if copies_after:
        tail = groups[len(grp.fwd) + len(grp.bwd):]
        groups = list(grp.fwd)
        for b in grp.bwd:
            groups.append(b)
            groups.extend(copies_after.pop(id(b), ()))
        groups.extend(c for cs in copies_after.values() for c in cs)  # producer not listed
        groups.extend(tail)

    # who reads each storage, and which storage each group allocates
    readers: dict[str, set[int]] = {}
    for gi, g in enumerate(groups):
        for op in g.ops:
            for r in _reads(op, grp):
                readers.setdefault(owner.get(r, r), set()).add(gi)
        for s in g.soft:
            readers.setdefault(s, set()).add(gi)
    n_params = len(cap.param_names)
    grad_kind = {}
    for i, name in enumerate(grad_values):
        if name is not None:
            grad_kind[owner[name]] = DataKind.PARAM_GRAD if i < n_params else DataKind.INPUT_GRAD
    uncounted = frozenset(o for o, k in grad_kind.items() if k not in COUNTED_KINDS)
    out_owners = [owner.get(o, o) for o in grp.outputs if isinstance(o, str)]
    for o in grp.outputs:
        if isinstance(o, str) and o in grp.inline:
            raise GraphCaptureError(
                f"the model returns {o}, a view of one of its inputs or parameters; return a "
                "copy (.clone()) instead"
            )
    pinned = set(out_owners) | set(grad_kind)
    group_index = {id(g): gi for gi, g in enumerate(groups)}
    allocs: list[list[str]] = [[] for _ in groups]
    for gi, g in enumerate(groups):
        for op in g.ops:
            if owner.get(op.name) == op.name and home.get(op.name) is g:
                allocs[gi].append(op.name)
    external: set[str] = set()
    for gi, names in enumerate(allocs):
        for o in names:
            if o in pinned or readers.get(o, set()) - {gi}:
                external.add(o)

    # keep groups that produce something, mutate a buffer or draw random numbers
    keep = [gi for gi, g in enumerate(groups)
            if any(o in external for o in allocs[gi]) or g.mutates
            or any(op_kind(op.target).random for op in g.ops if op.target is not operator.getitem)]
    fwd_keep = [gi for gi in keep if groups[gi].kind is NodeKind.FWD]
    bwd_keep = [gi for gi in keep if groups[gi].kind is NodeKind.BWD]
    node_id: dict[int, int] = {gi: k for k, gi in enumerate(fwd_keep)}
    loss_id = len(fwd_keep)
    node_id.update({gi: loss_id + 1 + k for k, gi in enumerate(bwd_keep)})

    # data nodes: sources in placeholder order, then allocated storage in execution order
    data: list[DataNode] = []
    data_id: dict[str, int] = {}
    aliases: dict[str, list[str]] = {}
    for name, o in owner.items():
        if name != o:
            aliases.setdefault(o, []).append(name)
    for ph in placeholders:
        kind = grp.source_kind[ph.name]
        producer = loss_id if kind is DataKind.TANGENT else None
        if kind is DataKind.TANGENT:
            kind = DataKind.TANGENT
        data_id[ph.name] = len(data)
        val = ph.meta.get("val")
        data.append(DataNode(
            len(data), ph.name, kind, tuple(int(s) for s in val.shape), str(val.dtype).removeprefix("torch."),
            _value_size(ph), producer, tuple(sorted(aliases.get(ph.name, ()))),
        ))
    for gi in fwd_keep + bwd_keep:
        g = groups[gi]
        for o in allocs[gi]:
            if o not in external:
                continue
            node = nodes_by_name[o]
            val = node.meta["val"]
            kind = grad_kind.get(o, DataKind.ACTIVATION if g.kind is NodeKind.FWD else DataKind.GRAD)
            data_id[o] = len(data)
            data.append(DataNode(
                len(data), o, kind, tuple(int(s) for s in val.shape),
                str(val.dtype).removeprefix("torch."), _value_size(node, costs), node_id[gi],
                tuple(sorted(aliases.get(o, ()))),
            ))

    compute: list[ComputeNode] = []
    partner_bwd: dict[int, int] = {}
    for gi in bwd_keep:
        p = groups[gi].partner
        if p is not None and group_index.get(id(p)) in node_id:
            partner_bwd.setdefault(node_id[group_index[id(p)]], node_id[gi])
    for gi in fwd_keep + [None] + bwd_keep:
        if gi is None:
            ins = tuple(dict.fromkeys(data_id[o] for o in out_owners
                                      if data[data_id[o]].producer is not None))
            outs = tuple(data_id[t] for t in grp.tangents)
            compute.append(ComputeNode(loss_id, "loss", NodeKind.LOSS, ins, outs, 0.0, 0,
                                       signature="loss"))
            continue
        compute.append(_compute_node(gi, groups[gi], node_id, data_id, external, allocs[gi],
                                     grp, costs, owner, partner_bwd, groups, group_index,
                                     uncounted))
    graph_meta = dict(meta)
    graph_meta.update({
        "output_values": [o if isinstance(o, str) else {"const": encode_arg(o.value)}
                          for o in grp.outputs],
        "grad_values": grad_values,
        "fwd_ops_before": grp.n_fwd_ops,
        "mutated_buffers": sorted({m for g in groups for m in g.mutates}),
    })
    return Graph(compute, data, [data_id[o] for o in out_owners], meta=graph_meta)


def _compute_node(gi, g: Group, node_id, data_id, external, allocs, grp: Grouping, costs,
                  owner, partner_bwd, groups, group_index, uncounted: frozenset[str]
                  ) -> ComputeNode:
    nid = node_id[gi]
    chain: list[torch.fx.Node] = []
    seen: set[str] = set()
    for op in g.ops:
        _inline_chain(op, grp, seen, chain)
    ordered = chain + list(g.ops)
    ops: list[Op] = []
    inputs: list[int] = []
    local = set(allocs) | {a for op in ordered for a in [op.name]}
    random = False
    for op in ordered:
        for r in _reads(op, grp):
            o = owner.get(r, r)
            if r not in local and o in data_id and data_id[o] not in inputs:
                if o not in allocs:
                    inputs.append(data_id[o])
        if op.name in g.rewrites:
            rec = g.rewrites[op.name]
        else:
            kind = op_kind(op.target) if op.target is not operator.getitem else None
            rec = Op(
                target=qualified_name(op.target),
                args=tuple(encode_arg(a, grp.rename) for a in op.args),
                kwargs=tuple((k, encode_arg(v, grp.rename)) for k, v in op.kwargs.items()),
                out=op.name,
                mutated_args=tuple(i for i in (kind.writes if kind else ())
                                   if i < len(op.args) and _is_buffer(op.args[i], grp, owner)),
                random=bool(kind and kind.random),
            )
        random = random or rec.random
        ops.append(rec)
    outputs = tuple(data_id[o] for o in allocs if o in external)
    soft = tuple(sorted(data_id[s] for s in g.soft if s in data_id and data_id[s] not in inputs))
    time = sum(costs[op.name].time for op in ordered if op.name in costs)
    flops = sum(costs[op.name].flops for op in ordered if op.name in costs)
    overhead = _overhead(ordered, g, allocs, external, costs, grp, owner, uncounted)
    kind = g.kind
    partner = partner_bwd.get(nid) if kind is NodeKind.FWD else (
        node_id.get(group_index.get(id(g.partner))) if g.partner is not None else None)
    name = (ordered[-1].name if kind is NodeKind.BWD else
            next((op.name for op in g.ops if op.name in allocs), g.ops[0].name))
    sig = hashlib.sha1(repr([(o.target, _shape_sig(op), o.args if not _has_ref(o.args) else len(o.args))
                             for o, op in zip(ops, ordered)]).encode()).hexdigest()[:16]
    return ComputeNode(
        nid, f"{kind.value}:{name}", kind, tuple(inputs), outputs, float(time), int(overhead),
        soft_inputs=soft, partner=partner, signature=sig, ops=tuple(ops),
        mutates=tuple(sorted(g.mutates)), random=random, flops=float(flops),
    )


def _stealable(grad: torch.fx.Node, param: torch.fx.Node | None) -> bool:
    """Whether autograd keeps this gradient as the parameter's ``.grad`` as it is: its strides
    must match the parameter's in every dimension longer than 1 (autograd's layout contract);
    otherwise it copies the gradient, and the graph must hold that copy (a convolution's
    weight gradient in channels-last strides, e.g.), or the simulator misses the original."""
    if param is None:
        return True
    g, p = grad.meta.get("val"), param.meta.get("val")
    if not isinstance(g, torch.Tensor) or not isinstance(p, torch.Tensor):
        return True
    return all(size == 1 or gs == ps
               for size, gs, ps in zip(g.shape, g.stride(), p.stride()))


def _has_ref(args: Any) -> bool:
    if isinstance(args, Ref):
        return True
    if isinstance(args, (list, tuple)):
        return any(_has_ref(a) for a in args)
    return isinstance(args, dict)


def _shape_sig(node: torch.fx.Node) -> Any:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return (tuple(int(s) for s in val.shape), str(val.dtype))
    return None


def _is_buffer(arg: Any, grp: Grouping, owner: dict[str, str]) -> bool:
    if not isinstance(arg, torch.fx.Node):
        return False
    name = grp.rename.get(arg.name, arg.name)
    if name in grp.inline:
        name = inline_root(name, grp.inline, grp.rename)
    o = owner.get(name, name)
    # an input written in place needs no gradient (the grouping refuses the others)
    return grp.source_kind.get(o) in (DataKind.BUFFER, DataKind.INPUT, DataKind.PARAM)


def _overhead(ordered, g: Group, allocs, external, costs, grp: Grouping, owner,
              uncounted: frozenset[str] = frozenset()) -> int:
    """Peak memory inside the node beyond its outputs: internal temporaries + op scratch.
    Outputs the simulator does not count (``uncounted``: parameter gradients) weigh nothing
    here either: counted, a parameter gradient made after a temporary is freed would hide
    that temporary (the node's peak would be its outputs, larger than the moment with the
    temporary), and the simulator, which leaves the gradient out, would miss it."""
    internal = [o for o in allocs if o not in external]
    last_use: dict[str, int] = {}
    for i, op in enumerate(ordered):
        for r in _reads(op, grp):
            o = owner.get(r, r)
            if o in internal:
                last_use[o] = i
    sizes = {op.name: 0 if op.name in uncounted else _value_size(op, costs)
             for op in ordered}
    ext_total = sum(sizes.get(o, 0) for o in allocs if o in external)
    # an op returning several tensors (native_batch_norm, split) allocates them itself; the
    # getitems that name them come after it, so their bytes are counted at the op, where its
    # scratch memory is measured (peak during the op = what it keeps + its temporaries)
    pending: dict[str, int] = {}
    for op in ordered:
        if op.target is operator.getitem and op.name in allocs:
            base = op.args[0].name
            pending[base] = pending.get(base, 0) + sizes[op.name]
    alive_internal = 0
    ext_so_far = 0
    peak = 0
    for i, op in enumerate(ordered):
        if op.name in allocs:
            if op.name in external:
                ext_so_far += sizes[op.name]
            else:
                alive_internal += sizes[op.name]
        temp = costs[op.name].temp if op.name in costs else 0
        early = pending.get(op.name, 0)
        peak = max(peak, ext_so_far + alive_internal + early + temp)
        for o in internal:
            if last_use.get(o, -1) == i or (o == op.name and o not in last_use):
                alive_internal -= sizes[o]
    return max(0, peak - ext_total)
