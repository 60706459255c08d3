"""Peeling: a large top-level block gives its sink node to a single-node block.

Why: the level above a block can get the block's outputs back only by running the block's
whole forward again (with one of its options). A flat schedule often does something much
cheaper: it frees a large output early in the backward and recomputes it later from values
kept inside the block, e.g. the concatenation that closes a U-Net level (the flat H-ILP
schedules of the zoo's ``unet`` do exactly that: docs/benchmarks.md, "Hierarchical H-ILP
against flat H-ILP"). With the block's *sinks* (forward nodes that no other node of the
block reads) as top-level nodes of their own, the level above can do the same: free a sink's
output and recompute it from the sink's inputs, which become the rest of the block's outputs.

A block of at least ``peel_min`` forward nodes with a single sink is split into the rest (in
the block's order) and the sink, a single-node block right after it. The blocks stay convex and
in a topological order: the sink has no successor inside its block, so no path leaves the rest
of the block through it, and each of its predecessors is in the rest or in an earlier block.
Blocks with several sinks are left alone, and so is a block whose peel would leave the graph of
the blocks' forward and backward parts with a cycle (checked with the graph, the backward nodes
assigned to blocks by the hierarchical solve's own rule,
:func:`hiremate.ir.blocks.assign_backward`): e.g. a gradient sum that reads from both sides
of a sink without a backward node of its own (a residual add, whose gradient passes through)
stays at the top level, between two parts of one block's backward. On a bare forward DAG
(``partition_dag``) there is no such check.

The result is a hierarchy of depth 2 (the peeled top level over the forward nodes): the
hierarchical solve (:func:`hiremate.ir.blocks.make_blocks`) reads only the top level's
blocks, flattened to their nodes. A chain partition's linking-by-one-value property is lost
where a skip connection enters a sink; rk-Rotor's chain model is then only a guide (its
schedules are simulated), the hierarchical H-ILP takes any dependency shape.
"""

from __future__ import annotations

from typing import Any, Callable

from hiremate.errors import ConfigError
from hiremate.ir.graph import Graph

from .dag import ForwardDag, forward_dag
from .hierarchy import Hierarchy, hierarchy_from_levels


def peel_sinks(dag: ForwardDag, blocks: list[tuple[int, ...]], peel_min: int,
               accept: Callable[[list[tuple[int, ...]]], bool] | None = None
               ) -> list[tuple[int, ...]]:
    """``blocks`` (DAG indices, in a topological order) with every block of at least
    ``peel_min`` nodes and a single sink split into the rest and the sink, a block right after
    the rest; ``accept`` (when given) vetoes a peel: it gets the blocks with that one peel
    applied (to those already accepted) and says whether to keep it."""
    out = [tuple(b) for b in blocks]
    if peel_min <= 0:
        return out
    succs = dag.succs()
    i = 0
    while i < len(out):
        block = out[i]
        inside = set(block)
        sinks = [u for u in block if not any(v in inside for v in succs[u])]
        if len(block) >= peel_min and len(sinks) == 1:
            trial = out[:i] + [tuple(u for u in block if u != sinks[0]), (sinks[0],)] + out[i + 1:]
            if accept is None or accept(trial):
                out = trial
                i += 1  # past the rest; the sink's block is a single node
        i += 1
    return out


def _acyclic_contraction(graph: Graph, node_ids: list[int]
                         ) -> Callable[[list[tuple[int, ...]]], bool]:
    """A veto for :func:`peel_sinks`: with the backward nodes assigned to blocks as the
    hierarchical solve does, the graph of the blocks' forward and backward parts (and the
    nodes left at the top level) must stay acyclic."""
    from hiremate.ir.blocks import assign_backward

    def ok(blocks: list[tuple[int, ...]]) -> bool:
        owner: dict[int, tuple] = {graph.loss: ("loss",)}
        fwd_block = {node_ids[u]: k for k, b in enumerate(blocks) for u in b}
        bwd_block, tail = assign_backward(graph, fwd_block)
        owner.update({n: ("F", k) for n, k in fwd_block.items()})
        owner.update({n: ("B", k) for n, k in bwd_block.items()})
        owner.update({n: ("T", n) for n in tail})
        succ: dict[tuple, set[tuple]] = {o: set() for o in owner.values()}
        for node in graph.nodes:
            for d in node.inputs:
                p = graph.data[d].producer
                if p is not None and owner[p] != owner[node.id]:
                    succ[owner[p]].add(owner[node.id])
        indeg = {o: 0 for o in succ}
        for targets in succ.values():
            for o in targets:
                indeg[o] += 1
        ready = [o for o, k in indeg.items() if k == 0]
        seen = 0
        while ready:
            o = ready.pop()
            seen += 1
            for o2 in succ[o]:
                indeg[o2] -= 1
                if indeg[o2] == 0:
                    ready.append(o2)
        return seen == len(succ)

    return ok


class PeelPartition:
    """Another partitioner's top level (``base``, with ``base_params``), with the sink of each
    of its blocks of at least ``peel_min`` forward nodes peeled (module docstring)."""

    name = "peel"

    def __init__(self, base: Any = "sequence", peel_min: int = 8,
                 base_params: dict[str, Any] | None = None):
        from . import PARTITIONERS

        if base == "peel" or isinstance(base, PeelPartition):
            raise ConfigError("partitioner 'peel' needs another partitioner as its base")
        if int(peel_min) != peel_min or peel_min < 1:
            raise ConfigError(f"peel_min={peel_min} must be a whole number >= 1 (the least "
                              "forward nodes of a block whose sinks are peeled)")
        self.base_params = dict(base_params or {})
        if not isinstance(base, str) and callable(getattr(base, "partition", None)):
            # a partitioner object (e.g. a plugin's)
            self.base_name, self.base = getattr(base, "name", type(base).__name__), base
        elif base in PARTITIONERS:
            self.base_name = base
            try:
                self.base = PARTITIONERS[base](**self.base_params)
            except TypeError as exc:
                raise ConfigError(f"bad base_params for partitioner {base!r}: {exc}") from exc
        else:
            raise ConfigError(f"unknown base partitioner {base!r} for 'peel'; choose one of "
                              f"{', '.join(sorted(set(PARTITIONERS) - {'peel'}))}, or pass a "
                              "partitioner object")
        self.peel_min = int(peel_min)

    def __repr__(self) -> str:
        return f"PeelPartition({self.base!r}, peel_min={self.peel_min})"

    def partition(self, graph: Graph) -> Hierarchy:
        h = self.base.partition(graph)
        dag, node_ids, _ = forward_dag(graph)
        index = {nid: i for i, nid in enumerate(node_ids)}
        blocks = [tuple(sorted(index[n] for n in h.leaves(p))) for p in h.top]
        accept = _acyclic_contraction(graph, node_ids)
        return self._assemble(dag, blocks, accept, graph=graph, node_ids=node_ids)

    def partition_dag(self, dag: ForwardDag) -> Hierarchy:
        h = self.base.partition_dag(dag)
        return self._assemble(dag, [tuple(sorted(h.leaves(p))) for p in h.top], None)

    def _assemble(self, dag: ForwardDag, blocks: list[tuple[int, ...]],
                  accept: Callable[[list[tuple[int, ...]]], bool] | None, **where) -> Hierarchy:
        peeled = peel_sinks(dag, blocks, self.peel_min, accept)
        levels = [peeled] if len(peeled) < dag.n else []
        return hierarchy_from_levels(dag, levels, partitioner=repr(self), **where)
