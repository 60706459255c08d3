"""Rotor: optimal rematerialisation of heterogeneous chains
(the Rotor paper).

Two dynamic programs over a :class:`~hiremate.solvers.chain.model.Chain`:

- the optimal *persistent* sequence (section 4.4, Algorithms 3-4), ``O(n^3 S)``: the engine of
  :mod:`hiremate.solvers.chain.persistent` with one variant per stage;
- the optimal *weakly persistent* sequence with a floating materialised activation
  (section 4.3, Algorithms 1-2, :mod:`hiremate.solvers.chain.weak`), ``O(n^6 S)``, which is
  optimal over all valid sequences (Lemma 4.4) but only practical for short chains.

Memory is discretised into ``S`` slots of ``(budget - x[0]) / S`` each; every size is rounded
*up*, so a sequence the DP accepts always fits the real budget (at worst it is slightly
pessimistic). Every answer is replayed by :func:`~hiremate.solvers.chain.model.simulate_chain`.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from hiremate.solvers.chain.model import (
    B, Chain, ChainGraphSolver, ChainOp, ChainSolution, F_all, F_ck, F_e, simulate_chain,
    solution, store_all_ops,
)
from hiremate.solvers.chain.persistent import (
    _EPS, DEFAULT_SLOTS, PersistentTable, StageModel, discretise, fitting_min_memory, min_memory,
)
from hiremate.solvers.chain.weak import WeakTable

log = logging.getLogger(__name__)

#: the memory the DPs get, as fractions of the budget. ``StageModel.scaled`` forgives a relative
#: ``_EPS`` of float error when rounding sizes up, so with 2**40-byte sizes a sequence a few
#: bytes over the budget can pass (5 TiB - 1 byte held 5 TiB); every DP answer is checked with
#: ``simulate_chain`` and, if it does not fit, the DP runs again with the budget shrunk by more
#: than that tolerance, where the rounding provably errs on the safe side
_SHRINKS = (1.0, 1.0 - 4 * _EPS)


def _to_chain_ops(seq: Sequence[tuple]) -> list[ChainOp]:
    conv = {"Fck": F_ck, "Fe": F_e, "Fall": F_all, "B": B}
    return [conv[item[0]](item[1]) for item in seq]


# -- chain-level entry points ------------------------------------------------------------------
def persistent_min_budget(chain: Chain) -> float:
    """Smallest budget (``x[0]`` included) for which a persistent sequence exists."""
    return chain.x[0] + min_memory(StageModel.from_chain(chain))[0]


def solve_persistent(chain: Chain, budget: float, slots: int = DEFAULT_SLOTS) -> ChainSolution:
    """Optimal persistent sequence (Algorithms 3-4) within ``budget`` (chain units, ``x[0]``
    included). Raises :class:`InfeasibleBudgetError` (a ``ValueError``) when no persistent
    sequence fits."""
    model = StageModel.from_chain(chain)
    avail = budget - chain.x[0]
    exact_min, min_ops = fitting_min_memory(model, budget, chain.x[0], "persistent")
    store = store_all_ops(chain)
    if simulate_chain(chain, store).peak <= budget:  # nothing to recompute: skip rounding
        return solution(chain, store, budget)
    for shrink in _SHRINKS:
        scaled, S = discretise(model, avail * shrink, slots)
        table = PersistentTable(scaled, S)
        if not np.isfinite(table.cost(1, chain.n)[S]):
            break
        ops = _to_chain_ops(table.sequence())
        if simulate_chain(chain, ops).peak <= budget:
            return solution(chain, ops, budget)
    log.info("rotor: budget within %d slots of the minimum; using the minimum-memory sequence",
             slots)
    return solution(chain, _to_chain_ops(min_ops), budget)


def solve_weak(chain: Chain, budget: float, slots: int = DEFAULT_SLOTS) -> ChainSolution:
    """Optimal (weakly persistent) sequence, Algorithms 1-2, within ``budget``. Falls back to
    the persistent minimum-memory sequence when discretisation makes a budget right at the
    minimum look infeasible. Raises :class:`InfeasibleBudgetError` when nothing fits."""
    model = StageModel.from_chain(chain)
    avail = budget - chain.x[0]
    store = store_all_ops(chain)
    if simulate_chain(chain, store).peak <= budget:
        return solution(chain, store, budget)
    for shrink in _SHRINKS if avail >= 0 else ():
        scaled, S = discretise(model, avail * shrink, slots)
        table = WeakTable(scaled, S)
        if not np.isfinite(table.get(1, 1, chain.n)[S]):
            break
        ops = _to_chain_ops(table.sequence())
        if simulate_chain(chain, ops).peak <= budget:
            return solution(chain, ops, budget)
    _, min_ops = fitting_min_memory(model, budget, chain.x[0], "persistent")
    return solution(chain, _to_chain_ops(min_ops), budget)


# -- graph-level solvers -----------------------------------------------------------------------
class RotorPersistent(ChainGraphSolver):
    """Rotor's optimal persistent sequence (Algorithms 3-4) on a chain-shaped graph."""

    name = "rotor-persistent"

    def __init__(self, slots: int = DEFAULT_SLOTS):
        self.slots = slots

    def solve_chain(self, chain: Chain, budget: float) -> ChainSolution:
        return solve_persistent(chain, budget, self.slots)

    def chain_min_budget(self, chain: Chain) -> float:
        return persistent_min_budget(chain)


class Rotor(ChainGraphSolver):
    """Rotor's optimal sequence (weakly persistent DP, Algorithms 1-2): optimal over all
    sequences, ``O(n^5 S)``. Chains longer than ``max_weak_stages`` use the persistent DP
    instead (the paper finds both equal on every network it tried). Its minimum budget is the
    persistent one (an upper bound of the true minimum)."""

    name = "rotor"

    def __init__(self, slots: int = DEFAULT_SLOTS, max_weak_stages: int = 25):
        self.slots = slots
        self.max_weak_stages = max_weak_stages

    def solve_chain(self, chain: Chain, budget: float) -> ChainSolution:
        if chain.n > self.max_weak_stages:
            log.info("rotor: %d stages > %d, using the persistent DP", chain.n,
                     self.max_weak_stages)
            return solve_persistent(chain, budget, self.slots)
        return solve_weak(chain, budget, self.slots)

    def chain_min_budget(self, chain: Chain) -> float:
        return persistent_min_budget(chain)


def _registry() -> dict[str, type]:
    from hiremate.solvers.chain.baselines import Autodiff, ChainStoreAll, CheckpointSequential

    return {
        "rotor": Rotor,
        "rotor-persistent": RotorPersistent,
        "checkpoint-sequential": CheckpointSequential,
        "chain-store-all": ChainStoreAll,
        "autodiff": Autodiff,
    }


#: name -> solver class (``applicable(graph)``, ``schedule(graph, budget)``, ``min_budget``)
CHAIN_SOLVERS: dict[str, type] = _registry()
