"""Partitioners: turn the forward graph into a hierarchy of convex subgraphs.

Every partitioner has ``partition(graph) -> Hierarchy`` (and ``partition_dag(dag)`` for a bare
forward DAG). ``PARTITIONERS`` maps names to the built-in classes; the one registry,
:mod:`hiremate.registry`, builds them by name (``make_partitioner``) and takes plugins.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from hiremate.ir.graph import Graph

from .canonical import SubgraphClass, Translation
from .dag import ForwardDag, contract, forward_dag
from .draw import draw_hierarchy
from .flat import FlatPartition
from .hierarchy import Hierarchy, Part, Subgraph
from .hpartition import HPartition
from .peel import PeelPartition
from .sequence import SequencePartition


@runtime_checkable
class Partitioner(Protocol):
    """What the pipeline needs from a partitioner."""

    name: str

    def partition(self, graph: Graph) -> Hierarchy: ...

    # optional: ``coarser(top_size) -> Partitioner | None``, the same partitioner with a top
    # at most half of ``top_size`` parts, tried when a top level finds nothing (HPartition)


PARTITIONERS: dict[str, type] = {
    "hpartition": HPartition,
    "sequence": SequencePartition,
    "flat": FlatPartition,
    "peel": PeelPartition,
}


__all__ = [
    "FlatPartition", "ForwardDag", "HPartition", "Hierarchy", "PARTITIONERS", "Part",
    "Partitioner", "PeelPartition", "SequencePartition", "Subgraph", "SubgraphClass",
    "Translation", "contract", "draw_hierarchy", "forward_dag", "make_partitioner",
]
