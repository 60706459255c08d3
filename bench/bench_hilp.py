"""H-ILP benchmark: model build time and solve time/quality on synthetic CD-graphs.

    python bench/bench_hilp.py --fwd 50 --fracs 1.0 0.8 0.6 --time-limit 30 --backend highs

For each budget (a fraction of the way from the memory floor to the store-all peak) it reports
the model size, build time, solver status, objective, LP-bound-based gap and the simulated
overhead over the store-all time. Numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import logging
import time

from hiremate.errors import HiremateError
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.ir.tracker import memory_floor
from hiremate.solvers.hilp.flat import HilpSolver
from hiremate.solvers.hilp.model import build_model
from hiremate.testing.synthetic import random_graph


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fwd", type=int, default=50, help="forward ops of the random graph")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--fracs", type=float, nargs="+", default=[1.0, 0.8, 0.6])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--backend", default="highs", choices=["highs", "cpsat", "pulp"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    g = random_graph(args.seed, args.fwd)
    ad = simulate(g, autodiff_schedule(g))
    lo = memory_floor(g)
    print(f"graph: {g!r}; store-all peak {ad.peak} B, time {ad.time:.3f}; floor {lo} B")
    build_model(g, ad.peak)  # warm up imports
    t0 = time.perf_counter()
    m = build_model(g, ad.peak)
    print(f"build: {time.perf_counter() - t0:.3f}s  {m.stats}")
    if args.build_only:
        return
    solver = HilpSolver(backend=args.backend, time_limit=args.time_limit, threads=args.threads)
    for frac in args.fracs:
        b = int(lo + frac * (ad.peak - lo))
        t0 = time.perf_counter()
        try:
            r = solver.solve(g, b)
        except HiremateError as exc:
            print(f"frac {frac:.2f} budget {b}: {type(exc).__name__}: {exc}")
            continue
        wall = time.perf_counter() - t0
        gap = (r.objective - r.bound) / r.objective if r.objective and r.bound > 0 else float("nan")
        print(f"frac {frac:.2f} budget {b}: {r.status:8s} time {r.simulation.time:.3f} "
              f"(+{100 * (r.simulation.time / ad.time - 1):.2f}%), peak {r.simulation.peak}, "
              f"gap {gap:.3%}, solve {r.solve_time:.1f}s, total {wall:.1f}s")


if __name__ == "__main__":
    main()
