"""The flat partitioner: no partition at all, the whole forward graph is the top graph.

This is what a whole-graph solver such as Checkmate (or rk-Checkmate, H-ILP without
hierarchy) needs: one level, whose only subgraph is the root holding every forward node.
"""

from __future__ import annotations

from hiremate.ir.graph import Graph

from .dag import ForwardDag, forward_dag
from .hierarchy import Hierarchy, hierarchy_from_levels


class FlatPartition:
    """Hierarchy of depth 1: the root's children are all the forward nodes."""

    name = "flat"

    def __repr__(self) -> str:
        return "FlatPartition()"

    def partition_dag(self, dag: ForwardDag) -> Hierarchy:
        return hierarchy_from_levels(dag, [], partitioner=repr(self))

    def partition(self, graph: Graph) -> Hierarchy:
        dag, node_ids, _ = forward_dag(graph)
        return hierarchy_from_levels(dag, [], partitioner=repr(self), graph=graph,
                                     node_ids=node_ids)
