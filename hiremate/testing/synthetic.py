"""Synthetic CD-graphs built from a forward DAG: for tests, property tests and benchmarks.

``graph_from_dag`` turns a forward data-flow DAG into a full CD-graph the way autograd would:
every forward op ``i`` gets a backward node that reads the values it saved (its inputs and,
optionally, its output) and the gradient of its output, and produces the gradients of its
inputs. When a value has several consumers, each consumer produces a partial gradient and the
producer's backward node sums them. Values that need no gradient (computed from user inputs that
require none, without parameters: masks, position ids) get no backward node and no gradient.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hiremate.errors import InvalidGraphError
from hiremate.ir.graph import ComputeNode, DataKind, DataNode, Graph, NodeKind


@dataclass
class DagOp:
    """One forward op of a synthetic DAG.

    ``inputs``: indices of earlier ops, or ``-1 - k`` for user input ``k``. ``saves_output``:
    whether the backward needs the op's own output (as relu does); ``saves_inputs``: whether it
    needs its inputs (as a matmul does).
    """

    inputs: list[int]
    size: int
    time: float
    bwd_time: float | None = None
    has_param: bool = True
    saves_inputs: bool = True
    saves_output: bool = False
    overhead: int = 0
    code: str = "op"
    soft_inputs: list[int] = field(default_factory=list)


def graph_from_dag(
    ops: list[DagOp], input_sizes: list[int] | None = None, outputs: list[int] | None = None,
    input_requires_grad: list[bool] | None = None,
) -> Graph:
    """Build the CD-graph of a forward DAG (see module docstring). ``input_requires_grad``
    (default: all) says which user inputs need a gradient; it is recorded in the graph's meta
    as :func:`hiremate.build_graph` does."""
    n = len(ops)
    input_sizes = input_sizes or [ops[0].size if ops else 1]
    input_rg = list(input_requires_grad) if input_requires_grad is not None \
        else [True] * len(input_sizes)
    # an op needs a gradient when it has a parameter or reads a value that needs one
    needs: list[bool] = []
    for op in ops:
        needs.append(op.has_param or any(needs[j] if j >= 0 else input_rg[-1 - j]
                                         for j in op.inputs))
    consumers: list[list[int]] = [[] for _ in range(n)]
    for i, op in enumerate(ops):
        for j in op.inputs:
            if j >= i:
                raise InvalidGraphError(f"op {i} reads op {j}: inputs must come earlier")
            if j >= 0:
                consumers[j].append(i)
    if outputs is None:
        outputs = [i for i in range(n) if not consumers[i]]
    data: list[DataNode] = []
    nodes: list[ComputeNode] = []

    def add_data(name: str, kind: DataKind, size: int, producer: int | None) -> int:
        data.append(DataNode(len(data), name, kind, (max(size // 4, 0),), "float32", size, producer))
        return len(data) - 1

    user_inputs = [add_data(f"x{k}", DataKind.INPUT, s, None) for k, s in enumerate(input_sizes)]
    params = [add_data(f"w{i}", DataKind.PARAM, 64, None) if op.has_param else None
              for i, op in enumerate(ops)]

    def value_of(j: int, act: list[int]) -> int:
        return act[j] if j >= 0 else user_inputs[-1 - j]

    act: list[int] = []
    fwd_id: list[int] = []
    for i, op in enumerate(ops):
        nid = len(nodes)
        out = add_data(f"a{i}", DataKind.ACTIVATION, op.size, nid)
        act.append(out)
        ins = [value_of(j, act) for j in op.inputs]
        if params[i] is not None:
            ins.append(params[i])
        soft = tuple(act[j] for j in op.soft_inputs if j not in op.inputs)
        nodes.append(ComputeNode(
            nid, f"fwd{i}", NodeKind.FWD, tuple(dict.fromkeys(ins)), (out,), op.time, op.overhead,
            soft_inputs=soft, signature=f"{op.code}:{op.size}:{len(op.inputs)}",
        ))
        fwd_id.append(nid)

    loss_id = len(nodes)
    out_set = list(dict.fromkeys(outputs))
    tangents = {o: add_data(f"g_out{o}", DataKind.TANGENT, ops[o].size, loss_id) for o in out_set
                if needs[o]}
    nodes.append(ComputeNode(loss_id, "loss", NodeKind.LOSS, tuple(act[o] for o in out_set),
                             tuple(tangents.values()), 0.0, 0))

    # partial gradient produced for value j by its consumer i
    partial: dict[tuple[int, int], int] = {}
    input_grads: dict[int, list[int]] = {}
    for i in reversed(range(n)):
        op = ops[i]
        nid = len(nodes)
        if not needs[i]:
            continue
        grads_in = [partial[(i, c)] for c in consumers[i]]
        if i in tangents:
            grads_in.append(tangents[i])
        if not grads_in:
            continue
        ins = list(grads_in)
        if op.saves_inputs:
            ins += [value_of(j, act) for j in op.inputs]
            if params[i] is not None:
                ins.append(params[i])
        if op.saves_output:
            ins.append(act[i])
        outs: list[int] = []
        for j in dict.fromkeys(op.inputs):
            if not (needs[j] if j >= 0 else input_rg[-1 - j]):
                continue
            if j >= 0:
                g = add_data(f"g{j}_from{i}", DataKind.GRAD, ops[j].size, nid)
                partial[(j, i)] = g
            else:
                g = add_data(f"gx{-1 - j}_from{i}", DataKind.GRAD, input_sizes[-1 - j], nid)
                input_grads.setdefault(-1 - j, []).append(g)
            outs.append(g)
        if params[i] is not None:
            outs.append(add_data(f"gw{i}", DataKind.PARAM_GRAD, 64, nid))
        bwd_time = op.bwd_time if op.bwd_time is not None else 2 * op.time
        nodes.append(ComputeNode(
            nid, f"bwd{i}", NodeKind.BWD, tuple(dict.fromkeys(ins)), tuple(outs), bwd_time,
            op.overhead, partner=fwd_id[i], signature=f"b{op.code}:{op.size}:{len(op.inputs)}",
        ))
    # input gradients: sum of the partial ones, in one final node per input
    for k, parts in sorted(input_grads.items()):
        nid = len(nodes)
        g = add_data(f"gx{k}", DataKind.INPUT_GRAD, input_sizes[k], nid)
        nodes.append(ComputeNode(nid, f"sum_gx{k}", NodeKind.BWD, tuple(parts), (g,), 0.0, 0,
                                 signature="sum"))
    # forward partners point to their backward nodes
    partner_of = {n.partner: n.id for n in nodes if n.partner is not None}
    nodes = [
        ComputeNode(**{**_fields(nd), "partner": partner_of.get(nd.id)}) if nd.is_fwd else nd
        for nd in nodes
    ]
    meta: dict = {"synthetic": True}
    if input_requires_grad is not None:
        meta["input_requires_grad"] = input_rg
    return Graph(nodes, data, [act[o] for o in out_set], meta=meta)


def _fields(node: ComputeNode) -> dict:
    return {name: getattr(node, name) for name in ComputeNode.__dataclass_fields__}


def chain_graph(sizes: list[int], times: list[float], bwd_times: list[float] | None = None,
                input_size: int | None = None) -> Graph:
    """A linear chain ``x -> op0 -> op1 -> ... -> loss`` with the given output sizes and times."""
    ops = [
        DagOp([i - 1 if i else -1], sizes[i], times[i],
              None if bwd_times is None else bwd_times[i], code=f"chain{i}")
        for i in range(len(sizes))
    ]
    return graph_from_dag(ops, [input_size if input_size is not None else sizes[0]])


def random_dag(rng: random.Random, n: int, n_inputs: int = 1, max_fanin: int = 3,
               p_soft: float = 0.1, max_size: int = 1000) -> list[DagOp]:
    """Random forward DAG: each op reads 1..max_fanin earlier values, skewed to recent ones."""
    ops: list[DagOp] = []
    for i in range(n):
        pool = list(range(i)) + [-1 - k for k in range(n_inputs)]
        fanin = rng.randint(1, min(max_fanin, len(pool)))
        weights = [2.0 ** -(max(i - j, 0) / 3) if j >= 0 else 0.5 for j in pool]
        chosen: list[int] = []
        while len(chosen) < fanin:
            pick = rng.choices(pool, weights)[0]
            if pick not in chosen:
                chosen.append(pick)
        soft = [j for j in range(i) if j not in chosen and rng.random() < p_soft / max(i, 1)]
        ops.append(DagOp(
            inputs=sorted(chosen, key=lambda j: (j < 0, j)), size=rng.randint(1, max_size),
            time=rng.uniform(0.5, 5.0), has_param=rng.random() < 0.7,
            saves_inputs=rng.random() < 0.8, saves_output=rng.random() < 0.3,
            overhead=rng.choice([0, 0, rng.randint(1, max_size)]), code=f"k{rng.randint(0, 3)}",
            soft_inputs=soft,
        ))
    return ops


def random_graph(seed: int, n: int, n_inputs: int = 1, **kwargs) -> Graph:
    """A random CD-graph with ``n`` forward ops (deterministic in ``seed``)."""
    rng = random.Random(seed)
    ops = random_dag(rng, n, n_inputs, **kwargs)
    sizes = [rng.randint(1, kwargs.get("max_size", 1000)) for _ in range(n_inputs)]
    return graph_from_dag(ops, sizes)
