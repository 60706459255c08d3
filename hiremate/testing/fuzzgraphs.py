"""Hostile synthetic CD-graphs for fuzzing the solvers.

:mod:`hiremate.testing.synthetic` builds the graphs autograd makes from a DAG of one-output ops. Real
captures are messier, so fuzzing needs more shapes than that: ops with several outputs (a
``split``, an LSTM cell, a BatchNorm returning its statistics), values shared by several
readers, several model outputs (including intermediate values that are also read further on),
shape-only (soft) dependencies, user inputs that need no gradient (they bring no gradient
dependency), ops that draw random numbers or write a buffer (the executor's ordering rules,
which the simulator checks), and sizes at the edges: zero-byte tensors and tensors of ``2**40`` bytes, which
break code that mixes floats with byte counts.

A graph is described by a plain :class:`FuzzSpec` (lists of ints and floats), so that a
property-testing library can draw and shrink it field by field; :func:`graph_from_spec` turns a
spec into a valid :class:`~hiremate.ir.graph.Graph` the way autograd would (one backward node per
forward op that receives a gradient, partial gradients summed by the producer's backward, one
summing node per user input that needs a gradient). :func:`random_spec` draws one from a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hiremate.errors import InvalidGraphError
from hiremate.ir.graph import ComputeNode, DataKind, DataNode, Graph, NodeKind

#: sizes at the edges of what a tensor can be: empty, and a terabyte
HUGE = 2**40
#: a value: ``(-1 - k, 0)`` is user input ``k``; ``(i, m)`` is output ``m`` of op ``i``
Value = tuple[int, int]


@dataclass
class FuzzOp:
    """One forward op with ``len(sizes)`` outputs, reading ``inputs`` (earlier values)."""

    inputs: list[Value]
    sizes: list[int]
    time: float = 1.0
    bwd_time: float = 2.0
    has_param: bool = True
    saves_inputs: bool = True
    saved_outputs: list[int] = field(default_factory=list)  # indices into ``sizes``
    overhead: int = 0
    bwd_overhead: int = 0
    soft_inputs: list[Value] = field(default_factory=list)
    #: the op draws random numbers (its first runs must keep the graph's order)
    random: bool = False
    #: the op writes a buffer (it must run at least once)
    mutates: bool = False


@dataclass
class FuzzSpec:
    """A forward DAG with its user inputs and the values the model returns."""

    input_sizes: list[int]
    input_grad: list[bool]
    ops: list[FuzzOp]
    outputs: list[Value]


def check_spec(spec: FuzzSpec) -> None:
    """Raise :class:`InvalidGraphError` (a ``ValueError``) when the spec reads a value that does
    not exist (yet)."""
    if not spec.ops:
        raise InvalidGraphError("a spec needs at least one op")
    if len(spec.input_sizes) != len(spec.input_grad) or not spec.input_sizes:
        raise InvalidGraphError("input_sizes and input_grad must be non-empty and of equal length")

    def exists(v: Value, before: int) -> bool:
        j, m = v
        if j < 0:
            return -1 - j < len(spec.input_sizes) and m == 0
        return j < before and 0 <= m < len(spec.ops[j].sizes)

    for i, op in enumerate(spec.ops):
        if not op.sizes:
            raise InvalidGraphError(f"op {i} has no output")
        for v in op.inputs + op.soft_inputs:
            if not exists(v, i):
                raise InvalidGraphError(f"op {i} reads {v}, which is not an earlier value")
        if any(not 0 <= m < len(op.sizes) for m in op.saved_outputs):
            raise InvalidGraphError(f"op {i} saves an output it does not have")
    for v in spec.outputs:
        if v[0] < 0 or not exists(v, len(spec.ops)):
            raise InvalidGraphError(f"graph output {v} is not an op output")
    if not spec.outputs:
        raise InvalidGraphError("a spec needs at least one graph output")


def graph_from_spec(spec: FuzzSpec) -> Graph:
    """The CD-graph of ``spec`` (see the module docstring)."""
    check_spec(spec)
    ops = spec.ops
    data: list[DataNode] = []
    nodes: list[ComputeNode] = []

    def add(name: str, kind: DataKind, size: int, producer: int | None) -> int:
        data.append(DataNode(len(data), name, kind, (max(size // 4, 0),), "float32", int(size),
                             producer))
        return len(data) - 1

    value_id: dict[Value, int] = {}
    needs_grad: dict[Value, bool] = {}
    for k, s in enumerate(spec.input_sizes):
        value_id[(-1 - k, 0)] = add(f"x{k}", DataKind.INPUT, s, None)
        needs_grad[(-1 - k, 0)] = bool(spec.input_grad[k])
    params = [add(f"w{i}", DataKind.PARAM, 64, None) if op.has_param else None
              for i, op in enumerate(ops)]
    consumers: dict[Value, list[int]] = {}
    fwd_ids: list[int] = []
    op_grad: list[bool] = []
    for i, op in enumerate(ops):
        nid = len(nodes)
        reads = list(dict.fromkeys(op.inputs))
        grad = op.has_param or any(needs_grad[v] for v in reads)
        op_grad.append(grad)
        outs = []
        for m, s in enumerate(op.sizes):
            value_id[(i, m)] = add(f"a{i}_{m}", DataKind.ACTIVATION, s, nid)
            needs_grad[(i, m)] = grad
            outs.append(value_id[(i, m)])
        for v in reads:
            consumers.setdefault(v, []).append(i)
        ins = [value_id[v] for v in reads] + ([params[i]] if params[i] is not None else [])
        soft = tuple(dict.fromkeys(value_id[v] for v in op.soft_inputs if v not in reads))
        nodes.append(ComputeNode(nid, f"fwd{i}", NodeKind.FWD, tuple(dict.fromkeys(ins)),
                                 tuple(outs), float(op.time), int(op.overhead), soft_inputs=soft,
                                 signature=f"f{len(reads)}:{tuple(op.sizes)}",
                                 mutates=(f"buf{i}",) if op.mutates else (),
                                 random=bool(op.random)))
        fwd_ids.append(nid)

    loss_id = len(nodes)
    out_values = list(dict.fromkeys(spec.outputs))
    tangents = {v: add(f"t{v[0]}_{v[1]}", DataKind.TANGENT, data[value_id[v]].size, loss_id)
                for v in out_values if needs_grad[v]}
    nodes.append(ComputeNode(loss_id, "loss", NodeKind.LOSS,
                             tuple(value_id[v] for v in out_values), tuple(tangents.values())))

    partial: dict[tuple[Value, int], int] = {}   # (value, consumer op) -> its partial gradient
    input_parts: dict[int, list[int]] = {}
    partner: dict[int, int] = {}
    for i in reversed(range(len(ops))):
        op = ops[i]
        if not op_grad[i]:
            continue
        grads_in: list[int] = []
        for m in range(len(op.sizes)):
            v = (i, m)
            grads_in += [partial[(v, c)] for c in consumers.get(v, []) if (v, c) in partial]
            if v in tangents:
                grads_in.append(tangents[v])
        if not grads_in:
            continue
        nid = len(nodes)
        reads = list(dict.fromkeys(op.inputs))
        ins = list(grads_in)
        if op.saves_inputs:
            ins += [value_id[v] for v in reads]
            if params[i] is not None:
                ins.append(params[i])
        ins += [value_id[(i, m)] for m in op.saved_outputs]
        outs: list[int] = []
        for v in reads:
            if not needs_grad[v]:
                continue  # an input that needs no gradient brings no dependency
            j, m = v
            if j >= 0:
                g = add(f"g{j}_{m}_from{i}", DataKind.GRAD, data[value_id[v]].size, nid)
                partial[(v, i)] = g
            else:
                g = add(f"gx{-1 - j}_from{i}", DataKind.GRAD, data[value_id[v]].size, nid)
                input_parts.setdefault(-1 - j, []).append(g)
            outs.append(g)
        if params[i] is not None:
            outs.append(add(f"gw{i}", DataKind.PARAM_GRAD, 64, nid))
        partner[fwd_ids[i]] = nid
        nodes.append(ComputeNode(nid, f"bwd{i}", NodeKind.BWD, tuple(dict.fromkeys(ins)),
                                 tuple(outs), float(op.bwd_time), int(op.bwd_overhead),
                                 partner=fwd_ids[i],
                                 signature=f"b{len(reads)}:{tuple(op.sizes)}"))
    for k, parts in sorted(input_parts.items()):
        nid = len(nodes)
        g = add(f"gx{k}", DataKind.INPUT_GRAD, spec.input_sizes[k], nid)
        nodes.append(ComputeNode(nid, f"sum_gx{k}", NodeKind.BWD, tuple(parts), (g,),
                                 signature="sum"))
    nodes = [_with_partner(n, partner.get(n.id)) if n.is_fwd else n for n in nodes]
    return Graph(nodes, data, [value_id[v] for v in out_values], meta={"synthetic": "fuzz"})


def _with_partner(node: ComputeNode, partner: int | None) -> ComputeNode:
    fields = {name: getattr(node, name) for name in ComputeNode.__dataclass_fields__}
    fields["partner"] = partner
    return ComputeNode(**fields)


def random_size(rng: random.Random, max_size: int = 1000) -> int:
    """Mostly ordinary sizes, sometimes empty, sometimes a terabyte."""
    r = rng.random()
    if r < 0.1:
        return 0
    if r < 0.15:
        return HUGE
    return rng.randint(1, max_size)


def random_spec(seed: int, n_ops: int, chain: bool = False, max_size: int = 1000) -> FuzzSpec:
    """A random :class:`FuzzSpec` (deterministic in ``seed``); ``chain`` gives a sequence of
    one-output ops, each reading the previous one (what the chain solvers accept)."""
    rng = random.Random(seed)
    n_in = 1 if chain else rng.randint(1, 3)
    input_sizes = [random_size(rng, max_size) for _ in range(n_in)]
    input_grad = [rng.random() < 0.3 for _ in range(n_in)]
    ops: list[FuzzOp] = []
    values: list[Value] = [(-1 - k, 0) for k in range(n_in)]
    for i in range(n_ops):
        n_out = 1 if chain else rng.choice([1, 1, 1, 2, 3])
        if chain:
            inputs = [(i - 1, 0) if i else (-1, 0)]
        else:
            fanin = rng.randint(1, min(3, len(values)))
            inputs = rng.sample(values, fanin)
        earlier = [v for v in values if v not in inputs]
        soft = [v for v in earlier if rng.random() < 0.1]
        ops.append(FuzzOp(
            inputs=inputs, sizes=[random_size(rng, max_size) for _ in range(n_out)],
            time=rng.choice([0.0, rng.uniform(0.1, 5.0)]), bwd_time=rng.uniform(0.0, 10.0),
            has_param=chain or rng.random() < 0.7, saves_inputs=rng.random() < 0.8,
            saved_outputs=[m for m in range(n_out) if rng.random() < 0.3],
            overhead=rng.choice([0, 0, random_size(rng, max_size)]),
            bwd_overhead=rng.choice([0, 0, random_size(rng, max_size)]), soft_inputs=soft,
        ))
        values += [(i, m) for m in range(n_out)]
    read = {v for op in ops for v in op.inputs}
    outputs = [(i, m) for i, op in enumerate(ops) for m in range(len(op.sizes))
               if (i, m) not in read]
    if chain:
        outputs = [(n_ops - 1, 0)]
    else:
        outputs += [v for v in values if v[0] >= 0 and v in read and rng.random() < 0.1]
    return FuzzSpec(input_sizes, input_grad, ops, outputs)


def random_fuzz_graph(seed: int, n_ops: int, chain: bool = False, **kwargs) -> Graph:
    """:func:`graph_from_spec` of :func:`random_spec`."""
    return graph_from_spec(random_spec(seed, n_ops, chain, **kwargs))
