"""rk-Rotor: the chain DP over blocks that each offer a menu of options (Rockmate, appendix C).

Abstract level: a :class:`BlockChain` is a sequence of blocks ``1..L``; block ``i`` reads
``a^{i-1}`` and produces ``a^i`` (sizes ``x[i-1]``, ``x[i]``; gradients ``g[i]``, by default the
same sizes). Each block has a menu of :class:`~hiremate.ir.option.Option` s and a no-save forward.
After the last block, the loss turns ``a^L`` into ``δ^L``. Operations (:class:`BlockOp`):

- ``Fe(i)``: forward keeping nothing but the output, freeing its input ``a^{i-1}``;
- ``Fc(i)``: the same forward keeping its input (a checkpoint);
- ``Fn(i, o)``: option ``o``'s forward: keeps the input, the output and the phantom;
- ``B(i, o)``: option ``o``'s backward (needs ``δ^i``, ``a^{i-1}`` and option ``o``'s forward
  outputs); frees ``δ^i``, ``a^i``, the phantom and ``a^{i-1}``, and stores ``δ^{i-1}``;
- ``Loss``: needs ``a^L``; frees it and stores ``δ^L``.

Memory uses the Option convention of :mod:`hiremate.solvers.menu` (figures above the
block's interface): while ``Fn(i, o)`` runs, memory is what is stored plus ``x[i]`` plus
``max(fwd_peak, phantom)``; while ``B(i, o)`` runs, what is stored (phantom included) plus
``bwd_peak`` plus ``g[i-1]``; a no-save forward adds ``x[i]`` plus the block's
``fe_overhead``.

The DP is Rotor's persistent DP (:class:`hiremate.solvers.chain.persistent.PersistentTable`)
where the "keep everything" start of a sub-chain has one variant per option,
``O(L^2 S (L + B))``.
:func:`solve_blocks` returns an optimal persistent block sequence; :func:`chain_menu` is the
bottom-level solver that builds a menu for a chain-shaped subgraph by solving Rotor at several
budgets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from hiremate.errors import InvalidGraphError, SolverError

from hiremate.ir.option import Option, pareto_front
from hiremate.solvers.chain.model import ChainStepError
from hiremate.solvers.chain.persistent import (
    DEFAULT_SLOTS, PersistentTable, StageModel, discretise, fitting_min_memory, min_memory,
)


@dataclass(frozen=True)
class Block:
    """One block: its option menu and its no-save forward (defaults: the cheapest option's
    forward time and the smallest ``fwd_peak``, which a no-save forward never exceeds)."""

    options: tuple[Option, ...]
    fe_time: float | None = None
    fe_overhead: float | None = None

    def no_save_forward(self) -> tuple[float, float]:
        if self.fe_time is not None and self.fe_overhead is not None:
            return self.fe_time, self.fe_overhead
        t = min(o.fwd_time for o in self.options) if self.fe_time is None else self.fe_time
        m = min(o.fwd_peak for o in self.options) if self.fe_overhead is None else self.fe_overhead
        return t, m


@dataclass(frozen=True)
class BlockChain:
    """Blocks ``1..L`` with activation sizes ``x[0..L]`` and gradient sizes ``g[0..L]``
    (default ``x``); ``loss_time`` is the loss's time; ``kept_after_loss`` bytes stay alive
    from the loss on (a model output owned by the caller)."""

    blocks: tuple[Block, ...]
    x: tuple[float, ...]
    g: tuple[float, ...] | None = None
    loss_time: float = 0.0
    kept_after_loss: float = 0.0

    def __post_init__(self) -> None:
        if len(self.x) != len(self.blocks) + 1:
            raise InvalidGraphError(f"BlockChain: {len(self.blocks)} blocks need "
                                    f"{len(self.blocks) + 1} activation sizes, got {len(self.x)}")
        if any(not b.options for b in self.blocks):
            raise InvalidGraphError("BlockChain: every block needs at least one option")
        if self.g is not None and len(self.g) != len(self.x):
            raise InvalidGraphError("BlockChain: g must have one entry per activation")

    @property
    def L(self) -> int:  # noqa: N802 - the paper's name
        return len(self.blocks)

    @property
    def grads(self) -> tuple[float, ...]:
        return tuple(self.x) if self.g is None else tuple(self.g)

    def stage_model(self) -> StageModel:
        """The DP's view: blocks ``1..L`` then the loss as stage ``L + 1``."""
        L = self.L
        x = np.array(list(self.x) + [0.0], dtype=float)
        g = np.array(list(self.grads) + [0.0], dtype=float)
        fe_time = np.zeros(L + 2)
        fe_mem = np.zeros(L + 2)
        ft, bt, keep, fpeak, bpeak = ([np.zeros(1)] for _ in range(5))
        for i, blk in enumerate(self.blocks, start=1):
            t, ovh = blk.no_save_forward()
            fe_time[i], fe_mem[i] = t, x[i] + ovh
            opts = blk.options
            ph = np.array([o.phantom for o in opts], dtype=float)
            ft.append(np.array([o.fwd_time for o in opts], dtype=float))
            bt.append(np.array([o.bwd_time for o in opts], dtype=float))
            keep.append(x[i] + ph)
            fpeak.append(x[i] + np.maximum(np.array([o.fwd_peak for o in opts], float), ph))
            bpeak.append(x[i] + ph + np.array([o.bwd_peak for o in opts], float) + g[i - 1])
        # the loss: reads a^L, produces δ^L
        ft.append(np.zeros(1))
        bt.append(np.array([self.loss_time]))
        keep.append(np.zeros(1))
        fpeak.append(np.zeros(1))
        bpeak.append(np.array([g[L]]))
        return StageModel(x=x, delta=g, fe_time=fe_time, fe_mem=fe_mem, ft=tuple(ft),
                          bt=tuple(bt), keep=tuple(keep), fpeak=tuple(fpeak),
                          bpeak=tuple(bpeak), kept_after_loss=float(self.kept_after_loss))


@dataclass(frozen=True, slots=True)
class BlockOp:
    """``kind`` in ``Fe``, ``Fc``, ``Fn``, ``B``, ``Loss``; ``option`` for ``Fn`` and ``B``."""

    kind: str
    block: int
    option: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}{self.block}" + ("" if self.option is None else f"[{self.option}]")


@dataclass(frozen=True)
class BlockResult:
    valid: bool
    makespan: float
    peak: float
    error: str | None = None


@dataclass(frozen=True)
class BlockSolution:
    """Operations, with the makespan and peak :func:`simulate_blocks` gives them."""

    ops: tuple[BlockOp, ...]
    makespan: float
    peak: float
    budget: float

    def __str__(self) -> str:
        return " ".join(str(op) for op in self.ops)


class BlockState:
    """Mutable replay state of :func:`simulate_blocks` (also stepped by exhaustive searches)."""

    __slots__ = ("plain", "bar", "grad", "mem")

    def __init__(self, plain: frozenset, bar: tuple, grad: int, mem: float):
        self.plain, self.bar, self.grad, self.mem = plain, bar, grad, mem

    def key(self) -> tuple:
        return self.plain, self.bar, self.grad


def initial_block_state(bc: BlockChain) -> BlockState:
    return BlockState(frozenset(), (None,) * (bc.L + 1), bc.L + 1, float(bc.x[0]))


def block_step(bc: BlockChain, st: BlockState, op: BlockOp) -> tuple[BlockState, float, float]:
    """Run ``op``: the new state, the memory while it runs, and its time;
    :class:`ChainStepError` (a ``ValueError``) when it cannot run."""
    L, x, g = bc.L, bc.x, bc.grads
    i = op.block
    have = lambda k: k == 0 or k in st.plain or (k <= L and st.bar[k] is not None)  # noqa
    if op.kind == "Loss":
        if i != L + 1 or st.grad != L + 1 or not have(L):
            raise ChainStepError(f"{op}: the loss needs a^{L} and must run once")
        during = st.mem + g[L]
        plain, mem = st.plain, st.mem + g[L] + bc.kept_after_loss
        if L in plain and L > 0:
            plain, mem = plain - {L}, mem - x[L]
        return BlockState(plain, st.bar, L, mem), during, bc.loss_time
    if not 1 <= i <= L:
        raise ChainStepError(f"{op}: there is no block {i}")
    blk = bc.blocks[i - 1]
    if op.kind == "B":
        o = op.option
        if st.grad != i or st.bar[i] != o or not have(i - 1):
            raise ChainStepError(f"{op}: needs δ^{i}, Fn{i}[{o}]'s values and a^{i - 1}")
        opt = blk.options[o]
        during = st.mem + opt.bwd_peak + g[i - 1]
        mem = st.mem - x[i] - opt.phantom - g[i] + g[i - 1]
        bar = st.bar[:i] + (None,) + st.bar[i + 1:]
        plain = st.plain
        if i - 1 in plain:
            plain, mem = plain - {i - 1}, mem - x[i - 1]
        return BlockState(plain, bar, i - 1, mem), during, opt.bwd_time
    if not have(i - 1):
        raise ChainStepError(f"{op}: needs a^{i - 1}")
    if st.bar[i] is not None:
        raise ChainStepError(f"{op}: block {i} already holds an option's forward values")
    if op.kind == "Fn":
        opt = blk.options[op.option]
        during = st.mem + x[i] + max(opt.fwd_peak, opt.phantom)
        mem = st.mem + x[i] + opt.phantom
        plain = st.plain
        if i in plain:
            plain, mem = plain - {i}, mem - x[i]
        bar = st.bar[:i] + (op.option,) + st.bar[i + 1:]
        return BlockState(plain, bar, st.grad, mem), during, opt.fwd_time
    if op.kind not in ("Fe", "Fc"):
        raise ChainStepError(f"unknown block operation {op.kind!r}")
    if i in st.plain:
        raise ChainStepError(f"{op}: a^{i} is already stored")
    t, ovh = blk.no_save_forward()
    during = st.mem + x[i] + ovh
    plain, mem = st.plain | {i}, st.mem + x[i]
    if op.kind == "Fe" and i - 1 in st.plain:
        plain, mem = plain - {i - 1}, mem - x[i - 1]
    return BlockState(plain, st.bar, st.grad, mem), during, t


def simulate_blocks(bc: BlockChain, ops: Sequence[BlockOp]) -> BlockResult:
    """Replay ``ops``; valid when every operation can run and ``δ^0`` is computed."""
    st = initial_block_state(bc)
    peak, total = st.mem, []
    for k, op in enumerate(ops):
        try:
            st, during, t = block_step(bc, st, op)
        except ValueError as exc:
            return BlockResult(False, math.fsum(total), peak, f"operation {k}: {exc}")
        peak = max(peak, during, st.mem)
        total.append(t)
    if st.grad != 0:
        return BlockResult(False, math.fsum(total), peak, "δ^0 is not computed at the end")
    return BlockResult(True, math.fsum(total), peak)


def _block_ops(seq: Iterable[tuple], L: int) -> list[BlockOp]:
    out: list[BlockOp] = []
    for item in seq:
        kind, k = item[0], item[1]
        if k == L + 1:
            if kind == "B":
                out.append(BlockOp("Loss", k))
            continue  # the loss's "forward" is nothing
        if kind == "Fall":
            out.append(BlockOp("Fn", k, int(item[2])))
        elif kind == "B":
            out.append(BlockOp("B", k, int(item[2])))
        else:
            out.append(BlockOp("Fc" if kind == "Fck" else "Fe", k))
    return out


def block_min_budget(bc: BlockChain) -> float:
    """Smallest budget (``x[0]`` included) for which a persistent block sequence exists."""
    return bc.x[0] + min_memory(bc.stage_model())[0]


def solve_blocks(bc: BlockChain, budget: float, slots: int = DEFAULT_SLOTS) -> BlockSolution:
    """Optimal persistent block sequence within ``budget`` (``x[0]`` included; sizes rounded
    up to ``(budget - x[0]) / slots``). :class:`InfeasibleBudgetError` when nothing fits."""
    model = bc.stage_model()
    avail = budget - bc.x[0]
    exact_min, min_ops = fitting_min_memory(model, budget, bc.x[0], "block chain's")
    scaled, S = discretise(model, avail, slots)
    table = PersistentTable(scaled, S)
    seq = table.sequence() if np.isfinite(table.cost(1, model.n)[S]) else min_ops
    ops = _block_ops(seq, bc.L)
    res = simulate_blocks(bc, ops)
    if not res.valid or res.peak > budget * (1 + 1e-9) + 1e-9:
        raise SolverError(f"rk-Rotor produced a bad sequence ({res}): a bug in hiremate; "
                          "please report it")
    return BlockSolution(tuple(ops), res.makespan, res.peak, budget)


# -- bottom level: menus of a chain-shaped subgraph -------------------------------------------
def chain_menu(graph, budgets: Sequence[int] | None = None, n_budgets: int = 8,
               slots: int = DEFAULT_SLOTS) -> list[Option]:
    """Options of a chain-shaped subgraph: Rotor's persistent sequence at each budget (default:
    ``n_budgets`` from the smallest feasible one to the store-everything peak), each split at
    the loss step with :func:`hiremate.solvers.menu.option_from_schedule`; the Pareto
    front is returned."""
    from hiremate.errors import InfeasibleBudgetError, SolverError
    from hiremate.ir.simulator import simulate
    from hiremate.solvers.chain.model import graph_chain, ops_to_schedule, store_all_ops
    from hiremate.solvers.menu import option_from_schedule
    from hiremate.solvers.chain.rotor import persistent_min_budget, solve_persistent

    gc, why = graph_chain(graph)
    if gc is None:
        raise SolverError(f"chain_menu needs a chain-shaped graph: {why}")
    lo = max(math.ceil(persistent_min_budget(gc.chain)), gc.tail_need)
    hi = simulate(graph, ops_to_schedule(gc, store_all_ops(gc.chain))).peak
    if budgets is None:
        budgets = sorted({int(round(b)) for b in np.linspace(lo, max(lo, hi), n_budgets)})
    options = []
    for b in budgets:
        if b < lo:
            continue
        sol = solve_persistent(gc.chain, b, slots)
        options.append(option_from_schedule(graph, ops_to_schedule(gc, sol.ops), "rotor"))
    if not options:
        raise InfeasibleBudgetError(
            f"chain_menu: every budget is below the {lo} bytes the chain needs", min_budget=lo)
    return pareto_front(options)
