"""rk-Rotor: block chains with option menus, against an exhaustive search and Rotor."""

from __future__ import annotations

import heapq
import itertools
import math
import random

import pytest

from hiremate.ir.option import Option
from hiremate.ir.schedule import Compute
from hiremate.ir.simulator import simulate
from hiremate.testing.synthetic import chain_graph
from hiremate.solvers.chain.model import Chain
from hiremate.solvers.chain.rk_rotor import (
    Block, BlockChain, BlockOp, block_min_budget, block_step, chain_menu, initial_block_state,
    simulate_blocks, solve_blocks,
)
from hiremate.solvers.chain.rotor import solve_persistent


def opt(ft, bt, fpk, bpk, ph):
    return Option((), (), ft, bt, fpk, bpk, ph)


def exhaustive_blocks(bc: BlockChain, budget: float) -> float:
    """Dijkstra over :func:`block_step` states restricted to persistent sequences (once
    ``Fc(i)``/``Fn(i)`` ran, nothing on a block ``< i`` and no ``Fe(i)`` before ``B(i)``)."""
    L = bc.L
    start = initial_block_state(bc)
    tie = itertools.count()
    best = {(start.key(), frozenset()): 0.0}
    heap = [(0.0, next(tie), start, frozenset())]
    while heap:
        cost, _, st, held = heapq.heappop(heap)
        if cost > best[(st.key(), held)]:
            continue
        if st.grad == 0:
            return cost
        cands = [BlockOp("Loss", L + 1)]
        for i in range(1, L + 1):
            cands += [BlockOp("Fe", i), BlockOp("Fc", i)]
            for o in range(len(bc.blocks[i - 1].options)):
                cands += [BlockOp("Fn", i, o), BlockOp("B", i, o)]
        low = max(held, default=0)
        for op in cands:
            if op.block < low or (op.kind == "Fe" and op.block in held):
                continue
            try:
                new, during, t = block_step(bc, st, op)
            except ValueError:
                continue
            if max(during, new.mem) > budget + 1e-9:
                continue
            nheld = held | {op.block} if op.kind in ("Fc", "Fn") else (
                held - {op.block} if op.kind in ("B", "Loss") else held)
            key = (new.key(), nheld)
            if cost + t < best.get(key, math.inf) - 1e-12:
                best[key] = cost + t
                heapq.heappush(heap, (cost + t, next(tie), new, nheld))
    return math.inf


def random_blocks(rng: random.Random, L: int, nopt: int) -> BlockChain:
    blocks = []
    for _ in range(L):
        options = []
        for _ in range(rng.randint(1, nopt)):
            ph = rng.randint(0, 6)
            options.append(opt(rng.randint(1, 4), rng.randint(1, 6) + (6 - ph) // 2,
                               ph + rng.randint(0, 3), rng.randint(0, 4), ph))
        blocks.append(Block(tuple(options), fe_time=rng.choice([None, rng.randint(1, 3)]),
                            fe_overhead=rng.choice([None, rng.randint(0, 2)])))
    return BlockChain(tuple(blocks), tuple(rng.randint(1, 5) for _ in range(L + 1)),
                      loss_time=rng.choice([0, 1]), kept_after_loss=rng.choice([0, 0, 2]))


@pytest.mark.parametrize("seed", range(15))
def test_rk_rotor_matches_exhaustive(seed):
    rng = random.Random(seed)
    bc = random_blocks(rng, rng.randint(1, 3), 3)
    lo = math.ceil(block_min_budget(bc))
    assert math.isinf(exhaustive_blocks(bc, lo - 0.5))
    for budget in sorted({lo, lo + rng.randint(0, 10), lo + 25}):
        want = exhaustive_blocks(bc, budget)
        sol = solve_blocks(bc, budget, slots=int(budget - bc.x[0]))
        assert sol.makespan == pytest.approx(want), (seed, budget, str(sol))
        res = simulate_blocks(bc, sol.ops)
        assert res.valid and res.peak <= budget and res.makespan == pytest.approx(want)


def test_one_option_blocks_reduce_to_rotor():
    rng = random.Random(7)
    L = 6
    x = [rng.randint(1, 9) for _ in range(L + 1)]
    extra = [rng.randint(0, 4) for _ in range(L)]
    uf = [rng.randint(1, 5) for _ in range(L)]
    ub = [rng.randint(1, 5) for _ in range(L)]
    ob = [rng.randint(0, 5) for _ in range(L)]
    # Rotor: a^k kept with extra_k internal values; rk: phantom = extra_k
    chain = Chain.from_paper(x + [0], [x[k + 1] + extra[k] for k in range(L)] + [0],
                             uf + [0], ub + [0], ob=ob + [0])
    blocks = tuple(Block((opt(uf[k], ub[k], extra[k], ob[k], extra[k]),), fe_time=uf[k],
                         fe_overhead=0) for k in range(L))
    bc = BlockChain(blocks, tuple(x))
    for budget in range(int(block_min_budget(bc)), 120, 7):
        a = solve_blocks(bc, budget, slots=budget - x[0])
        b = solve_persistent(chain, budget, slots=budget - x[0])
        assert a.makespan == pytest.approx(b.makespan) and a.peak == pytest.approx(b.peak)


def test_block_simulator_rejects_invalid():
    bc = random_blocks(random.Random(1), 2, 2)
    assert not simulate_blocks(bc, [BlockOp("B", 2, 0)]).valid
    assert not simulate_blocks(bc, [BlockOp("Fe", 1), BlockOp("Loss", 3)]).valid


def test_chain_menu_options():
    g = chain_graph([300, 500, 200, 400, 100, 250], [1, 2, 1, 3, 1, 2])
    menu = chain_menu(g, n_budgets=6)
    assert len(menu) >= 2
    loss_time = g.nodes[g.loss].time
    fastest = min(menu, key=lambda o: o.time)
    assert fastest.time + loss_time == pytest.approx(g.total_time())  # nothing recomputed
    for o in menu:
        assert o.time + loss_time >= g.total_time() - 1e-9
        # the two parts replay as a whole schedule of the subgraph
        res = simulate(g, o.fwd + (Compute(g.loss),) + o.bwd)
        assert res.valid, res.error
    phantoms = sorted(o.phantom for o in menu)
    assert phantoms[0] < phantoms[-1]


@pytest.mark.slow
def test_rk_rotor_speed_200_blocks_20_options():
    import time
    rng = random.Random(1)
    blocks = []
    for _ in range(200):
        options = []
        for _ in range(20):
            ph = rng.randint(0, 30)
            options.append(opt(rng.uniform(1, 5), rng.uniform(2, 8) + (30 - ph) * 0.1,
                               ph + rng.randint(0, 10), rng.randint(0, 15), ph))
        blocks.append(Block(tuple(options)))
    bc = BlockChain(tuple(blocks), tuple(rng.randint(1, 20) for _ in range(201)))
    start = time.process_time()
    solve_blocks(bc, 2 * block_min_budget(bc))
    assert time.process_time() - start < 5.0
