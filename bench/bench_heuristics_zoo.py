"""TW-Remat, FastSA, flat H-ILP and hierarchical H-ILP on the zoo graphs.

For each zoo model (``cost_model="flops"``, so the graphs and hence the table are deterministic)
and each budget (a fraction of the autodiff peak) it runs the four solvers and prints one markdown
row: the predicted overhead (simulated time / autodiff time - 1) and the solve time of each.
Every schedule a solver returns is replayed by ``hiremate.simulate`` here, and the bench stops
with an AssertionError if one is invalid or peaks above its budget.

Cell states: ``P% (T s)`` a schedule within the budget; ``P%, time limit (T s)`` flat
H-ILP returned a MILP solution without proving it optimal, ``, hint`` only its warm start;
``infeasible (T s)`` the solver raised InfeasibleBudgetError (a proof only for TW-Remat's
family and the flat H-ILP's memory floor, not for FastSA or a time-limited MILP);
``no schedule`` a time limit ran out with nothing to return; ``-`` the graph is beyond the flat
H-ILP's size limit (``--flat-max-nodes``). Solve times exclude the graph capture; the
hierarchical column adds the menu time once per model (``+ menus``, 0 on a cache hit).

    python bench/bench_heuristics_zoo.py --cache-dir /tmp/hm_menus > /tmp/zoo_table.md

Why this bench exists: the H-ILPs need time limits and menus, TW-Remat and FastSA do not, and the
question the table answers is how much predicted overhead the cheap heuristics give up.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Callable

FRACTIONS = (0.3, 0.5, 0.7)
COLUMNS = ("twremat", "fastsa", "flat", "hier")


def build(name: str):
    """The zoo model ``name`` at its default size, as a CD-graph with the FLOP cost model."""
    import hiremate
    from hiremate import zoo

    model, sample = zoo.get(name)
    return hiremate.build_graph(model, sample, cost_model="flops")


def checked(graph, schedule, budget: int):
    """Replay ``schedule``; the bench refuses invalid or over-budget schedules."""
    from hiremate.ir.simulator import simulate

    sim = simulate(graph, schedule)
    assert sim.valid, f"invalid schedule: {sim.error}"
    assert sim.peak <= budget, f"peak {sim.peak} > budget {budget}"
    return sim


def timed(fn: Callable[[], tuple[str, object]]) -> str:
    """Run ``fn`` (returns a cell text), append its wall time."""
    from hiremate.errors import InfeasibleBudgetError, SolverError

    t0 = time.perf_counter()
    try:
        text = fn()
    except InfeasibleBudgetError:
        text = "infeasible"
    except SolverError as exc:  # e.g. an H-ILP time limit without any schedule
        logging.warning("%s", exc)
        text = "no schedule"
    return f"{text} ({time.perf_counter() - t0:.1f} s)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=None, help="zoo names (default: all)")
    ap.add_argument("--budgets", nargs="+", type=float, default=list(FRACTIONS))
    ap.add_argument("--flat-time", type=float, default=30.0, help="flat H-ILP time limit")
    ap.add_argument("--flat-max-nodes", type=int, default=250)
    ap.add_argument("--menu-time", type=float, default=10.0,
                    help="H-ILP time limit per menu budget of the hierarchical H-ILP")
    ap.add_argument("--top-time", type=float, default=30.0)
    ap.add_argument("--fastsa-time", type=float, default=20.0)
    ap.add_argument("--cache-dir", default=None, help="menu cache directory (e.g. under /tmp)")
    ap.add_argument("--solvers", nargs="+", default=list(COLUMNS), choices=list(COLUMNS),
                    help="columns to run (the others print as 'skipped')")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.v else logging.WARNING, stream=sys.stderr)

    from bench_hilp_hier import menus  # the hilp preset's blocks and menus, shared

    from hiremate import zoo
    from hiremate.errors import InfeasibleBudgetError
    from hiremate.ir.simulator import autodiff_schedule, simulate
    from hiremate.solvers.fastsa.solver import FastSA
    from hiremate.solvers.hilp.flat import HilpSolver
    from hiremate.solvers.hilp.top import HilpTop
    from hiremate.solvers.twremat import TWRemat

    names = args.models or zoo.names()
    print("| model | nodes | budget | TW-Remat | FastSA | flat H-ILP | hier. H-ILP |")
    print("|---|---|---|---|---|---|---|")
    t_all = time.perf_counter()
    for name in names:
        g = build(name)
        ad = simulate(g, autodiff_schedule(g))
        problem, menu_s = (menus(g, args.menu_time, args.cache_dir) if "hier" in args.solvers
                           else (None, 0.0))
        if problem is not None:
            logging.info("%s: %d nodes, %d blocks, menus in %.1f s", name, len(g.nodes),
                         len(problem.blocks), menu_s)

        def ovh(sim) -> str:
            return f"{100 * (sim.time / ad.time - 1):.1f}%"

        for frac in args.budgets:
            budget = int(frac * ad.peak)

            def run_tw() -> str:
                return ovh(checked(g, TWRemat().schedule(g, budget), budget))

            def run_sa() -> str:
                solver = FastSA(seed=0, time_limit=args.fastsa_time)
                return ovh(checked(g, solver.schedule(g, budget), budget))

            def run_flat() -> str:
                res = HilpSolver(time_limit=args.flat_time, max_nodes=args.flat_max_nodes
                                 ).solve(g, budget)
                sim = checked(g, res.schedule, budget)
                # "hint": the MILP found nothing better than its warm start within the limit
                note = {"optimal": "", "feasible": ", time limit"}.get(res.status,
                                                                       f", {res.status}")
                return ovh(sim) + note

            def run_hier() -> str:
                found, _ = HilpTop(time_limit=args.top_time).compose(problem, budget)
                if not found:
                    raise InfeasibleBudgetError("no candidate", min_budget=None)
                best = min(found, key=lambda c: c.sim.time)
                return ovh(checked(g, best.schedule, budget))

            cells = []
            for col, run in zip(COLUMNS, (run_tw, run_sa, run_flat, run_hier)):
                if col not in args.solvers:
                    cells.append("skipped")
                elif col == "flat" and len(g.nodes) > args.flat_max_nodes:
                    cells.append("-")
                else:
                    cells.append(timed(run) + (f" (+ menus {menu_s:.0f} s)" if col == "hier"
                                               else ""))
            print(f"| {name} | {len(g.nodes)} | {frac:.0%} | " + " | ".join(cells) + " |",
                  flush=True)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
