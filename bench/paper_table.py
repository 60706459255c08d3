"""The HiRemate paper's Table 3 on the zoo at the paper's sizes: partition, solve, bound, run.

For every model of ``hiremate.zoo.paper_models()`` (or those named), at a budget of ``--budget``
times the autodiff peak (default 0.5): the graph is built with ``--cost`` (``flops``: analytic,
deterministic; ``measure``: timed on this machine) and solved once with the default preset
(``configs/hiremate.yaml``; menu cache off, no calibration, ``--n-jobs`` workers). One row:

- compute nodes; H-Partition's depth / subgraphs / unique subgraphs / largest subgraph (the
  report's ``hierarchy``) beside the paper's Table 3(b); ``path``: whether the flat path (the
  whole graph by H-ILP and TW-Remat, graphs of at most ``flat_max_nodes`` compute nodes), the
  hierarchical one or both ran;
- the winning solver, the solve time (s) and the predicted relative time (the simulator's time
  over autodiff's) beside the paper's Table 3(c) predicted relative average time;
- a lower bound on the relative time of the schedules that first run the nodes in the graph's
  order (H-ILP's) and our gap to it: the larger of the moment bound
  (:mod:`hiremate.solvers.hilp.moment_bound`, seconds at any size) and the LP relaxation of the flat
  H-ILP when the graph has at most ``--lp-max-nodes`` compute nodes (within ``--lp-time`` s);
  the bound column says which;
- with ``--execute``: the model is built in float64 (graph, solve and run all in float64; an
  ``--cache``d graph is per dtype) and wrapped (``HRockmate.from_graph``, the same single
  solve, for the whole step); the measured peak over the budget, the measured peak over eager
  PyTorch's (beside the paper's observed relative peak) and the largest gradient difference
  from eager.

Run::

    python bench/paper_table.py fno1d unet --cost flops --n-jobs 1 --cache /tmp/paper-graphs
    python bench/paper_table.py --execute --json            # every model, one JSON per line
    python bench/paper_table.py gpt-24 --set flat_max_nodes=0 --set total_options=60
    python bench/paper_table.py --graphs /tmp/pg --lp-max-nodes 0 --json   # a GPU's graphs
    python bench/paper_table.py fno3d --cost measured --save-graphs /tmp/pm   # keep this build
    python bench/paper_table.py fno3d --graphs /tmp/pm --set menu_saves=4     # ... solve it again

``--config`` takes a preset name or a YAML file; ``--set key=value`` (repeatable, dotted keys
into mappings: ``solver_params.hilp-top.time_limit=60``) overrides it. Prints a Markdown table
(``--json``: one JSON object per line instead, each with the ``versions`` of the packages that
decide a result, :data:`paper_common.RESULT_PACKAGES`). Results with their commands:
docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

import hiremate
from hiremate import zoo
from hiremate.errors import HiremateError
from hiremate.ir.graph import Graph
from hiremate.zoo.paper import PaperModel

from paper_common import (
    PAPER_TABLE3C, log, add_common_arguments, execute, fmt, gap, graph_of, installed_versions,
    lower_bound, make_config, solve_own_problem,
)

HEADER = ("model", "compute nodes", "H-Partition d/s/u/l", "paper 3(b)", "path", "solver",
          "solve s", "pred. rel. time", "paper 3(c)", "lower bound", "bound", "gap",
          "pred. rel. peak", "measured peak / budget", "measured rel. peak", "paper 3(c)",
          "max grad diff")


def _path(report: dict[str, Any]) -> str:
    flat, hier = report.get("flat_path"), report.get("hierarchical_path")
    return "flat+hier" if flat and hier else "flat" if flat else "hier" if hier else "-"


def row(m: PaperModel, args: argparse.Namespace) -> dict[str, Any]:
    """Build, solve (and with ``--execute`` run) one model: its row as a dict."""
    dtype = torch.float64 if args.execute else None
    key = f"paper-{m.paper_name}" + ("-f64" if args.execute else "")
    log.info("%s: building the graph (%s costs)", m.paper_name, args.cost)
    if args.graphs is not None:  # captured elsewhere (bench/paper_gpu.py capture: a GPU's)
        graph, build_s = Graph.load(args.graphs / f"{m.paper_name}.graph"), 0.0
    else:
        graph, build_s = graph_of(key, lambda: zoo.get_paper(m.paper_name, dtype=dtype),
                                  args.cost, args.cache)
        if args.save_graphs is not None:  # this build, for --graphs to solve again
            args.save_graphs.mkdir(parents=True, exist_ok=True)
            graph.save(args.save_graphs / f"{m.paper_name}.graph")
    ad = hiremate.simulate(graph, hiremate.autodiff_schedule(graph))
    budget = int(args.budget * ad.peak)
    cfg = make_config(args.config, args.set, cache=False, calibrate=0, n_jobs=args.n_jobs,
                      progress=False)
    paper = PAPER_TABLE3C[m.paper_name]
    out: dict[str, Any] = {
        "model": m.paper_name, "cost": graph.meta.get("cost_model", args.cost),
        "dtype": "float64" if args.execute else "float32", "budget_fraction": args.budget,
        "budget": budget,
        "compute_nodes": len(graph.nodes), "fwd_nodes": len(graph.fwd_nodes),
        "build_s": round(build_s, 1), "paper_partition": list(m.paper_partition),
        "paper_relative_time": paper[3], "paper_observed_relative_peak": paper[2],
        "paper_solve_min": paper[0], "problem": "whole step" if args.execute or
        args.whole_step else "graph",
    }
    start = time.perf_counter()
    try:
        if args.execute:
            model, sample = zoo.get_paper(m.paper_name, dtype=dtype)
            report, facts = execute(model, sample, graph, budget, cfg)
            out.update(facts)
        elif args.whole_step:
            report = hiremate.solve_graph(graph, budget, cfg).report
        else:  # the graph's own problem, the paper's (no whole-step reserve)
            report = solve_own_problem(graph, budget, cfg).report
    except HiremateError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    h = report.get("hierarchy", {})
    out.update({
        "partition": [h.get("levels"), h.get("subgraphs"), h.get("unique_subgraphs"),
                      h.get("largest_subgraph")],
        "path": _path(report), "solver": report.get("solver"),
        "solve_s": round(report.get("solve_time", time.perf_counter() - start), 2),
        "relative_time": report["relative_time"], "relative_peak": report["relative_peak"],
        "whole_step_solves": report.get("whole_step_solves"),
        "levels": report.get("levels"),
    })
    bound, kind, lp_s = lower_bound(graph, budget, args.lp_max_nodes, args.lp_time)
    out.update({"lower_bound": bound / ad.time, "bound": kind, "bound_s": round(lp_s, 1),
                "gap": gap(report["predicted_time"], bound)})
    return out


def emit(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(r, default=str), flush=True)
        return
    if "error" in r:
        print(f"| {r['model']} | {r['compute_nodes']} | {r['error']} |", flush=True)
        return
    cells = (r["model"], r["compute_nodes"], fmt(r["partition"]), fmt(r["paper_partition"]),
             r["path"], r["solver"], fmt(r["solve_s"], 1), fmt(r["relative_time"]),
             fmt(r["paper_relative_time"]), fmt(r["lower_bound"]), r["bound"],
             f"{100 * r['gap']:.1f}%" if r["gap"] == r["gap"] else "-",
             fmt(r["relative_peak"]), fmt(r.get("measured_peak_over_budget")),
             fmt(r.get("measured_relative_peak")), fmt(r["paper_observed_relative_peak"]),
             fmt(r.get("max_grad_diff"), 2))
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="paper model names (default: all)")
    parser.add_argument("--budget", type=float, default=0.5,
                        help="budget as a fraction of the autodiff peak (default 0.5)")
    parser.add_argument("--execute", action="store_true",
                        help="float64 model, run through the wrapper: peak and gradients")
    parser.add_argument("--whole-step", action="store_true",
                        help="solve for the whole step, as solve_graph does (default: the "
                             "graph's own problem, the paper's)")
    parser.add_argument("--graphs", type=Path, default=None,
                        help="folder of graphs NAME.graph captured elsewhere (bench/paper_gpu.py "
                             "capture, on a GPU): solved as they are, no build")
    parser.add_argument("--save-graphs", type=Path, default=None,
                        help="folder to write each built graph to as NAME.graph, so that "
                             "--graphs solves the same build again (measured costs move from "
                             "build to build; --cache keeps flops graphs only)")
    parser.add_argument("--verbose", action="store_true",
                        help="log each phase with its time (build, solve, runs) to stderr")
    add_common_arguments(parser, "configuration override (repeatable; dotted keys into mappings)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if args.verbose:
        for name in ("bench.paper", "hiremate"):
            logging.getLogger(name).setLevel(logging.INFO)
    torch.set_num_threads(1)
    make_config(args.config, args.set)  # a bad override fails before any build
    chosen = [zoo.paper_model(n) for n in args.models] or list(zoo.paper_models().values())
    versions = installed_versions()
    if not args.json:
        problem = "whole step" if args.execute or args.whole_step else "graph's own problem"
        print(f"budget {args.budget:g} x autodiff peak ({problem}), cost {args.cost}, "
              f"config {args.config}"
              + "".join(f", {s}" for s in args.set))
        print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        print()
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
    for m in chosen:
        out = row(m, args)
        emit({**out, "versions": versions} if args.json else out, args.json)


if __name__ == "__main__":
    main()
