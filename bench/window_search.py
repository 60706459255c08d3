"""The default preset with and without its window search (``refine: [hilp-window]``), and with
the whole-graph H-ILP forced past its gate, on chains of Linear layers: what the windows win
over the hierarchy and the polish, and what they cost in solve time.

    python bench/window_search.py --layers 16 20 22 --budgets 0.3 0.35 0.4 0.7
    python bench/window_search.py --layers 16 --budgets 0.4 --ungated

Graphs as in ``tests/test_presets_compare.py`` (width 32, batch 16, FLOP costs: every predicted
time is deterministic). Each row: predicted time relative to autodiff and solve seconds of the
default without the windows (``refine=[]``), of the default, and with ``--ungated`` of the
default without the windows and with ``flat_gap=0`` (the flat H-ILP run whatever the gap to
the moment bound); the windows' own seconds; ``-`` where a budget is infeasible.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[16])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.4])
    parser.add_argument("--ungated", action="store_true",
                        help="also solve with flat_gap=0 and no windows")
    args = parser.parse_args(argv)
    import torch

    import test_presets_compare as cases
    from hiremate.api import solve_graph
    from hiremate.errors import InfeasibleBudgetError
    from hiremate.ir.simulator import autodiff_schedule, simulate

    runs = [("no windows", {"refine": []}), ("default", {})]
    if args.ungated:
        runs.append(("flat_gap 0, no windows", {"refine": [], "flat_gap": 0.0}))
    print("| layers | nodes | budget | " + " | ".join(f"{n} (s)" for n, _ in runs)
          + " | windows (s) |")
    print("|" + "---|" * (len(runs) + 4))
    for layers in args.layers:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            graph = cases._graph(cases._chain(layers))
        base = simulate(graph, autodiff_schedule(graph)).time
        for fraction in args.budgets:
            cells, windows = [], "-"
            for name, overrides in runs:
                start = time.perf_counter()
                try:
                    res = solve_graph(graph, fraction, "hiremate", **{**cases.FAST, **overrides})
                except InfeasibleBudgetError:
                    cells.append("-")
                    continue
                took = time.perf_counter() - start
                cells.append(f"{res.sim.time / base:.4f} ({took:.1f})")
                facts = res.report.get("refine") or []
                if name == "default" and facts:
                    windows = (f"{facts[0]['seconds']:.1f}" if "seconds" in facts[0]
                               else facts[0].get("skipped", "-"))
            print(f"| {layers} | {len(graph.nodes)} | {fraction} | " + " | ".join(cells)
                  + f" | {windows} |", flush=True)


if __name__ == "__main__":
    logging.disable(logging.WARNING)
    main()
