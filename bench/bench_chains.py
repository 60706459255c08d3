"""Speed of the chain DPs (the cases of docs/benchmarks.md, "Chain dynamic programs").

- rk-Rotor: 200 blocks, 20 options each, 500 slots;
- Rotor's persistent DP: a 339-stage chain (the length of the ResNet-1001 of "Optimal
  checkpointing for heterogeneous chains: how to train deep neural networks with limited
  memory", section 5.5), 500 slots;
- for scale, the weakly persistent DP on a 20-stage chain.

The printed targets are the acceptance bounds the table in docs/benchmarks.md is read against.

Wall-clock and CPU (process) times are both printed: on a shared machine the wall time
includes waiting for a core. Usage::

    python bench/bench_chains.py [--repeats 2] [--fracs 0.2 0.5]
"""

from __future__ import annotations

import argparse
import random
import time

from hiremate.ir.option import Option
from hiremate.solvers.chain.model import Chain, simulate_chain, store_all_ops
from hiremate.solvers.chain.rk_rotor import Block, BlockChain, block_min_budget, solve_blocks
from hiremate.solvers.chain.rotor import persistent_min_budget, solve_persistent, solve_weak


def random_chain(seed: int, stages: int) -> Chain:
    rng = random.Random(seed)
    x = [rng.uniform(1, 10) for _ in range(stages + 1)] + [0.0]
    return Chain.from_paper(
        x, [v * rng.uniform(1, 2) for v in x[1:stages + 1]] + [0.0],
        [rng.uniform(1, 3) for _ in range(stages)] + [0.0],
        [rng.uniform(2, 6) for _ in range(stages)] + [0.0],
        ob=[rng.uniform(0, 10) for _ in range(stages)] + [0.0])


def random_blocks(seed: int, blocks: int, options: int) -> BlockChain:
    rng = random.Random(seed)
    out = []
    for _ in range(blocks):
        menu = []
        for _ in range(options):
            ph = rng.randint(0, 30)
            menu.append(Option((), (), rng.uniform(1, 5), rng.uniform(2, 8) + (30 - ph) * 0.1,
                               ph + rng.randint(0, 10), rng.randint(0, 15), ph))
        out.append(Block(tuple(menu)))
    return BlockChain(tuple(out), tuple(rng.randint(1, 20) for _ in range(blocks + 1)))


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--fracs", type=float, nargs="+", default=[0.2, 0.5],
                    help="budgets as a fraction between the minimum and the store-all peak")
    args = ap.parse_args()

    bc = random_blocks(1, 200, 20)
    lo = block_min_budget(bc)
    print("rk-Rotor, 200 blocks x 20 options, 500 slots (target <= 5 s)")
    for f in (1.5, 3.0):
        for r in range(args.repeats):
            sol, wall, cpu = timed(lambda: solve_blocks(bc, lo * f))
            print(f"  budget {f:.1f} x min  run {r}: wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
                  f"makespan {sol.makespan:.1f}")

    chain = random_chain(0, 338)  # 338 stages + the loss stage = 339
    lo = persistent_min_budget(chain)
    top = simulate_chain(chain, store_all_ops(chain)).peak
    print(f"Rotor persistent DP, {chain.n} stages, 500 slots (target <= 20 s)")
    for f in args.fracs:
        budget = lo + f * (top - lo)
        for r in range(args.repeats):
            sol, wall, cpu = timed(lambda: solve_persistent(chain, budget))
            print(f"  budget {f:.2f}  run {r}: wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
                  f"overhead {sol.makespan / chain.store_all_time() - 1:.3f}")

    small = random_chain(3, 19)
    lo = persistent_min_budget(small)
    top = simulate_chain(small, store_all_ops(small)).peak
    sol, wall, cpu = timed(lambda: solve_weak(small, lo + 0.3 * (top - lo)))
    print(f"Rotor weakly persistent DP, {small.n} stages, 500 slots: wall {wall:.2f} s "
          f"cpu {cpu:.2f} s")


if __name__ == "__main__":
    main()
