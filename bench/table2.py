"""The HiRemate paper's Table 2: the hierarchy against the flat H-ILP (rk-Checkmate) on a whole
graph, on the 2+2 encoder-decoder Transformer and the UNet.

For each case and each budget (``--budgets``, fractions of the autodiff peak; default 0.6 0.7
0.8), with graphs built with ``--cost`` (default ``flops``):

- **hierarchical**: the default preset (menu cache off, no calibration) with ``flat_max_nodes
  = 0``, so the hierarchy decides even on graphs that the preset would solve whole
  (``--keep-flat``: the preset as it is); its overhead (relative time - 1), solve time, winner.
  Both sides solve the graph's own problem, the paper's: its nodes' peak within the budget, with
  none of what ``solve_graph`` reserves for the whole step (the loss, the output gradients and
  the generator states of rerun random ops);
- **flat**: the ``hilp`` solver on the whole graph with ``--flat-time`` seconds (default 600,
  the paper's setting), warm-started: its LP rounding and TW-Remat's schedules, which this
  script puts in index order first (``hiremate.solvers.hilp.flat.index_order``: the flat model first
  computes nodes in index order, and TW-Remat's schedules on these graphs do not, so the solver
  alone drops them and starts from full recomputation; ``--raw-hints``: leave them to the
  solver as they are). ``--hint-hier`` also offers it the hierarchical schedule. Its overhead,
  the MILP's status (``hint``: the warm start was kept), its own dual bound (as an overhead)
  and its wall time;
- **lower bound**, as an overhead: no schedule that first runs the nodes in the graph's order
  (the flat H-ILP's class) within the budget is faster; the larger of the moment bound
  (``moment``, :mod:`hiremate.solvers.hilp.moment_bound`, seconds at any size) and the LP
  relaxation of the flat H-ILP (``LP``, ``--lp-time`` s; skipped above ``--lp-max-nodes``
  compute nodes); the bound column says which.

Cases: ``transformer-2-2`` (zoo transformer, 2 encoder and 2 decoder layers, the width and batch
of the paper-size settings) and ``unet`` (the paper-size setting, ``zoo.get_paper("unet")``).

The paper's Table 2 (budgets in GB on its GPU, overheads over autodiff, H-ILP / RK-Checkmate):
Transformer 0.8 GB 4.714% / 4.706%, 0.9 GB 3.597% / 3.531%, 1.0 GB 2.480% / 2.430%, 1.1 GB
1.369% / 1.369%; UNet 6.1 GB 8.586% / 8.010%.

Run::

    python bench/table2.py                                   # both cases, 600 s flat solves
    python bench/table2.py unet --flat-time 30 --n-jobs 1    # a quick trial

``--config`` and ``--set key=value`` change the hierarchical side (see bench/paper_table.py).
``bench/bench_hilp_hier.py`` is the earlier form of this comparison (the ``hilp`` preset's
menus on the sequence partition, the zoo's default sizes); this one runs the default preset
(H-Partition, every level solved) as a user gets it.
Prints a Markdown table (``--json``: one JSON object per line). Results: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch

import hiremate
from hiremate import zoo
from hiremate.errors import HiremateError
from hiremate.solvers.hilp.flat import HilpSolver

from paper_common import (add_common_arguments, fmt, graph_of, lower_bound, make_config,
                          solve_own_problem)

CASES: dict[str, Callable[[], tuple[torch.nn.Module, Any]]] = {
    "transformer-2-2": lambda: zoo.get("transformer", layers=2,
                                       width=zoo.paper_model("transformer-6-6").width,
                                       batch=zoo.paper_model("transformer-6-6").batch),
    "unet": lambda: zoo.get_paper("unet"),
}

HEADER = ("case", "compute nodes", "budget", "hierarchical", "solver", "solve s", "flat H-ILP",
          "status", "MILP bound", "solve s", "lower bound", "bound", "bound s")


def pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.3f}%"


def hierarchical(graph, budget: int, args: argparse.Namespace) -> dict[str, Any]:
    extra = {} if args.keep_flat else {"flat_max_nodes": 0}
    cfg = make_config(args.config, args.set, cache=False, calibrate=0, n_jobs=args.n_jobs,
                      progress=False, **extra)
    try:  # the graph's own problem, as the flat side solves it (no whole-step reserve)
        res = solve_own_problem(graph, budget, cfg)
    except HiremateError as exc:
        return {"hier_error": f"{type(exc).__name__}: {exc}"}
    r = res.report
    h = r.get("hierarchy", {})
    return {"hier_overhead": r["relative_time"] - 1, "hier_solver": r["solver"],
            "hier_solve_s": round(r["solve_time"], 1), "hier_schedule": res.schedule,
            "hierarchy": [h.get("levels"), h.get("subgraphs"), h.get("unique_subgraphs"),
                          h.get("largest_subgraph")]}


def ordered_hints(graph, hier: tuple = ()) -> list:
    """TW-Remat's schedules (and ``hier``) in index order, so that the flat H-ILP can start
    from them (see the module docstring)."""
    from hiremate.solvers.twremat import TWRemat

    from hiremate.solvers.hilp.flat import index_order

    twremat = TWRemat()
    found = [c.schedule for c in twremat.candidates(graph)] if twremat.applicable(graph) else []
    return [index_order(graph, s) for s in (*hier, *found)]


def flat(graph, budget: int, ad_time: float, args: argparse.Namespace,
         hier: tuple = ()) -> dict[str, Any]:
    solver = HilpSolver(time_limit=args.flat_time, max_nodes=10 ** 9, warm_start=True)
    start = time.perf_counter()
    hints = list(hier) if args.raw_hints else ordered_hints(graph, hier)
    try:
        res = solver.solve(graph, budget, hints=hints)
    except HiremateError as exc:
        return {"flat_error": f"{type(exc).__name__}: {exc}"}
    bound = res.bound if res.bound is not None and math.isfinite(res.bound) else None
    return {"flat_overhead": res.simulation.time / ad_time - 1, "flat_status": res.status,
            "flat_milp_bound": max(bound, ad_time) / ad_time - 1 if bound else None,
            "flat_solve_s": round(time.perf_counter() - start, 1)}


def rows(case: str, args: argparse.Namespace):
    graph, _ = graph_of(f"table2-{case}", CASES[case], args.cost, args.cache)
    ad = hiremate.simulate(graph, hiremate.autodiff_schedule(graph))
    for frac in args.budgets:
        budget = int(frac * ad.peak)
        out: dict[str, Any] = {"case": case, "cost": args.cost, "compute_nodes": len(graph.nodes),
                               "budget_fraction": frac, "budget": budget}
        out.update(hierarchical(graph, budget, args))
        hints = (out.pop("hier_schedule"),) if args.hint_hier and "hier_schedule" in out else ()
        out.pop("hier_schedule", None)
        out.update(flat(graph, budget, ad.time, args, hints))
        bound, kind, lp_s = lower_bound(graph, budget, args.lp_max_nodes, args.lp_time)
        out.update({"lower_bound": bound / ad.time - 1, "bound": kind,
                    "bound_s": round(lp_s, 1)})
        yield out


def emit(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(r, default=str), flush=True)
        return
    cells = (r["case"], r["compute_nodes"], f"{r['budget_fraction']:g}",
             pct(r.get("hier_overhead")) if "hier_error" not in r else r["hier_error"],
             fmt(r.get("hier_solver")), fmt(r.get("hier_solve_s"), 1),
             pct(r.get("flat_overhead")) if "flat_error" not in r else r["flat_error"],
             fmt(r.get("flat_status")), pct(r.get("flat_milp_bound")),
             fmt(r.get("flat_solve_s"), 1),
             pct(r["lower_bound"]), r["bound"], fmt(r["bound_s"], 1))
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help=f"cases (default: all): {', '.join(CASES)}")
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.6, 0.7, 0.8],
                        help="fractions of the autodiff peak")
    parser.add_argument("--flat-time", type=float, default=600.0,
                        help="time limit of the flat H-ILP (s; default 600)")
    parser.add_argument("--hint-hier", action="store_true",
                        help="warm-start the flat H-ILP with the hierarchical schedule too")
    parser.add_argument("--raw-hints", action="store_true",
                        help="flat H-ILP: TW-Remat's schedules as the solver takes them")
    parser.add_argument("--keep-flat", action="store_true",
                        help="hierarchical side: keep the preset's flat path")
    add_common_arguments(parser, "configuration override of the hierarchical side (repeatable)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    make_config(args.config, args.set)  # a bad override fails before any build
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}")
    if not args.json:
        print(f"cost {args.cost}, flat H-ILP {args.flat_time:g}s"
              + (" (hints as given)" if args.raw_hints else " (hints in index order)")
              + f", config {args.config}"
              + ("" if args.keep_flat else ", flat_max_nodes=0")
              + "".join(f", {s}" for s in args.set) + "; overheads over autodiff")
        print()
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
    for case in args.cases or list(CASES):
        for r in rows(case, args):
            emit(r, args.json)


if __name__ == "__main__":
    main()
