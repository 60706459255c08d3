"""H-Partition on zoo graphs: HiRemate Table 3(b) columns, and unique subgraphs vs depth.

Run: ``python bench/partition_zoo.py table`` (every zoo model at its default size) and
``python bench/partition_zoo.py depth --layers 12 24 48`` (gpt2 at several depths).
Graphs use the analytic cost model (deterministic, and identical layers get identical costs).
"""

from __future__ import annotations

import argparse
import json
import time

import hiremate
from hiremate import zoo
from hiremate.partition import HPartition


def figures(name: str, layers: int | None = None, width: int | None = None) -> dict:
    model, sample = zoo.get(name, layers=layers, width=width)
    start = time.perf_counter()
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    hierarchy = HPartition().partition(graph)
    part_s = time.perf_counter() - start
    s = hierarchy.summary()
    return {
        "model": name, "layers": layers, "fwd_ops": graph.meta["fwd_ops_before"],
        "fwd_nodes": len(graph.fwd_nodes), "compute_nodes": len(graph.nodes),
        "data_nodes": len(graph.data), "depth": s["levels"], "subgraphs": s["subgraphs"],
        "unique": s["unique_subgraphs"], "largest": s["largest_subgraph"],
        "top": s["top_size"], "build_s": round(build_s, 2), "partition_s": round(part_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("table", "depth"))
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--layers", type=int, nargs="*", default=[12, 24, 48])
    parser.add_argument("--width", type=int, default=None)
    args = parser.parse_args()
    if args.what == "table":
        for name in zoo.names():
            print(json.dumps(figures(name)), flush=True)
    else:
        for layers in args.layers:
            print(json.dumps(figures(args.model, layers, args.width)), flush=True)


if __name__ == "__main__":
    main()
