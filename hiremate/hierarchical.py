"""The glue between partition, solvers and the full graph: blocks, menus, the top-level solve.

What runs (honestly, as implemented):

1. **Flat path** (graphs of at most ``flat_max_nodes`` compute nodes): every ``flat`` solver of
   the configuration schedules the whole graph (H-ILP = rk-Checkmate with a time limit, TW-Remat,
   FastSA, Rotor on chain-shaped graphs, autodiff).
2. **Hierarchical path**: the partitioner's *top level* gives the blocks (each a top-level part,
   a forward node or a subgraph, flattened to its original nodes). Every block becomes a CD-graph
   of its own (:func:`extract`): its forward nodes, a loss node standing for the rest of the model
   (it reads the block's outputs and produces the gradients that flow in), and its backward
   nodes. Backward nodes without a forward partner join the block whose data they read (or stay
   at the top level, run as soon as their inputs exist). Blocks with equal canonical graphs are
   solved once; each ``bottom`` solver gives a menu, the menus are merged (Pareto front) and cut
   to ``n_options`` (farthest peaks). A ``top`` composer (rk-Rotor, Rockmate appendix C) then
   schedules the sequence of blocks with their menus: rk-Rotor (Rockmate appendix C: the
   blocks as a chain) and/or the hierarchical H-ILP (``hilp-top``,
   :mod:`hiremate.solvers.hilp_hier_solver`: a MILP over the blocks' forward and backward
   nodes with options and phantoms, any dependency shape between blocks); every composer's
   candidates are simulated and the fastest valid one within the budget wins.

Translating back: a block operation becomes the compute steps of its option's forward or
backward part (renamed to full-graph ids); the whole compute sequence gets its frees from
:func:`hiremate.solvers.remat_sequence.sequence_to_schedule` (each value freed after its last
read before it is produced again: for a fixed compute order, the least memory), which makes any
such sequence valid. Its memory is then whatever :func:`hiremate.simulate` says: a composer's
abstract model is only a guide, so each candidate is simulated on the full graph and kept only
when within the budget (rk-Rotor is re-run at a lower abstract budget when the simulated peak
overshoots).

Values read beyond a chain of blocks (a constant such as an attention mask, which the sequence
partitioner hoists into a first block and every layer's block reads as an input; a gradient
that a tail node sums at the end) stay alive across the blocks in between. ``hilp-top`` models
them exactly (they are data nodes of its top graph); rk-Rotor's chain model counts them over
their span (:func:`long_lived`), so its abstract peak bounds the simulated one.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from hiremate.errors import InfeasibleBudgetError, SolverError
from hiremate.graph import (
    COUNTED_KINDS, FINAL_KINDS, SOURCE_KINDS, ComputeNode, DataKind, DataNode, Graph, NodeKind,
)
from hiremate.option import Option, pareto_front
from hiremate.schedule import Compute, Schedule
from hiremate.simulator import SimulationResult, autodiff_schedule, simulate
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)


# -- blocks ---------------------------------------------------------------------------------------
@dataclass
class Block:
    """One top-level part as a CD-graph of its own, with the renaming to full-graph ids."""

    index: int
    fwd: tuple[int, ...]
    bwd: tuple[int, ...]
    graph: Graph
    node_map: tuple[int, ...]   # local compute id -> full id (-1 for the local loss node)
    data_map: tuple[int, ...]   # local data id -> full id
    key: str = ""
    options: list[Option] = field(default_factory=list)

    def sequence(self, part: Schedule) -> list[int]:
        """Full-graph compute ids of the compute steps of ``part`` (local loss left out)."""
        out = []
        for step in part:
            if isinstance(step, Compute):
                full = self.node_map[step.node]
                if full >= 0:
                    out.append(full)
        return out


def assign_backward(graph: Graph, fwd_block: dict[int, int]) -> tuple[dict[int, int], list[int]]:
    """Block of every backward node: a forward node's partner goes with it; another backward
    node joins the block of the data it reads when those come from one block or two neighbours
    (the lower one, whose backward reads the gradient anyway); the rest (e.g. sums of partial
    gradients of a weight shared by distant blocks) stays at the top level (``tail``).

    Values of constant forward nodes (:mod:`hiremate.partition.constants`: masks, position ids)
    count like inputs here: the top level keeps them alive for any block that reads them, so
    they decide the block only when the node reads nothing else."""
    from hiremate.partition.constants import constant_nodes

    bwd_block: dict[int, int] = {}
    for n in graph.fwd_nodes:
        if n.partner is not None:
            bwd_block[n.partner] = fwd_block[n.id]
    loss = graph.loss
    const = constant_nodes(graph)
    tail: list[int] = []
    for n in graph.bwd_nodes:
        if n.id in bwd_block:
            continue
        blocks: set[int] = set()
        const_blocks: set[int] = set()
        orphan = False
        for d in n.inputs:
            p = graph.data[d].producer
            if p is None or p == loss:
                continue
            b = fwd_block.get(p) if p < loss else bwd_block.get(p)
            if b is None:
                orphan = True
            elif p in const:
                const_blocks.add(b)
            else:
                blocks.add(b)
        blocks = blocks or const_blocks
        if blocks and not orphan and max(blocks) - min(blocks) <= 1:
            bwd_block[n.id] = min(blocks)
        else:
            tail.append(n.id)
    return bwd_block, tail


def extract(graph: Graph, fwd: Sequence[int], bwd: Sequence[int]) -> tuple[Graph, list[int], list[int]]:
    """The CD-graph of a block: ``fwd`` nodes, a loss node, ``bwd`` nodes (see module doc).

    Data produced outside become sources (forward values) or outputs of the local loss
    (gradients flowing in); gradients leaving the block, or required at the end, become final.
    """
    fwd, bwd = sorted(fwd), sorted(bwd)
    fset, bset = set(fwd), set(bwd)
    inside = fset | bset
    gdata = graph.data
    order: dict[int, int] = {}
    for nid in fwd + bwd:
        nd = graph.nodes[nid]
        for d in nd.inputs + nd.soft_inputs + nd.outputs:
            order.setdefault(d, len(order))
    data_map = list(order)
    node_map = fwd + [-1] + bwd
    local_node = {nid: i for i, nid in enumerate(node_map) if nid >= 0}
    loss_id = len(fwd)
    protected = set(graph.outputs)
    kinds: list[DataKind] = []
    producers: list[int | None] = []
    outputs: list[int] = []
    grads_in: list[int] = []
    for local, d in enumerate(data_map):
        dn = gdata[d]
        p = dn.producer
        if p in inside:
            if p in fset:
                kind = dn.kind if dn.kind is DataKind.ACTIVATION else DataKind.ACTIVATION
                leaves = d in protected or any(u not in inside for u in graph.users(d)) \
                    or any(u not in inside for u in graph.soft_users(d))
                if leaves:
                    outputs.append(local)
            else:
                leaves = dn.kind in FINAL_KINDS or d in protected \
                    or any(u not in inside for u in graph.users(d))
                if dn.kind is DataKind.PARAM_GRAD:
                    kind = DataKind.PARAM_GRAD
                elif leaves:
                    kind = DataKind.INPUT_GRAD if dn.counted else DataKind.PARAM_GRAD
                else:
                    kind = DataKind.GRAD if dn.counted else dn.kind
            producers.append(local_node[p])
        elif p is None:
            kind = dn.kind
            producers.append(None)
        elif p < graph.loss:
            kind = DataKind.INPUT
            producers.append(None)
        else:
            kind = DataKind.TANGENT if dn.counted else DataKind.PARAM_GRAD
            if kind is DataKind.PARAM_GRAD:  # an uncounted gradient flowing in: keep as source
                kind = DataKind.INPUT
                producers.append(None)
            else:
                producers.append(loss_id)
                grads_in.append(local)
        kinds.append(kind)
    local_data = {d: i for i, d in enumerate(data_map)}
    data = [DataNode(i, gdata[d].name, kinds[i], gdata[d].shape, gdata[d].dtype, gdata[d].size,
                     producers[i]) for i, d in enumerate(data_map)]

    def loc(ds) -> tuple[int, ...]:
        return tuple(local_data[d] for d in ds)

    nodes: list[ComputeNode] = []
    for i, nid in enumerate(node_map):
        if nid < 0:
            nodes.append(ComputeNode(i, "block_loss", NodeKind.LOSS, tuple(outputs),
                                     tuple(grads_in)))
            continue
        nd = graph.nodes[nid]
        partner = local_node.get(nd.partner) if nd.partner is not None else None
        nodes.append(ComputeNode(
            i, nd.name, nd.kind, loc(nd.inputs), loc(nd.outputs), nd.time, nd.overhead,
            loc(nd.soft_inputs), partner, nd.signature, (), nd.mutates, nd.random, nd.flops))
    return Graph(nodes, data, outputs), node_map, data_map


def make_blocks(graph: Graph, hierarchy: Any) -> tuple[list[Block], list[int]]:
    """Blocks of the hierarchy's top level, in order, and the top-level (tail) backward nodes."""
    from hiremate.menu_cache import graph_key

    fwd_block: dict[int, int] = {}
    parts = [tuple(sorted(hierarchy.leaves(p))) for p in hierarchy.top]
    for i, leaves in enumerate(parts):
        for f in leaves:
            fwd_block[f] = i
    missing = [n.id for n in graph.fwd_nodes if n.id not in fwd_block]
    if missing:
        raise SolverError(f"the partition leaves forward nodes {missing[:5]} out of every block; "
                          "this is a partitioner bug")
    bwd_block, tail = assign_backward(graph, fwd_block)
    bwd_of: list[list[int]] = [[] for _ in parts]
    for b, i in bwd_block.items():
        bwd_of[i].append(b)
    blocks = []
    for i, leaves in enumerate(parts):
        sub, node_map, data_map = extract(graph, leaves, bwd_of[i])
        blocks.append(Block(i, leaves, tuple(sorted(bwd_of[i])), sub, tuple(node_map),
                            tuple(data_map), graph_key(sub, times=True)))
    return blocks, tail


# -- menus ----------------------------------------------------------------------------------------
def menu_budgets(solver: Any, graph: Graph, n_peak: int, n_save: int) -> list:
    from hiremate.solvers.hilp_menu import budget_grid

    grid = budget_grid(graph, n_peak, n_save)
    if getattr(solver, "menu_pairs", False):
        return grid
    return sorted({p for p, _ in grid})


def solve_menu_task(graph: Graph, name: str, cls: type, params: dict, n_peak: int,
                    n_save: int) -> tuple[list[Option], float, str]:
    """One (block, solver) menu: options, seconds, and an error text ('' when fine). Runs in a
    joblib worker, so it takes and returns picklable values; the solver's class travels with
    the task (a worker process does not see classes registered at run time)."""
    start = time.perf_counter()
    try:
        solver = cls(**params)
        if not getattr(solver, "name", None):
            solver.name = name
        if not solver.applicable(graph):
            return [], time.perf_counter() - start, "not applicable"
        options = list(solver.menu(graph, menu_budgets(solver, graph, n_peak, n_save)))
        options = [o if o.solver == name else _with_solver(o, name) for o in options]
        return options, time.perf_counter() - start, ""
    except Exception as exc:  # one solver failing on one block must not stop the others
        return [], time.perf_counter() - start, f"{type(exc).__name__}: {exc}"


def _with_solver(o: Option, name: str) -> Option:
    from dataclasses import replace

    return replace(o, solver=name)


def store_all_option(graph: Graph) -> Option:
    """The block's store-everything option (always on the menu, so every block has one)."""
    from hiremate.solvers.hilp_menu import option_from_schedule

    return option_from_schedule(graph, autodiff_schedule(graph), "autodiff")


def select_menu(options: list[Option], n_options: int) -> list[Option]:
    from hiremate.solvers.hilp_menu import spread

    return spread(pareto_front(options), n_options)


# -- top level: rk-Rotor over the blocks ------------------------------------------------------------
@dataclass
class TopProblem:
    """What a top-level composer sees: the full graph, its blocks (with menus) and the tail."""

    graph: Graph
    blocks: list[Block]
    tail: list[int]


def long_lived(problem: TopProblem) -> tuple[dict[int, int], dict[int, tuple[int, int, int]]]:
    """Values that a chain of blocks does not account for, with their counted sizes.

    A chain composer (rk-Rotor) assumes that block ``i``'s forward values are read by blocks
    ``i`` and ``i + 1`` only (by the loss when ``i`` is the last block), that only the last
    block returns model outputs, that the loss's gradients are read by the last block only and
    that block ``i``'s backward gradients are read by blocks ``i`` and ``i - 1`` only. A value
    read elsewhere lives on past its place in the chain: a hoisted constant read by every layer,
    a value read by a top-level tail node (e.g. the partial gradient of a weight shared by the
    first and the last block, summed at the end), the gradient of a model output returned by an
    earlier block. Translated schedules keep such a value until its last read before it is
    produced again (:func:`flatten`).

    Returns the forward values (data id -> size), which the chain then counts as alive
    throughout, and the backward-phase values (data id -> size, ``lo``, ``hi``): alive from the
    step that produces the chain's gradient ``δ^hi`` (the loss for ``hi = L``, block ``hi``'s
    backward otherwise, 0-based) to the step that consumes ``δ^lo`` (the end for ``lo = 0``),
    which the chain counts as part of ``δ^lo .. δ^hi``. Both bound the real memory from above
    (:meth:`RkRotorTop.block_chain`)."""
    graph = problem.graph
    L = len(problem.blocks)
    loss = graph.loss
    pos: dict[int, int] = {loss: L}
    for i, blk in enumerate(problem.blocks):
        pos.update({n: i for n in blk.fwd})
        pos.update({n: i for n in blk.bwd})
    outputs = set(graph.outputs)
    fwd_held: dict[int, int] = {}
    bwd_held: dict[int, tuple[int, int, int]] = {}
    for d in graph.data:
        if not d.counted or d.producer is None:
            continue
        p = pos.get(d.producer)
        if p is None:
            continue
        readers = {pos.get(u) for u in graph.users(d.id)}
        if graph.nodes[d.producer].is_fwd:
            if (d.id in outputs and p != L - 1) or not readers <= {p, p + 1}:
                fwd_held[d.id] = d.size
        elif not readers <= ({L - 1} if p == L else {p, p - 1}):
            last = -1 if None in readers else min(readers)  # None: a tail node, at the end
            bwd_held[d.id] = (d.size, min(last + 1, p), p)
    return fwd_held, bwd_held


def flatten(problem: TopProblem, pieces: Sequence[Sequence[int]]) -> Schedule:
    """Join compute-id pieces, run each tail node as soon as its inputs exist (after the loss),
    and derive the frees."""
    from hiremate.solvers.remat_sequence import sequence_to_schedule

    graph = problem.graph
    produced = [d.producer is None for d in graph.data]
    pending = list(problem.tail)
    seq: list[int] = []
    loss_done = False

    def emit(nid: int) -> None:
        seq.append(nid)
        for d in graph.nodes[nid].outputs:
            produced[d] = True

    def drain() -> None:
        changed = True
        while changed and pending:
            changed = False
            for t in list(pending):
                if all(produced[d] for d in graph.nodes[t].inputs):
                    pending.remove(t)
                    emit(t)
                    changed = True

    for piece in pieces:
        for nid in piece:
            emit(nid)
            if nid == graph.loss:
                loss_done = True
            if loss_done and pending:
                drain()
    for t in pending:
        emit(t)
    return sequence_to_schedule(graph, seq)


@dataclass
class Candidate:
    schedule: Schedule
    sim: SimulationResult
    source: str
    detail: dict = field(default_factory=dict)


class RkRotorTop:
    """rk-Rotor (Rockmate, appendix C) at the top level: the blocks in order form a chain, each
    with its option menu; the DP's block operations are translated to full-graph steps."""

    name = "rk-rotor"
    composer = True
    #: memory slots per block at least (see :meth:`slots_for`)
    SLOTS_PER_BLOCK = 5

    def __init__(self, slots: int = 300, retries: int = 12):
        self.slots = slots
        self.retries = retries

    def slots_for(self, n_blocks: int) -> int:
        """Slots of the DP's memory grid for a chain of ``n_blocks``: ``slots``, raised to
        ``SLOTS_PER_BLOCK`` per block. The DP rounds each stored size up to a slot, and a
        persistent sequence may store a boundary of every block at once, so a grid fixed for
        a few blocks wastes a growing share of the budget on a long chain (GPT-2 with 96
        layers, 197 blocks of half a layer, measured costs, 50%: 1.68x the autodiff time with
        300 slots, 1.38x with 1,000 and the same with 2,000)."""
        return max(int(self.slots), self.SLOTS_PER_BLOCK * n_blocks)

    def applicable(self, graph: Graph) -> bool:
        return True

    def block_chain(self, problem: TopProblem):
        from dataclasses import replace

        from hiremate.solvers.rk_rotor import Block as RBlock, BlockChain

        graph = problem.graph
        # values living past their place in the chain: counted once, as held throughout
        fwd_held, bwd_held = long_lived(problem)
        held = fwd_held.keys() | bwd_held.keys()
        self.held = sum(fwd_held.values())
        counted = lambda ids: sum(graph.data[d].size for d in ids  # noqa: E731
                                  if graph.data[d].counted and d not in held)
        # a held model output is never freed: recomputing its block's forward holds it twice
        # while the producing step runs (the simulator's rule), so that block's steps add it
        outputs = set(graph.outputs)
        twice = [sum(fwd_held[d] for d in blk.data_map if d in fwd_held and d in outputs
                     and graph.data[d].producer in blk.fwd) for blk in problem.blocks]
        rblocks, x, g_in, g_out = [], [], [], []
        self._fe: list[list[int]] = []
        for blk, extra in zip(problem.blocks, twice):
            sub = blk.graph
            fe = min(blk.options, key=lambda o: (o.fwd_peak, o.fwd_time))
            self._fe.append(blk.sequence(fe.fwd))
            opts = tuple(blk.options) if not extra else tuple(
                replace(o, fwd_peak=o.fwd_peak + extra, bwd_peak=o.bwd_peak + extra)
                for o in blk.options)
            rblocks.append(RBlock(opts, fe_time=fe.fwd_time, fe_overhead=fe.fwd_peak + extra))
            x.append(counted(blk.data_map[d] for d in sub.outputs))
            g_in.append(counted(blk.data_map[d] for d in sub.nodes[sub.loss].outputs))
            g_out.append(counted(blk.data_map[d.id] for d in sub.data
                                 if d.kind is DataKind.INPUT_GRAD))
        first = problem.blocks[0]
        x0 = counted(d for d in first.data_map
                     if graph.data[d].producer is not None and graph.data[d].producer < graph.loss
                     and graph.data[d].kind in COUNTED_KINDS and d not in
                     {first.data_map[o] for o in first.graph.outputs}
                     and graph.data[d].producer not in first.fwd) + self.held
        L = len(rblocks)
        xs = [x0] + x
        gs = [g_out[0]] + [max(g_in[i], g_out[i + 1] if i + 1 < L else 0) for i in range(L)]
        last_out = problem.blocks[-1]
        kept = counted(last_out.data_map[d] for d in last_out.graph.outputs
                       if last_out.data_map[d] in set(graph.outputs))
        # a backward-phase value alive while the DP holds δ^lo .. δ^hi joins them (counted
        # twice while the backward parts in between run); alive from the loss (or from the last
        # block's backward, which follows it) to the end, it is kept from the loss on
        for size, lo, hi in bwd_held.values():
            if lo == 0 and hi >= L - 1:
                kept += size
            else:
                for k in range(lo, hi + 1):
                    gs[k] += size
        return BlockChain(tuple(rblocks), tuple(float(v) for v in xs),
                          tuple(float(v) for v in gs), graph.nodes[graph.loss].time, float(kept))

    def translate(self, problem: TopProblem, ops) -> Schedule:
        pieces: list[list[int]] = []
        for op in ops:
            if op.kind == "Loss":
                pieces.append([problem.graph.loss])
                continue
            blk = problem.blocks[op.block - 1]
            if op.kind in ("Fe", "Fc"):
                pieces.append(self._fe[op.block - 1])
            elif op.kind == "Fn":
                pieces.append(blk.sequence(blk.options[op.option].fwd))
            else:
                pieces.append(blk.sequence(blk.options[op.option].bwd))
        return flatten(problem, pieces)

    def compose(self, problem: TopProblem, budget: int) -> tuple[list[Candidate], int | None]:
        """Candidates within ``budget`` (simulated), and the smallest peak a candidate reached
        (the min-memory sequence's), which a later call at that budget meets again.

        The DP's memory model bounds the full graph's memory from above (:func:`long_lived`)
        but is not tight (the translation frees each value at its last read), so the abstract
        budget handed to the DP is searched: the highest one whose translated schedule fits
        ``budget`` is wanted (bisection between the DP's minimum and the store-everything
        sequence's abstract peak, ``retries`` steps). The simulated peak is a step function of
        the abstract budget, and each step costs one DP and one simulation: GPT-2 with 96
        layers at 50% stopped at 0.42 of the autodiff peak (1.21x its time) after 6 steps and
        reached 0.46 (1.20x) after 12."""
        from hiremate.solvers.rk_rotor import BlockOp, block_min_budget, simulate_blocks, solve_blocks

        bc = self.block_chain(problem)
        slots = self.slots_for(bc.L)
        graph = problem.graph
        found: list[Candidate] = []
        tried: list = []

        def evaluate(ops, abstract) -> SimulationResult:
            sched = self.translate(problem, ops)
            sim = simulate(graph, sched)
            tried.append((round(abstract), sim.peak if sim.valid else "invalid"))
            if not sim.valid:
                log.warning("rk-Rotor translation invalid (a bug): %s", sim.error)
            elif sim.peak <= budget:
                found.append(Candidate(sched, sim, self.name,
                                       {"abstract_budget": abstract, "ops": tuple(ops)}))
            return sim

        # store everything: each block's fastest option, no recomputation
        fastest = [min(range(len(b.options)), key=lambda k: b.options[k].time)
                   for b in problem.blocks]
        L = bc.L
        store = ([BlockOp("Fn", i, fastest[i - 1]) for i in range(1, L + 1)]
                 + [BlockOp("Loss", L + 1)]
                 + [BlockOp("B", i, fastest[i - 1]) for i in range(L, 0, -1)])
        hi = simulate_blocks(bc, store).peak
        sim_hi = evaluate(store, hi)
        low = block_min_budget(bc)
        lowest: int | None = None
        if sim_hi.valid and sim_hi.peak <= budget:
            lowest = sim_hi.peak
        else:
            lo_ok: float | None = None
            try:
                sol = solve_blocks(bc, low * (1 + 1e-9), slots)
                sim = evaluate(sol.ops, low)
                if sim.valid:
                    lowest = sim.peak
                    lo_ok = low if sim.peak <= budget else None
            except (ValueError, AssertionError) as exc:
                log.warning("rk-Rotor min-memory sequence failed: %s", exc)
            if lo_ok is not None:
                a, b = lo_ok, hi
                guess = min(max(float(budget), a), b)
                for _ in range(self.retries):
                    if b - a <= 1e-3 * max(b, 1.0):
                        break
                    mid = guess if guess is not None else (a + b) / 2
                    guess = None
                    try:
                        sol = solve_blocks(bc, mid, slots)
                    except (ValueError, AssertionError) as exc:
                        log.debug("rk-Rotor at %s: %s", mid, exc)
                        a = mid
                        continue
                    sim = evaluate(sol.ops, mid)
                    if sim.valid and sim.peak <= budget:
                        a = mid
                    else:
                        b = mid
        log.info("rk-Rotor: %d blocks, abstract min %s, store-all %s, tries %s", L,
                 fmt_bytes(low), fmt_bytes(hi), tried)
        return found, lowest


# -- flat path ------------------------------------------------------------------------------------
def guaranteed_min(solver: Any, graph: Graph) -> int | None:
    """A budget ``solver`` is known to meet on ``graph`` (None when unknown)."""
    from hiremate.solvers.hilp import HilpSolver, phases_to_schedule, recompute_phases

    try:
        if isinstance(solver, HilpSolver):
            return simulate(graph, phases_to_schedule(graph, recompute_phases(graph))).peak
        if hasattr(solver, "candidates"):  # TW-Remat: its family's lowest peak
            return min(c.peak for c in solver.candidates(graph))
        if hasattr(solver, "min_budget") and getattr(solver, "name", "") != "fastsa":
            return int(solver.min_budget(graph))
    except Exception as exc:
        log.debug("min budget of %s: %s", getattr(solver, "name", solver), exc)
    return None


def flat_candidate(name: str, params: dict, graph: Graph, budget: int
                   ) -> tuple[Candidate | None, int | None, str]:
    """Run one flat solver: a candidate (or None), a budget it is known to meet, an error."""
    from hiremate.registry import make_solver

    solver = make_solver(name, params)
    start = time.perf_counter()
    if not solver.applicable(graph):
        return None, None, "not applicable"
    low = guaranteed_min(solver, graph)
    try:
        sched = tuple(solver.schedule(graph, budget))
    except InfeasibleBudgetError as exc:
        found = exc.min_budget if low is None else low
        return None, found, str(exc)
    except (SolverError, ValueError, RuntimeError) as exc:
        log.warning("flat solver %s failed (%s: %s); the other configured solvers are used",
                    name, type(exc).__name__, exc)
        return None, low, f"{type(exc).__name__}: {exc}"
    sim = simulate(graph, sched)
    if not sim.valid or sim.peak > budget:
        return None, low, (f"schedule rejected by the simulator: "
                           f"{sim.error or fmt_bytes(sim.peak) + ' > budget'}")
    return Candidate(sched, sim, name, {"seconds": time.perf_counter() - start}), low, ""


# -- the whole solve ----------------------------------------------------------------------------------
@dataclass
class SolveResult:
    schedule: Schedule
    sim: SimulationResult
    report: dict[str, Any]


def _runtime_free(cfg: Any) -> dict:
    """The part of a configuration that decides the result (not how it is computed)."""
    d = cfg.to_dict()
    for k in ("name", "description", "n_jobs", "backend", "cache", "cache_dir", "progress",
              "calibrate", "on_new_inputs", "max_shapes"):
        d.pop(k, None)
    return d


def _progress(cfg: Any, iterable, desc: str, total: int | None = None):
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, disable=not cfg.progress, leave=False)


def solve_menus(blocks: list[Block], cfg: Any, cache: Any) -> dict[str, Any]:
    """Menus of the unique blocks with every applicable bottom solver (parallel, cached); fills
    ``block.options`` and returns per-class facts for the report."""
    from joblib import Parallel, delayed, parallel_config

    from hiremate.menu_cache import graph_key

    unique: dict[str, Block] = {}
    for b in blocks:
        unique.setdefault(b.key, b)
    tasks, results = [], {}
    for key, blk in unique.items():
        for name in cfg.bottom:
            ckey = {"kind": "menu", "graph": graph_key(blk.graph), **cfg.solver_key(name)}
            hit = cache.get(ckey)
            if hit is not None:
                results[(key, name)] = (hit[0], 0.0, hit[1], True)
            else:
                tasks.append((key, name, ckey))
    if tasks:
        from hiremate.registry import make_solver, solver_class

        for n in cfg.bottom:  # bad parameters fail here, once, with a ConfigError
            make_solver(n, cfg.solver_params.get(n, {}))
        calls = (delayed(solve_menu_task)(unique[k].graph, n, solver_class(n),
                                          cfg.solver_params.get(n, {}),
                                          cfg.menu_peaks, cfg.menu_saves) for k, n, _ in tasks)
        if cfg.n_jobs == 1 or len(tasks) == 1:
            outs = [solve_menu_task(unique[k].graph, n, solver_class(n),
                                    cfg.solver_params.get(n, {}), cfg.menu_peaks, cfg.menu_saves)
                    for k, n, _ in _progress(cfg, tasks, "bottom level: menus")]
        else:
            # parallel_config also knows the external backends (dask: a distributed Client)
            with parallel_config(backend=cfg.backend, n_jobs=cfg.n_jobs):
                par = Parallel(return_as="generator")
                outs = list(_progress(cfg, par(calls), "bottom level: menus", total=len(tasks)))
        for (key, name, ckey), (opts, secs, err) in zip(tasks, outs):
            results[(key, name)] = (opts, secs, err, False)
            if err in ("", "not applicable"):
                cache.put(ckey, (opts, err))
    facts: dict[str, Any] = {}
    for key, blk in unique.items():
        merged: list[Option] = [store_all_option(blk.graph)]
        per_solver = {}
        for name in cfg.bottom:
            opts, secs, err, hit = results[(key, name)]
            merged.extend(opts)
            per_solver[name] = {"options": len(opts), "seconds": round(secs, 3),
                                "cached": hit, **({"error": err} if err else {})}
            if err and err != "not applicable":
                log.warning("solver %s failed on a block of %d nodes: %s", name,
                            len(blk.graph.nodes), err)
        chosen = select_menu(merged, cfg.n_options)
        facts[key] = {"nodes": len(blk.graph.nodes), "solvers": per_solver,
                      "menu": len(chosen), "options": chosen}
    for b in blocks:
        b.options = facts[b.key]["options"]
    return facts


def solve(graph: Graph, budget: int, cfg: Any, cache: Any) -> SolveResult:
    """Schedule ``graph`` within ``budget`` bytes with configuration ``cfg`` (see module doc)."""
    from hiremate.budget import autodiff_peak
    from hiremate.registry import make_partitioner, make_solver
    from hiremate.menu_cache import graph_key
    from hiremate.schedule import schedule_from_list, schedule_to_list

    start = time.perf_counter()
    gkey = graph_key(graph)
    top_key = {"kind": "solve", "graph": gkey, "budget": int(budget), "config": _runtime_free(cfg)}
    pool = _schedule_pool(graph, gkey, cfg, cache)
    hit = cache.get(top_key)
    if hit is not None:
        sched = schedule_from_list(hit["schedule"])
        sim = simulate(graph, sched)
        if sim.valid and sim.peak <= budget:
            report = dict(hit["report"], solve_time=time.perf_counter() - start, cached=True)
            pooled = _pooled(pool, budget)
            if pooled and min(c.sim.time for c in pooled) < sim.time:
                best = min(pooled, key=lambda c: (c.sim.time, c.sim.peak))
                sched, sim = best.schedule, best.sim
                _describe_best(report, best, report.get("autodiff_peak"),
                               report.get("autodiff_time"))
            return SolveResult(sched, sim, report)
        log.warning("cached schedule no longer fits; solving again")
    ad = simulate(graph, autodiff_schedule(graph))
    report: dict[str, Any] = {
        "config": cfg.name, "budget": int(budget), "autodiff_peak": ad.peak,
        "autodiff_time": ad.time, "compute_nodes": len(graph.nodes),
        "data_nodes": len(graph.data), "forward_nodes": len(graph.fwd_nodes),
    }
    t0 = time.perf_counter()
    hierarchy = make_partitioner(cfg.partitioner, cfg.partitioner_params).partition(graph)
    report["partition_time"] = time.perf_counter() - t0
    report["hierarchy"] = hierarchy.summary()
    candidates: list[Candidate] = []
    mins: dict[str, int] = {}
    errors: dict[str, str] = {}
    flat_used = bool(cfg.flat) and len(graph.nodes) <= cfg.flat_max_nodes
    if flat_used:
        for name in _progress(cfg, cfg.flat, "flat level"):
            t0 = time.perf_counter()
            cand, low, err = flat_candidate(name, cfg.solver_params.get(name, {}), graph, budget)
            log.info("flat %s: %s in %.2fs", name, "ok" if cand else err, time.perf_counter() - t0)
            if cand is not None:
                candidates.append(cand)
            if low is not None:
                mins[f"flat:{name}"] = low
            if err:
                errors[f"flat:{name}"] = err
    slow_flat = bool(candidates) and ad.time > 0 and \
        min(c.sim.time for c in candidates) > cfg.hierarchical_above * ad.time
    hier_used = bool(cfg.bottom and cfg.top) and (not flat_used or not candidates or slow_flat)
    if hier_used:
        blocks, tail = make_blocks(graph, hierarchy)
        t0 = time.perf_counter()
        facts = solve_menus(blocks, cfg, cache)
        report["menu_time"] = time.perf_counter() - t0
        report["blocks"] = len(blocks)
        report["unique_blocks"] = len(facts)
        report["largest_block"] = max(len(b.graph.nodes) for b in blocks)
        report["tail_nodes"] = len(tail)
        report["block_menus"] = [
            {"nodes": f["nodes"], "menu": f["menu"], "solvers": f["solvers"],
             "members": sum(1 for b in blocks if b.key == k)} for k, f in facts.items()]
        problem = TopProblem(graph, blocks, tail)
        for name in _progress(cfg, cfg.top, "top level"):
            composer = make_solver(name, cfg.solver_params.get(name, {}))
            try:
                found, low = composer.compose(problem, budget)
            except Exception as exc:  # report, and let another path win
                errors[f"top:{name}"] = f"{type(exc).__name__}: {exc}"
                log.warning("top-level %s failed: %s", name, exc)
                continue
            if low is not None:
                mins[f"top:{name}"] = low
            for c in found:
                c.detail["blocks"] = _winners(problem, c)
                c.detail.pop("ops", None)
            candidates.extend(found)
            if not found:
                errors[f"top:{name}"] = "no sequence within the budget"
    report["flat_path"] = flat_used
    report["hierarchical_path"] = hier_used
    if pool is not None:
        pooled = _pooled(pool, budget)
        report["pool"] = {"recorded": pool.record((c.schedule, c.sim, c.source)
                                                  for c in candidates),
                          "fitting": len(pooled)}
        candidates.extend(pooled)
    if not candidates:
        report["errors"] = errors
        solvers = [f"flat: {', '.join(cfg.flat)}" if flat_used else "",
                   f"bottom: {', '.join(cfg.bottom)}, top: {', '.join(cfg.top)}" if hier_used else ""]
        names = "; ".join(s for s in solvers if s)
        if mins:
            low = min(mins.values())
            raise InfeasibleBudgetError(
                f"budget {fmt_bytes(budget)} is below the {fmt_bytes(low)} ({low} bytes) that "
                f"the configured solvers ({names}) need for this graph of {len(graph.nodes)} "
                f"compute nodes (autodiff peak {fmt_bytes(ad.peak)}); raise the budget to at "
                "least that, or configure a solver that recomputes more", min_budget=low)
        raise SolverError(f"no configured solver ({names}) produced a schedule: {errors}")
    best = min(candidates, key=lambda c: (c.sim.time, c.sim.peak))
    _describe_best(report, best, ad.peak, ad.time)
    fastest: dict[str, Candidate] = {}
    for c in sorted(candidates, key=lambda c: -c.sim.time):
        fastest[c.source] = c  # several pool entries may share a source: the fastest shown
    report.update({
        "candidates": {src: {"peak": c.sim.peak, "time": c.sim.time}
                       for src, c in fastest.items()},
        "min_budgets": mins, "errors": errors, "cached": False,
    })
    if "blocks" in best.detail:
        report["block_solvers"] = best.detail["blocks"]
    report["solve_time"] = time.perf_counter() - start
    cache.put(top_key, {"schedule": schedule_to_list(best.schedule), "report": report})
    return SolveResult(best.schedule, best.sim, report)


def _schedule_pool(graph: Graph, gkey: str, cfg: Any, cache: Any) -> Any:
    """The pool of schedules recorded for ``graph`` under ``cfg`` (None when not reused)."""
    from hiremate.schedule_pool import SchedulePool, pool_key

    if not getattr(cfg, "reuse_schedules", False) or not cache.enabled:
        return None
    config = _runtime_free(cfg)
    config.pop("reuse_schedules", None)
    return SchedulePool(graph, cache, pool_key(gkey, config))


def _pooled(pool: Any, budget: int) -> list[Candidate]:
    if pool is None:
        return []
    return [Candidate(s, sim, src if src.startswith("pool:") else f"pool:{src}")
            for s, sim, src in pool.fitting(budget)]


def _describe_best(report: dict, best: Candidate, ad_peak: int | None,
                   ad_time: float | None) -> None:
    report.update({
        "solver": best.source, "predicted_peak": best.sim.peak, "predicted_time": best.sim.time,
        "relative_peak": best.sim.peak / ad_peak if ad_peak else 1.0,
        "relative_time": best.sim.time / ad_time if ad_time else 1.0,
    })
    if best.source.startswith("pool:"):
        report.pop("block_solvers", None)


def _winners(problem: TopProblem, cand: Candidate) -> list[str]:
    """For each block, the solver(s) whose options the chosen block sequence runs."""
    if "block_solvers" in cand.detail:  # composers other than rk-Rotor say it themselves
        return list(cand.detail["block_solvers"])
    used: list[set[str]] = [set() for _ in problem.blocks]
    for op in cand.detail.get("ops", ()):
        if op.kind == "B":
            used[op.block - 1].add(problem.blocks[op.block - 1].options[op.option].solver)
    return ["+".join(sorted(u)) or "none" for u in used]


def _register_composers() -> None:
    """``hilp-top`` sits beside ``rk-rotor`` (registered by :mod:`hiremate.registry`, which
    imports this module to get the built-in composers)."""
    from hiremate.registry import _SOLVERS
    from hiremate.solvers.hilp_hier_solver import HilpTop

    _SOLVERS.setdefault("hilp-top", HilpTop)


_register_composers()
