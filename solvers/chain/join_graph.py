"""Join graphs: several chains that meet at the loss, recognised in a CD-graph.

Stage ``k`` of chain ``j`` is forward node ``f_{j,k}``, producing ``a_j^k``, and its backward
partner ``b_{j,k}``, which reads ``δ_j^k``, ``a_j^k`` and ``a_j^{k-1}`` and produces
``δ_j^{k-1}``; the last activation of every chain is a model output, and the loss (the *turn*)
reads every chain's output and produces every ``δ_j^{n_j}``. :func:`graph_join` returns that
structure with the costs the join DP (:mod:`hiremate.solvers.chain.join`) reads, or why the graph
is not a join.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hiremate.solvers.chain.model import Chain, tail_peak


@dataclass(frozen=True)
class JoinChain:
    """One chain of a join graph, 1-based per stage (index 0 unused in per-stage tuples).

    ``act[k]``: data id of ``a^k`` (``None`` for ``k = 0``, the user input); ``grad[k]``: data
    ids of ``δ^k`` (``grad[n]``: the tangent); sizes ``x[k]``, ``delta[k]``; ``fwd``/``bwd``
    node ids; times and overheads; ``next_random[k]``: the id of the first random forward node
    among stages ``k..n`` (``inf`` when none), which orders first runs across chains."""

    fwd: tuple[int, ...]
    bwd: tuple[int, ...]
    act: tuple[int | None, ...]
    grad: tuple[tuple[int, ...], ...]
    x: tuple[int, ...]
    delta: tuple[int, ...]
    ft: tuple[float, ...]
    bt: tuple[float, ...]
    of: tuple[int, ...]
    ob: tuple[int, ...]
    next_random: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.fwd) - 1

    def reversal_chain(self) -> Chain:
        """The chain whose Rotor table reverses a part of this chain after the turn: the last
        stage's forward is free (its output is a model output, always present and counted
        apart) and a dummy loss stage closes it (never reached: tables are read for ``t <= n``)."""
        n = self.n
        x = list(self.x[: n]) + [0, 0]
        ft = list(self.ft[1: n]) + [0.0, 0.0]
        of = list(self.of[1: n]) + [0, 0]
        return Chain(
            fwd_time=tuple(ft), bwd_time=tuple(self.bt[1:]) + (0.0,), x=tuple(x),
            xbar=tuple(x[1:]), delta=tuple(self.delta) + (0,), fwd_overhead=tuple(of),
            bwd_overhead=tuple(self.ob[1:]) + (0,),
        )


@dataclass(frozen=True)
class JoinGraph:
    """A recognised join graph: its chains, the loss, the tail (input-gradient sums)."""

    chains: tuple[JoinChain, ...]
    loss: int
    loss_time: float
    loss_need: int          # tangents plus the loss node's overhead
    tail: tuple[int, ...]
    tail_time: float
    tail_need: int          # memory while the tail runs (kept gradients and outputs included)
    protected: frozenset[int]


def graph_join(graph) -> tuple[JoinGraph | None, str]:
    """Recognise a join-shaped graph: ``(JoinGraph, "")`` or ``(None, why not)``."""
    data, nodes = graph.data, graph.nodes
    counted = lambda ids: [d for d in ids if data[d].counted]  # noqa: E731
    size = lambda ids: sum(data[d].size for d in ids if data[d].counted)  # noqa: E731
    from hiremate.ir.graph import DataKind

    fwd = [nd for nd in nodes if nd.is_fwd]
    if not fwd:
        return None, "the graph has no forward node"
    producer_of = {}
    for f in fwd:
        outs = counted(f.outputs)
        if len(f.outputs) != 1 or len(outs) != 1 or data[outs[0]].kind is not DataKind.ACTIVATION:
            return None, f"forward node {f.name!r} does not produce exactly one activation"
        if f.partner is None or not nodes[f.partner].is_bwd:
            return None, f"forward node {f.name!r} has no backward partner"
        producer_of[outs[0]] = f
    # follow each chain from a node that reads no activation
    nxt: dict[int, int] = {}
    heads = []
    for f in fwd:
        ins = counted(f.inputs)
        if not ins:
            heads.append(f)
        elif len(ins) == 1 and ins[0] in producer_of:
            prev = producer_of[ins[0]].id
            if prev in nxt:
                return None, f"activation {data[ins[0]].name!r} feeds two forward nodes"
            nxt[prev] = f.id
        else:
            return None, f"forward node {f.name!r} does not read exactly one activation"
    loss = nodes[graph.loss]
    chains_nodes = []
    for h in heads:
        seq = [h.id]
        while seq[-1] in nxt:
            seq.append(nxt[seq[-1]])
        chains_nodes.append(seq)
    if sum(len(c) for c in chains_nodes) != len(fwd):
        return None, "some forward nodes are not on a chain"
    ends = [nodes[c[-1]].outputs[0] for c in chains_nodes]
    if sorted(counted(loss.inputs)) != sorted(ends):
        return None, "the loss node does not read exactly the last activation of every chain"
    if len(chains_nodes) < 1:
        return None, "no chain"
    tangents = counted(loss.outputs)
    chains = []
    partner_ids = set()
    for seq in chains_nodes:
        n = len(seq)
        fs = [nodes[i] for i in seq]
        bs = [nodes[f.partner] for f in fs]
        partner_ids |= {b.id for b in bs}
        act: list[int | None] = [None] + [f.outputs[0] for f in fs]
        tan = [t for t in tangents if set(graph.users(t)) == {bs[-1].id}]
        if len(tan) != 1:
            return None, f"chain ending at {fs[-1].name!r} does not get exactly one tangent"
        grad: list[tuple[int, ...]] = [()] * (n + 1)
        grad[n] = (tan[0],)
        for k in range(n, 0, -1):
            b = bs[k - 1]
            allowed = set(grad[k]) | {act[k]} | ({act[k - 1]} if k > 1 else set())
            if not set(counted(b.inputs)) <= allowed:
                return None, f"backward node {b.name!r} reads values outside its stage"
            grad[k - 1] = tuple(counted(b.outputs))
            if k > 1:
                for g in grad[k - 1]:
                    if not set(graph.users(g)) <= {bs[k - 2].id}:
                        return None, f"gradient {data[g].name!r} is read outside its stage"
        for k in range(1, n + 1):
            ok = {bs[k - 1].id} | ({fs[k].id, bs[k].id} if k < n else {loss.id})
            if not set(graph.users(act[k])) <= ok:
                return None, f"activation {data[act[k]].name!r} is read outside its stages"
        chains.append(JoinChain(
            fwd=(-1,) + tuple(seq), bwd=(-1,) + tuple(b.id for b in bs), act=tuple(act),
            grad=tuple(grad), x=(0,) + tuple(data[a].size for a in act[1:]),
            delta=tuple(size(g) for g in grad), ft=(0.0,) + tuple(f.time for f in fs),
            bt=(0.0,) + tuple(b.time for b in bs), of=(0,) + tuple(f.overhead for f in fs),
            ob=(0,) + tuple(b.overhead for b in bs), next_random=_next_random(fs),
        ))
    if len(set(tangents)) != len(chains):
        return None, "the loss produces values that no chain reads"
    tail = [nd for nd in nodes if nd.is_bwd and nd.id not in partner_ids]
    if 2 * len(fwd) + 1 + len(tail) != len(nodes):
        return None, "the graph has nodes outside the chains"
    tail_ids = {nd.id for nd in tail}
    for c in chains:
        for g in c.grad[0]:
            if not set(graph.users(g)) <= tail_ids:
                return None, "the input gradients are read by a non-final node"
    for nd in tail:
        if any(data[d].counted and data[d].producer not in tail_ids
               and not any(d in c.grad[0] for c in chains) for d in nd.inputs):
            return None, f"final node {nd.name!r} reads a value other than input gradients"
    protected = frozenset(graph.outputs) | frozenset(graph.final_data)
    need = tail_peak(graph, [d for c in chains for d in (c.act[c.n], *c.grad[0])], tail)
    return JoinGraph(
        tuple(chains), loss.id, loss.time, size(loss.outputs) + loss.overhead,
        tuple(nd.id for nd in tail), math.fsum(nd.time for nd in tail), need, protected,
    ), ""


def _next_random(fwd) -> tuple[float, ...]:
    """``out[k]``: id of the first random node among ``fwd[k-1:]`` (stages ``k..n``), ``inf``
    when none; ``out[0]`` and ``out[n + 1]`` are for convenience."""
    out = [math.inf] * (len(fwd) + 2)
    for k in range(len(fwd), 0, -1):
        out[k] = fwd[k - 1].id if fwd[k - 1].random else out[k + 1]
    out[0] = out[1]
    return tuple(out)
