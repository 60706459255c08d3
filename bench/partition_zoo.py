"""H-Partition on zoo graphs: the columns of Table 3(b), and unique subgraphs vs depth.

Table 3(b) of "HiRemate: Hierarchical Approach for Efficient Re-materialization of Large
Neural Networks"; results in docs/graphs.md, "Hierarchy".

Run: ``python bench/partition_zoo.py table`` (every zoo model at its default size) and
``python bench/partition_zoo.py depth --layers 12 24 48`` (gpt2 at several depths).
Graphs use the analytic cost model (deterministic, and identical layers get identical costs).
Building a graph dominates the run time (docs/graphs.md gives a figure for a deep gpt2);
``--cache DIR`` saves each built graph there and reuses it on the next run.
Prints a Markdown table (``--json``: one JSON object per line instead).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import hiremate
from hiremate import zoo
from hiremate.ir.graph import Graph
from hiremate.partition import HPartition

COLUMNS = ("model", "layers", "fwd_ops", "fwd_nodes", "depth", "subgraphs", "unique", "largest",
           "top", "per_level", "build_s", "partition_s")


def build(name: str, layers: int | None, width: int | None, cache: Path | None) -> tuple[Graph, float]:
    """The zoo model's graph (flops cost model) and the seconds it took (0 when cached)."""
    path = cache / f"{name}-{layers}-{width}.graph" if cache is not None else None
    if path is not None and path.exists():
        return Graph.load(path), 0.0
    model, sample = zoo.get(name, layers=layers, width=width)
    start = time.perf_counter()
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    took = time.perf_counter() - start
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        graph.save(path)
    return graph, took


def figures(name: str, layers: int | None = None, width: int | None = None,
            cache: Path | None = None, max_top: int = 30, max_sub: int = 15,
            prologue: bool = False) -> dict:
    graph, build_s = build(name, layers, width, cache)
    start = time.perf_counter()
    hierarchy = HPartition(max_top=max_top, max_sub=max_sub, prologue=prologue).partition(graph)
    part_s = time.perf_counter() - start
    s = hierarchy.summary()
    return {
        "model": name, "layers": layers, "fwd_ops": graph.meta.get("fwd_ops_before"),
        "fwd_nodes": len(graph.fwd_nodes), "compute_nodes": len(graph.nodes),
        "data_nodes": len(graph.data), "depth": s["levels"], "subgraphs": s["subgraphs"],
        "unique": s["unique_subgraphs"], "largest": s["largest_subgraph"],
        "top": s["top_size"], "per_level": "/".join(map(str, s["subgraphs_per_level"])),
        "build_s": round(build_s, 2), "partition_s": round(part_s, 3),
    }


def _emit(row: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
    else:
        print("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("table", "depth"))
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--layers", type=int, nargs="*", default=[12, 24, 48])
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--cache", type=Path, default=None, help="folder of built graphs")
    parser.add_argument("--max-top", type=int, default=30)
    parser.add_argument("--max-sub", type=int, default=15)
    parser.add_argument("--prologue", action="store_true",
                        help="hoist constant nodes into a first top-level part")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.json:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
    runs = ([(name, None, None) for name in zoo.names()] if args.what == "table"
            else [(args.model, layers, args.width) for layers in args.layers])
    for name, layers, width in runs:
        _emit(figures(name, layers, width, args.cache, args.max_top, args.max_sub,
                      args.prologue), args.json)


if __name__ == "__main__":
    main()
