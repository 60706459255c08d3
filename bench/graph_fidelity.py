"""Graph sizes and cost-model fidelity for every zoo model (docs/graphs.md).

For each model at its default size: build the graph, compare the simulated peak of the
autodiff schedule with ``hiremate.measure``'s peak, and the sum of node times with the measured
iteration time. Run: ``python bench/graph_fidelity.py [names...] [--out docs/graphs_table.md]``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import hiremate
from hiremate import zoo


def row(name: str, repeats: int = 5) -> dict:
    model, sample = zoo.get(name)
    start = time.perf_counter()
    graph = hiremate.build_graph(model, sample)
    build_s = time.perf_counter() - start
    sim = hiremate.simulate(graph, hiremate.autodiff_schedule(graph))
    args, kwargs = (((), sample) if isinstance(sample, dict)
                    else ((sample if isinstance(sample, tuple) else (sample,)), {}))
    measured = hiremate.measure(model, *args, repeats=repeats, warmup=2, **kwargs)
    n_fwd = len(graph.fwd_nodes)
    return {
        "model": name,
        "joint_ops": graph.meta["joint_ops"],
        "fwd_ops": graph.meta["fwd_ops_before"],
        "fwd_nodes": n_fwd,
        "compute_nodes": len(graph.nodes),
        "data_nodes": len(graph.data),
        "build_s": round(build_s, 2),
        "sim_peak": sim.peak,
        "measured_peak": measured.peak,
        "peak_ratio": round(sim.peak / measured.peak, 3) if measured.peak else None,
        "sum_node_time": sim.time,
        "measured_time": measured.time,
        "time_ratio": round(sim.time / measured.time, 3) if measured.time else None,
        "capture_path": graph.meta["capture_path"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=zoo.names())
    parser.add_argument("--json", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    for name in args.names:
        r = row(name)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
