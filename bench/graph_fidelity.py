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
    parser.add_argument("--markdown", action="store_true", help="print a markdown table at the end")
    args = parser.parse_args()
    rows = []
    for name in args.names:
        r = row(name)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if args.markdown:
        print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    head = ("| model | joint ops | fwd ops | fwd nodes | compute nodes | data nodes | build s "
            "| simulated peak | measured peak | ratio | sum of node times ms | measured ms | ratio |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['joint_ops']} | {r['fwd_ops']} | {r['fwd_nodes']} | "
            f"{r['compute_nodes']} | {r['data_nodes']} | {r['build_s']} | {r['sim_peak']:,} | "
            f"{r['measured_peak']:,} | {r['peak_ratio']} | {r['sum_node_time'] * 1e3:.2f} | "
            f"{r['measured_time'] * 1e3:.2f} | {r['time_ratio']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
