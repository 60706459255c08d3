"""Hierarchical H-ILP against flat H-ILP on zoo models.

The comparison of Table 2 of "HiRemate: Hierarchical Approach for Efficient
Re-materialization of Large Neural Networks"; results in docs/benchmarks.md.

For each model and budget (a fraction of the autodiff peak): the flat H-ILP
(``CheckmateSolver`` on the whole graph), the hierarchical H-ILP (sequence partition, H-ILP
menus per unique block, ``HilpTop`` over the blocks), rk-Rotor over the same menus, and the LP
relaxation's lower bound. Overheads are simulated time / autodiff time - 1 of the final
full-graph schedules (``hiremate.simulate``); graphs use ``cost_model="flops"`` (deterministic).

    python bench/bench_hilp_hier.py --models transformer unet --budgets 0.6 0.7 0.8 \\
        --flat-time 120 > /tmp/hilp_hier.md
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time

from hiremate.solvers.hilp.flat import index_order


def build(name: str):
    import hiremate
    from hiremate import zoo

    model, sample = zoo.get(name)
    return hiremate.build_graph(model, sample, cost_model="flops")


def menus(graph, menu_time: float, cache_dir: str | None, grid: tuple[int, int, int] | None = None,
          peel_min: int = 0):
    """Blocks of the sequence partition with H-ILP menus (the ``hilp`` preset's bottom level;
    ``grid``: (menu_peaks, menu_saves, n_options) instead of the preset's; ``peel_min``: peel
    the sinks of blocks of at least that many forward nodes, :mod:`hiremate.partition.peel`)."""
    from hiremate.config import load_config
    from hiremate.ir.blocks import TopProblem, make_blocks
    from hiremate.composer.menus import solve_menus
    from hiremate.composer.menu_cache import MenuCache
    from hiremate.partition import PeelPartition, SequencePartition

    extra = {} if grid is None else dict(zip(("menu_peaks", "menu_saves", "n_options"), grid))
    cfg = load_config("hilp", n_jobs=1, cache=False, progress=False, **extra,
                      solver_params={"hilp": {"time_limit": menu_time, "max_nodes": 400}})
    part = PeelPartition("sequence", peel_min) if peel_min else SequencePartition()
    blocks, tail = make_blocks(graph, part.partition(graph))
    t0 = time.perf_counter()
    solve_menus(blocks, cfg, MenuCache(cache_dir, enabled=cache_dir is not None))
    return TopProblem(graph, blocks, tail), time.perf_counter() - t0



def best(cands):
    return min(cands, key=lambda c: c.sim.time) if cands else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["transformer", "unet"])
    ap.add_argument("--budgets", nargs="+", type=float, default=[0.6, 0.7, 0.8])
    ap.add_argument("--flat-time", type=float, default=120.0)
    ap.add_argument("--top-time", type=float, default=30.0)
    ap.add_argument("--menu-time", type=float, default=30.0,
                    help="H-ILP time limit per menu budget (the hilp preset's)")
    ap.add_argument("--cache-dir", default=None, help="menu cache (none: no cache)")
    ap.add_argument("--grid", nargs=3, type=int, default=None,
                    metavar=("PEAKS", "SAVES", "OPTIONS"),
                    help="menu budget grid and options kept per block (default: the hilp preset's)")
    ap.add_argument("--peel-min", type=int, default=0,
                    help="peel the sinks of the sequence partition's blocks of at least this "
                         "many forward nodes (partition 'peel'; 0: off)")
    ap.add_argument("--refine-rounds", type=int, default=1,
                    help="hilp-top's context-aware menu refinement rounds (0: off)")
    ap.add_argument("--no-flat", action="store_true")
    ap.add_argument("--no-lp", action="store_true")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.v else logging.WARNING, stream=sys.stderr)

    from hiremate.errors import HiremateError
    from hiremate.solvers.chain.rk_rotor_top import RkRotorTop
    from hiremate.ir.simulator import autodiff_schedule, simulate
    from hiremate.solvers.hilp.flat import CheckmateSolver, lower_bound
    from hiremate.solvers.hilp.top import HilpTop

    print("| model | nodes | blocks | budget | flat H-ILP | flat MILP bound | hier. H-ILP "
          "| rk-Rotor top | LP bound | flat s | menus s | hier. top s | LP s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        g = build(name)
        ad = simulate(g, autodiff_schedule(g))
        problem, menu_s = menus(g, args.menu_time, args.cache_dir, args.grid, args.peel_min)
        for frac in args.budgets:
            budget = int(frac * ad.peak)
            ovh = lambda t: f"{100 * (t / ad.time - 1):.2f}%"  # noqa: E731
            t0 = time.perf_counter()
            try:
                found, _ = HilpTop(time_limit=args.top_time,
                                   refine_rounds=args.refine_rounds).compose(problem, budget)
            except HiremateError as exc:
                found = []
                logging.warning("hilp-top: %s", exc)
            hier_s = time.perf_counter() - t0
            h = best(found)
            hier = ovh(h.sim.time) if h else "none"
            flat, flat_bound, flat_s = "-", "-", 0.0
            if not args.no_flat:
                # warm-started from the hierarchical schedule in index order (and TW-Remat's):
                # the flat result is never slower when that fits, and the MILP's dual bound
                # brackets the flat optimum
                t0 = time.perf_counter()
                try:
                    res = CheckmateSolver(time_limit=args.flat_time, max_nodes=1000).solve(
                        g, budget, hints=[index_order(g, h.schedule)] if h else [])
                    assert res.simulation.valid and res.simulation.peak <= budget
                    flat = f"{ovh(res.simulation.time)} ({res.status})"
                    flat_bound = ovh(res.bound) if math.isfinite(res.bound) else "-"
                except HiremateError as exc:
                    flat = f"none ({type(exc).__name__})"
                flat_s = time.perf_counter() - t0
            try:
                rk = best(RkRotorTop().compose(problem, budget)[0])
            except Exception as exc:  # noqa: BLE001 - the table says so
                logging.warning("rk-rotor: %s", exc)
                rk = None
            rks = ovh(rk.sim.time) if rk else "none"
            lp, lp_s = "-", 0.0
            if not args.no_lp:
                t0 = time.perf_counter()
                lb = lower_bound(g, budget)
                lp = ("unsolved" if lb is None
                      else ovh(lb) if math.isfinite(lb) else "infeasible")
                lp_s = time.perf_counter() - t0
            print(f"| {name} | {len(g.nodes)} | {len(problem.blocks)} | {frac:.2f} | {flat} | "
                  f"{flat_bound} | "
                  f"{hier} | {rks} | {lp} | {flat_s:.1f} | {menu_s:.1f} | {hier_s:.1f} | "
                  f"{lp_s:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
