"""rk-Rotor as a top-level composer: the blocks, in order, form a chain whose stages have option
menus (Rockmate, appendix C); the DP's block operations become full-graph steps.

A chain model assumes each block's values are read by its neighbours only. Values read further
(:func:`hiremate.ir.blocks.long_lived`) are counted as held over their span, so the abstract peak
bounds the simulated one; every candidate is still simulated on the full graph and kept only
within the budget, and the DP is re-run at a lower abstract budget when the simulated peak
overshoots.
"""

from __future__ import annotations

import logging

from hiremate.errors import SolverError
from hiremate.ir.blocks import Candidate, TopProblem, against_the_chain, flatten, long_lived
from hiremate.ir.graph import COUNTED_KINDS, DataKind, Graph
from hiremate.ir.schedule import Schedule
from hiremate.ir.simulator import SimulationResult, simulate
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)


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
        a few blocks wastes a growing share of the budget on a long chain (docs/benchmarks.md,
        "Figures that used to live in docstrings")."""
        return max(int(self.slots), self.SLOTS_PER_BLOCK * n_blocks)

    def applicable(self, graph: Graph) -> bool:
        return True

    def block_chain(self, problem: TopProblem):
        from dataclasses import replace

        from hiremate.solvers.chain.rk_rotor import Block as RBlock, BlockChain

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

        The DP's memory model bounds the full graph's memory from above (:func:`hiremate.ir.blocks.long_lived`)
        but is not tight (the translation frees each value at its last read), so the abstract
        budget handed to the DP is searched: the highest one whose translated schedule fits
        ``budget`` is wanted (bisection between the DP's minimum and the store-everything
        sequence's abstract peak, ``retries`` steps). The simulated peak is a step function of
        the abstract budget, and each step costs one DP and one simulation, so ``retries``
        trades solve time for a schedule closer to the budget."""
        from hiremate.solvers.chain.rk_rotor import BlockOp, block_min_budget, simulate_blocks, solve_blocks

        against = against_the_chain(problem)
        if against:
            p, n = against[0]
            raise SolverError(
                f"rk-Rotor: the backward parts of these {len(problem.blocks)} blocks cannot run "
                f"as a chain: backward node {problem.graph.nodes[n].name!r} reads what "
                f"{problem.graph.nodes[p].name!r} of an earlier block's backward makes "
                f"({len(against)} such reads); a chain composer needs each block's backward to "
                "read the later blocks' only")
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
            except (ValueError, AssertionError, SolverError) as exc:
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
                    except (ValueError, AssertionError, SolverError) as exc:
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
