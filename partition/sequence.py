"""The sequence partitioner: cut the forward graph into a chain of blocks, as Rockmate does.

A node s is a 1-separator when every edge leaving the nodes up to s (in topological order)
leaves from s itself: nothing computed before s is needed after it, except through s. Cutting
after every separator gives a chain of blocks, each an interval of the topological order (so
convex), linked by a single node's values; rk-Rotor's dynamic program then solves the chain.
Soft dependencies count as edges; user inputs and parameters bring none (paper, C.1.3), which
is what lets an encoder-decoder model be cut at all. Blocks may be arbitrarily large: this
partitioner only finds the sequential structure there is.
"""

from __future__ import annotations

from hiremate.graph import Graph

from .dag import ForwardDag, forward_dag
from .hierarchy import Hierarchy, hierarchy_from_levels


def separators(dag: ForwardDag) -> list[int]:
    """Nodes s such that no edge goes from a node before s to a node after s."""
    furthest = [-1] * dag.n  # furthest successor of each node
    for i, ps in enumerate(dag.preds):
        for p in ps:
            if i > furthest[p]:
                furthest[p] = i
    out = []
    reach = -1  # furthest successor of the nodes strictly before s
    for s in range(dag.n):
        if reach <= s:
            out.append(s)
        reach = max(reach, furthest[s])
    return out


def sequence_blocks(dag: ForwardDag) -> list[tuple[int, ...]]:
    """Blocks of the chain: each ends at a separator (the last block at the last node)."""
    blocks: list[tuple[int, ...]] = []
    start = 0
    for s in separators(dag):
        blocks.append(tuple(range(start, s + 1)))
        start = s + 1
    if start < dag.n:
        blocks.append(tuple(range(start, dag.n)))
    return blocks


class SequencePartition:
    """Hierarchy of depth 2: the root is the chain of blocks found at 1-separators."""

    name = "sequence"

    def __repr__(self) -> str:
        return "SequencePartition()"

    def partition_dag(self, dag: ForwardDag) -> Hierarchy:
        return hierarchy_from_levels(dag, _levels(dag), partitioner=repr(self))

    def partition(self, graph: Graph) -> Hierarchy:
        dag, node_ids, _ = forward_dag(graph)
        return hierarchy_from_levels(dag, _levels(dag), partitioner=repr(self), graph=graph,
                                     node_ids=node_ids)


def _levels(dag: ForwardDag) -> list[list[tuple[int, ...]]]:
    blocks = sequence_blocks(dag)
    return [blocks] if len(blocks) < dag.n else []
