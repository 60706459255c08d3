"""rk-Rotor refuses blocks whose backward parts cannot run as a chain
(:func:`hiremate.ir.blocks.against_the_chain`), instead of translating a schedule that reads a
value before it is made (found on a packed RNN's graph, where the partition put a node of a later
block's backward into an earlier block; rk-Rotor logged the invalid translation as a bug)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hiremate.errors import SolverError
from hiremate.ir.blocks import against_the_chain
from hiremate.partition import SequencePartition
from hiremate.solvers.chain.rk_rotor_top import RkRotorTop
from test_hilp_hier import problem_of
from test_registry import residual_chain


def test_a_chain_partition_has_no_read_against_the_chain():
    problem = problem_of(residual_chain(5), SequencePartition())
    assert len(problem.blocks) > 2
    assert against_the_chain(problem) == []


def test_a_backward_read_against_the_chain_is_refused_by_name():
    problem = problem_of(residual_chain(5), SequencePartition())
    graph = problem.graph
    # move a backward node whose value its own block's backward reads into the block before
    i, moved = next((i, n) for i, b in enumerate(problem.blocks) if i > 0 for n in b.bwd
                    if any(u in set(b.bwd) - {n}
                           for d in graph.nodes[n].outputs for u in graph.users(d)))
    later, earlier = problem.blocks[i], problem.blocks[i - 1]
    blocks = list(problem.blocks)
    blocks[i] = replace(later, bwd=tuple(n for n in later.bwd if n != moved))
    blocks[i - 1] = replace(earlier, bwd=tuple(sorted(earlier.bwd + (moved,))))
    bad = replace(problem, blocks=blocks)
    assert any(p == moved for p, _ in against_the_chain(bad))
    with pytest.raises(SolverError, match="cannot run as a chain"):
        RkRotorTop().compose(bad, 10**9)
