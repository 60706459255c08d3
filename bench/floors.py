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

With ``--loss-captured``: for every model, the graph of the model and the sweep's loss
(``zoo.output_loss``) captured together, as a ``<preset>+loss`` cell captures it, its two
floors (no loss outside it), and the lowest measured peak of the sweep's ``+loss`` cells.

Run::

    python bench/floors.py configs/sweeps/decide.yaml sweep-results/decide
    python bench/floors.py configs/sweeps/decide-loss.yaml sweep-results/decide-loss --loss-captured
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

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
    parser.add_argument("--loss-captured", action="store_true",
                        help="floors of the graphs with the loss captured (+loss cells)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = load_spec(args.spec)
    cells = json.loads((args.out / "results.json").read_text())["cells"]
    if args.loss_captured:
        captured_floors(spec, cells)
        return
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



def captured_floors(spec: Any, cells: dict[str, dict[str, Any]]) -> None:
    """Per model: the lowest measured peak of its ``+loss`` cells and the two floors of the
    graph of the model and ``zoo.output_loss`` together, over the eager peak."""
    import hiremate
    from hiremate.runtime.loss_step import LossStep
    from hiremate.zoo import output_loss

    print("| model | lowest measured, +loss | once | bound | lowest / once |")
    print("|---|---|---|---|---|")
    for entry in spec.models:
        eager = cells.get(f"{entry.label}|-|eager", {}).get("measured_peak")
        met = [r["measured_peak"] for r in cells.values() if r["model"] == entry.label
               and r["method"].endswith("+loss") and r["status"] == "ok"]
        if not eager or not met:
            print(f"| {entry.label} | no measured +loss cell | | | |")
            continue
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model, sample = entry.build(spec.torch_dtype())
        step = LossStep(model, output_loss)
        graph = hiremate.build_graph(step, step.step_inputs(sample))
        once, bound = gradients_once_floor(graph, 0), step_memory_floor(graph, 0)
        print(f"| {entry.label} | {min(met) / eager:.3f} | {once / eager:.3f} | "
              f"{bound / eager:.3f} | {min(met) / once:.3f} |")


if __name__ == "__main__":
    main()
