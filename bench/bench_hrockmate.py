"""HRockmate end to end on the zoo: the columns of Table 3, plus gradients and memory.

Table 3 of "HiRemate: Hierarchical Approach for Efficient Re-materialization of Large Neural
Networks"; results in docs/results.md.

For each model (float64, CPU): capture, solve at a fraction of the autodiff peak with a preset,
run one forward+backward with the executor and with eager PyTorch, compare every gradient, and
measure both with ``hiremate.measure`` (profiler peak of activation bytes, median time).

    python bench/bench_hrockmate.py --budget 0.5 --config hiremate > docs/results_table.md

Columns: graph (forward / compute nodes), depth, subgraphs, unique subgraphs, largest subgraph
(children) of the configured partitioner's hierarchy; the path and solver that won; solving
time; relative peak (measured, hiremate / eager) and predicted peak / budget; predicted and
measured relative time; the largest gradient difference; ``calib``: how many times the
calibration step solved again because the executor measured more than 2% above the budget, and
``first_meas``: the first schedule's measured peak over the budget.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch


def grads_of(fn, args, kwargs, params):
    from hiremate import zoo

    for p in params:
        p.grad = None
    zoo.output_loss(fn(*args, **kwargs)).backward()
    return [p.grad.detach().clone() if p.grad is not None else None for p in params]


def run(name: str, budget: float, config: str, overrides: dict) -> dict:
    import hiremate
    from hiremate import zoo
    from hiremate.api import HRockmate

    model, sample = zoo.get(name, dtype=torch.float64)
    args, kwargs = zoo.split_sample(sample)
    t0 = time.perf_counter()
    remat = HRockmate(model, sample, budget, config=config, **overrides)
    total = time.perf_counter() - t0
    rep = remat.report()
    params = [p for p in model.parameters() if p.requires_grad]
    eager = grads_of(model, args, kwargs, params)
    mine = grads_of(remat, args, kwargs, params)
    err = 0.0
    for a, b in zip(eager, mine):
        if (a is None) != (b is None):
            err = float("inf")
        elif a is not None:
            err = max(err, (a - b).abs().max().item())
    # memory with the default loss (sum of the outputs): output_loss's weight tensors would add
    # the loss's own memory, which is not the model's
    m_eager = hiremate.measure(model, *args, **kwargs)
    m_remat = hiremate.measure(remat, *args, **kwargs)
    for p in params:
        p.grad = None
    h = rep.get("hierarchy", {})
    return {
        "model": name, "fwd": rep["forward_nodes"], "nodes": rep["compute_nodes"],
        "depth": h.get("levels"), "subgraphs": h.get("subgraphs"),
        "unique": h.get("unique_subgraphs"), "largest": h.get("largest_subgraph"),
        "path": "flat" if not rep.get("block_solvers") else f"blocks({rep.get('blocks')})",
        "solver": rep["solver"], "solve_s": rep["solve_time"], "total_s": total,
        "budget": rep["budget"], "pred_peak": rep["predicted_peak"],
        "rel_peak": m_remat.peak / m_eager.peak if m_eager.peak else float("nan"),
        "meas_over_budget": m_remat.peak / rep["budget"],
        "pred_rel_time": rep["relative_time"],
        "meas_rel_time": m_remat.time / m_eager.time if m_eager.time else float("nan"),
        "grad_err": err,
        # calibration: re-solves after the executor measured above the budget, and the first
        # schedule's measured peak over the budget (above 1.02 triggers a re-solve)
        "calib": len(rep.get("calibration") or [()]) - 1,
        "first_meas": (rep["calibration"][0][2] / rep["budget"]) if rep.get("calibration")
        else float("nan"),
    }


def scale(spec: str, config: str, budget: float) -> None:
    """``MODEL:LAYERS[:WIDTH]``: build (float32), solve without cache or calibration, print."""
    import hiremate
    from hiremate import zoo
    from hiremate.api import HRockmate

    name, layers, *width = spec.split(":")
    model, sample = zoo.get(name, layers=int(layers), width=int(width[0]) if width else None)
    t0 = time.perf_counter()
    graph = hiremate.build_graph(model, sample)
    build = time.perf_counter() - t0
    remat = HRockmate.from_graph(model, graph, budget, config, sample=sample, cache=False,
                                 progress=False, calibrate=0)
    rep = remat.report()
    keys = ("compute_nodes", "blocks", "unique_blocks", "largest_block", "solve_time",
            "menu_time", "relative_peak", "relative_time", "solver")
    print(spec, {k: rep.get(k) for k in keys}, f"build {build:.1f} s",
          f"total {time.perf_counter() - t0:.1f} s")


def main(argv=None) -> int:
    from hiremate import zoo

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=zoo.names())
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--config", default="hiremate")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--n-jobs", type=int, default=None)
    ap.add_argument("--scale", metavar="MODEL:LAYERS[:WIDTH]",
                    help="time one large model instead (e.g. gpt2:96:64, transformer:36)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.scale:
        scale(args.scale, args.config, args.budget)
        return 0
    overrides = {"progress": False}
    if args.no_cache:
        overrides["cache"] = False
    if args.n_jobs is not None:
        overrides["n_jobs"] = args.n_jobs
    cols = ["model", "fwd", "nodes", "depth", "subgraphs", "unique", "largest", "path", "solver",
            "solve_s", "rel_peak", "meas_over_budget", "calib", "first_meas", "pred_rel_time",
            "meas_rel_time", "grad_err"]
    print(f"<!-- python bench/bench_hrockmate.py --budget {args.budget} --config {args.config}"
          f"{' --no-cache' if args.no_cache else ''} -->")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for name in args.models:
        try:
            row = run(name, args.budget, args.config, overrides)
        except Exception as exc:  # report and go on
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:150]} |")
            sys.stdout.flush()
            continue
        cells = []
        for c in cols:
            v = row[c]
            cells.append(f"{v:.3g}" if isinstance(v, float) and c != "grad_err"
                         else (f"{v:.1e}" if c == "grad_err" else str(v)))
        print("| " + " | ".join(cells) + " |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
