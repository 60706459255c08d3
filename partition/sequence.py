"""The sequence partitioner: cut the forward graph into a chain of blocks, as Rockmate does.

A node s is a 1-separator when every edge leaving the nodes up to s (in topological order)
leaves from s itself: nothing computed before s is needed after it, except through s. Cutting
after every separator gives a chain of blocks, each an interval of the topological order (so
convex), linked by a single node's values; rk-Rotor's dynamic program then solves the chain.
Soft dependencies count as edges; user inputs and parameters bring none ("HiRemate:
Hierarchical Approach for Efficient Re-materialization of Large Neural Networks", appendix
C.1.3), which is what lets an encoder-decoder model be cut at all. Blocks may be arbitrarily
large: this partitioner only finds the sequential structure there is.

Constant values (an attention mask or position ids, computed from nothing that needs a
gradient, :mod:`.constants`) are read by every layer and would leave no separator between the
layers. Their nodes are hoisted into a first block, the *prologue*, and their edges are left out
when looking for separators in the rest, the way inputs are; the blocks that read them get them
as inputs from the prologue, which the top level keeps alive (``const_fraction`` bounds their
size; 0 turns hoisting off).

The chain after the prologue has at most ``max_blocks`` blocks (consecutive blocks joined,
:func:`merge_chain`), for the reason H-Partition bounds its top graph (M^t in the HiRemate
paper): the top-level composers grow with the number of blocks (rk-Rotor's DP cubically,
hilp-top's MILP quadratically), and per-block menus (H-ILP on each unique block) trade memory
for time inside a block better than the composer does between tiny blocks. The default of 64
was chosen on a deep GPT-2 (docs/benchmarks.md, "Sequence partition: length of the chain");
the zoo's other chains are shorter and are left alone.
"""

from __future__ import annotations

import logging

from hiremate.errors import ConfigError
from hiremate.ir.graph import Graph

from .constants import DEFAULT_FRACTION, prologue
from .dag import ForwardDag, forward_dag
from .hierarchy import Hierarchy, hierarchy_from_levels

log = logging.getLogger(__name__)

#: default bound on the chain's length (blocks after the prologue); see the module docstring
DEFAULT_MAX_BLOCKS = 64


def separators(dag: ForwardDag) -> list[int]:
    """Nodes s such that no edge goes from a node before s to a node after s."""
    return _separators(dag.preds)


def _separators(preds: list[tuple[int, ...]]) -> list[int]:
    furthest = [-1] * len(preds)  # furthest successor of each node
    for i, ps in enumerate(preds):
        for p in ps:
            if i > furthest[p]:
                furthest[p] = i
    out = []
    reach = -1  # furthest successor of the nodes strictly before s
    for s in range(len(preds)):
        if reach <= s:
            out.append(s)
        reach = max(reach, furthest[s])
    return out


def sequence_blocks(dag: ForwardDag) -> list[tuple[int, ...]]:
    """Blocks of the chain: each ends at a separator (the last block at the last node)."""
    return _interval_blocks(dag.preds)


def _interval_blocks(preds: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    blocks: list[tuple[int, ...]] = []
    start = 0
    for s in _separators(preds):
        blocks.append(tuple(range(start, s + 1)))
        start = s + 1
    if start < len(preds):
        blocks.append(tuple(range(start, len(preds))))
    return blocks


def merge_chain(dag: ForwardDag, blocks: list[tuple[int, ...]], max_blocks: int
                ) -> list[tuple[int, ...]]:
    """At most ``max_blocks`` blocks: consecutive blocks joined greedily until each holds at
    least ``1 / max_blocks`` of the nodes (counted with ``dag.weight``). Consecutive blocks of
    a chain form an interval of its order, so each union stays convex; a repeating chain (the
    layers of a transformer) gives repeating unions, so identical blocks stay few."""
    if max_blocks <= 0 or len(blocks) <= max_blocks:
        return list(blocks)
    total = sum(dag.weight[u] for b in blocks for u in b)
    target = total / max_blocks
    out: list[tuple[int, ...]] = []
    cur: list[int] = []
    size = 0
    for b in blocks:
        cur.extend(b)
        size += sum(dag.weight[u] for u in b)
        if size >= target:
            out.append(tuple(cur))
            cur, size = [], 0
    if cur:
        if out and len(out) >= max_blocks:
            out[-1] = out[-1] + tuple(cur)
        else:
            out.append(tuple(cur))
    return out


def hoisted_blocks(dag: ForwardDag, const_fraction: float = DEFAULT_FRACTION
                   ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The prologue (``()`` when no constant value fits ``const_fraction``) and the chain of
    the other nodes, cut at the separators found without the prologue's edges.

    The prologue is closed under predecessors, so no edge enters it from the rest and each
    block of the rest (an interval of the rest's order) stays convex in the whole DAG.
    """
    pro = prologue(dag, const_fraction)
    if not pro:
        return (), sequence_blocks(dag)
    hoisted = set(pro)
    rest = [i for i in range(dag.n) if i not in hoisted]
    index = {u: k for k, u in enumerate(rest)}
    preds = [tuple(index[p] for p in dag.preds[u] if p not in hoisted) for u in rest]
    chain = [tuple(rest[k] for k in b) for b in _interval_blocks(preds)]
    log.info("sequence partition: %d constant nodes hoisted into a prologue, %d blocks after "
             "it (%d without hoisting)", len(pro), len(chain), len(sequence_blocks(dag)))
    return tuple(pro), chain


class SequencePartition:
    """Hierarchy of depth 2: the root is the chain of blocks found at 1-separators, after a
    prologue of hoisted constant nodes, with at most ``max_blocks`` blocks after it (module
    docstring)."""

    name = "sequence"

    def __init__(self, const_fraction: float = DEFAULT_FRACTION,
                 max_blocks: int = DEFAULT_MAX_BLOCKS):
        if not 0 <= const_fraction <= 1:
            raise ConfigError(f"const_fraction={const_fraction} must be in [0, 1] (a share of "
                              "the forward values' bytes; 0 turns hoisting off)")
        if int(max_blocks) != max_blocks or max_blocks < 0:
            raise ConfigError(f"max_blocks={max_blocks} must be a whole number >= 0 (0: no "
                              "bound on the chain's length)")
        self.const_fraction = float(const_fraction)
        self.max_blocks = int(max_blocks)

    def __repr__(self) -> str:
        args = []
        if self.const_fraction != DEFAULT_FRACTION:
            args.append(f"const_fraction={self.const_fraction}")
        if self.max_blocks != DEFAULT_MAX_BLOCKS:
            args.append(f"max_blocks={self.max_blocks}")
        return f"SequencePartition({', '.join(args)})"

    def partition_dag(self, dag: ForwardDag) -> Hierarchy:
        return hierarchy_from_levels(dag, self._levels(dag), partitioner=repr(self))

    def partition(self, graph: Graph) -> Hierarchy:
        dag, node_ids, _ = forward_dag(graph)
        return hierarchy_from_levels(dag, self._levels(dag), partitioner=repr(self),
                                     graph=graph, node_ids=node_ids)

    def _levels(self, dag: ForwardDag) -> list[list[tuple[int, ...]]]:
        pro, chain = hoisted_blocks(dag, self.const_fraction)
        merged = merge_chain(dag, chain, self.max_blocks)
        if len(merged) < len(chain):
            log.info("sequence partition: %d blocks joined into %d (max_blocks=%d)",
                     len(chain), len(merged), self.max_blocks)
        blocks = ([pro] if pro else []) + merged
        # a level of single nodes still matters when it puts the prologue first
        return [blocks] if len(blocks) < dag.n or pro else []
