"""How far is each sweep model's lowest peak from what any schedule could reach?

For every model with a ``floor`` cell in a finished sweep, the hiremate floor cell's measured
and predicted whole-step peaks beside the two lower bounds of the simulator, all as fractions
of the eager peak:

- ``bound``: :func:`hiremate.ir.simulator.step_memory_floor`, for every schedule that runs the
  nodes first in the graph's order;
- ``once``: :func:`hiremate.ir.simulator.gradients_once_floor`, for those that also make each
  gradient once (every solver but H-ILP keeps to them).

The graphs are read from the sweep's folder and the loss's memory is measured as the sweep
measured it, so the figures are those of the cells' whole step.

Run::

    python bench/floors.py configs/sweeps/decide.yaml sweep-results/decide
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hiremate.ir.graph import Graph
from hiremate.ir.simulator import gradients_once_floor, step_memory_floor
from hiremate.sweep.presolve import graph_path, loss_bytes_of
from hiremate.sweep.runner import grid
from hiremate.sweep.spec import load_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("spec", help="the sweep's YAML file")
    parser.add_argument("out", type=Path, help="the sweep's output folder")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = load_spec(args.spec)
    cells = json.loads((args.out / "results.json").read_text())["cells"]
    print("| model | measured | predicted | once | bound | measured / once |")
    print("|---|---|---|---|---|---|")
    seen: set[str] = set()
    for cell in grid(spec)[1]:
        label = cell.model.label
        if cell.budget is None or not cell.budget.floor or label in seen:
            continue
        seen.add(label)
        record = cells.get(f"{label}|floor|hiremate")
        path = graph_path(args.out, label)
        if record is None or record.get("measured_peak") is None or not path.exists():
            print(f"| {label} | no finished floor cell | | | | |")
            continue
        graph = Graph.load(path)
        loss_bytes = loss_bytes_of(cell, spec, graph)
        eager = record["eager_peak"]
        once = gradients_once_floor(graph, loss_bytes)
        figures = [record["measured_peak"], record["predicted_peak"], once,
                   step_memory_floor(graph, loss_bytes)]
        print(f"| {label} | " + " | ".join(f"{f / eager:.3f}" for f in figures)
              + f" | {record['measured_peak'] / once:.3f} |")


if __name__ == "__main__":
    main()
