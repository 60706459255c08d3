"""Every preset on the same graph: the issue's check that the default is never worse than
another preset, on the case it names (a chain of Linear layers with ReLU and GELU between
them, at 0.5 of its autodiff peak) and on the residual blocks of the preset test.

    python bench/presets_compare.py                        # chain of 40 layers at 0.5
    python bench/presets_compare.py --layers 10 --budgets 0.5 0.7
    python bench/presets_compare.py --model residual --layers 6

Graphs are built with FLOP costs (every predicted time is deterministic), the models as in
``tests/test_presets_compare.py`` (width 32, batch 16). Each row: the preset, its predicted
time relative to autodiff (simulated; ``-`` when it meets nothing), its winner, its solve
seconds, and its time against the default's. The ``hilp`` and ``checkmate`` presets' flat
MILPs stop at 2,000 branch-and-bound nodes (600 s of wall clock as a safety cap): on a graph of
a hundred nodes and more, and at tight budgets, they take minutes.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

PRESETS = ["hiremate", "rockmate", "rotor", "twremat", "fastsa", "hilp", "checkmate"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("chain", "residual"), default="chain")
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5])
    parser.add_argument("--presets", nargs="+", default=PRESETS)
    args = parser.parse_args(argv)
    import torch

    import test_presets_compare as cases
    from hiremate.api import solve_graph
    from hiremate.errors import HiremateError
    from hiremate.ir.simulator import autodiff_schedule, simulate

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = cases._chain(args.layers) if args.model == "chain" \
            else cases._Residual(args.layers)
    graph = cases._graph(model)
    base = simulate(graph, autodiff_schedule(graph)).time
    print(f"{args.model} of {args.layers}: {len(graph.nodes)} compute nodes\n")
    print("| budget | preset | predicted rel. time | winner | solve (s) | / default |")
    print("|---|---|---|---|---|---|")
    for fraction in args.budgets:
        default = None
        for preset in args.presets:
            start = time.perf_counter()
            try:
                res = solve_graph(graph, fraction, preset, **cases.FAST)
            except HiremateError as exc:
                print(f"| {fraction} | {preset} | - | {type(exc).__name__} | "
                      f"{time.perf_counter() - start:.1f} | |", flush=True)
                continue
            took = time.perf_counter() - start
            sim = simulate(graph, res.schedule)
            assert sim.valid and sim.peak <= res.report["budget"], preset
            rel = sim.time / base
            if preset == "hiremate":
                default = rel
            versus = f"{rel / default:.4f}" if default else ""
            print(f"| {fraction} | {preset} | {rel:.4f} | {res.report['solver']} | {took:.1f} | "
                  f"{versus} |", flush=True)


if __name__ == "__main__":
    # the solvers' warnings (a preset that fits nothing) would interleave with the table; only
    # here, so that main() called in a test process leaves that process's logging alone
    logging.disable(logging.WARNING)
    main()
