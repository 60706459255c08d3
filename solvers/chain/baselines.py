"""Sequential baselines: store everything (autodiff) and ``checkpoint_sequential`` segments.

``checkpoint_sequential`` (PyTorch; Rotor paper, section 5.4) cuts the chain into segments,
runs every segment but the last without keeping anything but its input, and, during the
backward, reruns each segment keeping everything before backpropagating through it. Both
baselines have no choice to make, so their minimum budget is simply their own peak.
"""

from __future__ import annotations

import math

from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.solvers.chain.model import (
    B, Chain, ChainGraphSolver, ChainOp, ChainSolution, F_all, F_ck, F_e, simulate_chain,
    solution, store_all_ops,
)
from hiremate.units import fmt_bytes


def segment_bounds(n: int, segments: int) -> list[tuple[int, int]]:
    """Split stages ``1..n`` into ``segments`` contiguous, near-equal ``(first, last)`` ranges."""
    segments = max(1, min(int(segments), n))
    cuts = [round(i * n / segments) for i in range(segments + 1)]
    return [(cuts[i] + 1, cuts[i + 1]) for i in range(segments) if cuts[i + 1] > cuts[i]]


def sequential_ops(chain: Chain, segments: int) -> list[ChainOp]:
    """The ``checkpoint_sequential`` sequence with ``segments`` segments."""
    bounds = segment_bounds(chain.n, segments)
    ops: list[ChainOp] = []
    for first, last in bounds[:-1]:
        ops += [F_ck(first)] + [F_e(k) for k in range(first + 1, last + 1)]
    first, last = bounds[-1]
    ops += [F_all(k) for k in range(first, last + 1)] + [B(k) for k in range(last, first - 1, -1)]
    for first, last in reversed(bounds[:-1]):
        ops += [F_all(k) for k in range(first, last + 1)]
        ops += [B(k) for k in range(last, first - 1, -1)]
    return ops


def default_segments(n: int) -> int:
    """``round(sqrt(n))``, the optimal count for homogeneous chains."""
    return max(1, round(math.sqrt(n)))


class CheckpointSequential(ChainGraphSolver):
    """``torch.utils.checkpoint.checkpoint_sequential`` with ``segments`` segments (default
    ``sqrt(n)``) on a chain-shaped graph."""

    name = "checkpoint-sequential"

    def __init__(self, segments: int | None = None):
        self.segments = segments

    def _ops(self, chain: Chain) -> list[ChainOp]:
        return sequential_ops(chain, self.segments or default_segments(chain.n))

    def solve_chain(self, chain: Chain, budget: float) -> ChainSolution:
        return solution(chain, self._ops(chain), budget)

    def chain_min_budget(self, chain: Chain) -> float:
        return simulate_chain(chain, self._ops(chain)).peak


class ChainStoreAll(ChainGraphSolver):
    """Store everything, through the chain model (``F_all`` then ``B`` for every stage)."""

    name = "chain-store-all"

    def solve_chain(self, chain: Chain, budget: float) -> ChainSolution:
        return solution(chain, store_all_ops(chain), budget)

    def chain_min_budget(self, chain: Chain) -> float:
        return simulate_chain(chain, store_all_ops(chain)).peak


class Autodiff:
    """What eager PyTorch does: every node once, each value freed after its last reader.
    Applies to any graph."""

    name = "autodiff"

    def applicable(self, graph) -> bool:
        return True

    def min_budget(self, graph) -> int:
        return simulate(graph, autodiff_schedule(graph)).peak

    def schedule(self, graph, budget: int):
        sched = autodiff_schedule(graph)
        peak = simulate(graph, sched).peak
        if budget < peak:
            raise InfeasibleBudgetError(
                f"autodiff: budget {fmt_bytes(budget)} is below the {fmt_bytes(peak)} that "
                "storing every activation needs; use a rematerialisation solver (e.g. rotor)",
                min_budget=peak)
        return sched
