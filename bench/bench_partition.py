"""Benchmark H-Partition on synthetic GPT-like forward graphs of growing size.

Usage: python bench/bench_partition.py [--sizes 1000 10000 100000] [--graph-up-to 10000]

For each size: the time to partition the bare forward DAG (greedy levels), the time to assemble
the Hierarchy (interfaces, identical-subgraph classes), and, up to ``--graph-up-to`` nodes, the
time of the whole ``HPartition().partition(graph)`` on a full CD-graph built with
``graph_from_dag`` (graph construction itself not counted). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

from hiremate.partition import HPartition
from hiremate.testing.gptlike import gpt_like_dag, gpt_like_dag_ops, layers_for
from hiremate.partition.hierarchy import hierarchy_from_levels
from hiremate.partition.hpartition import hpartition_levels
from hiremate.testing.synthetic import graph_from_dag


def run(sizes: list[int], graph_up_to: int, max_top: int, max_sub: int) -> list[dict]:
    rows = []
    for n in sizes:
        layers = layers_for(n)
        dag = gpt_like_dag(layers)
        part = HPartition(max_top=max_top, max_sub=max_sub)
        t0 = time.perf_counter()
        levels = hpartition_levels(dag, part.max_top, part.max_sub, part.alpha)
        t1 = time.perf_counter()
        h = hierarchy_from_levels(dag, levels, partitioner=repr(part))
        t2 = time.perf_counter()
        row = {"nodes": dag.n, "layers": layers, "greedy_s": t1 - t0, "hierarchy_s": t2 - t1,
               "total_s": t2 - t0, **h.summary(), "graph_s": None}
        if n <= graph_up_to:
            graph = graph_from_dag(gpt_like_dag_ops(layers), [4 * 128 * 4])
            t3 = time.perf_counter()
            part.partition(graph)
            row["graph_s"] = time.perf_counter() - t3
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(r: dict) -> str:
    graph = f"{r['graph_s']:.2f}" if r["graph_s"] is not None else "-"
    return (f"| {r['nodes']} | {r['layers']} | {r['greedy_s']:.2f} | {r['hierarchy_s']:.2f} | "
            f"{r['total_s']:.2f} | {graph} | {r['levels']} | {r['subgraphs']} | "
            f"{r['unique_subgraphs']} | {r['largest_subgraph']} | {r['top_size']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--graph-up-to", type=int, default=10_000)
    ap.add_argument("--max-top", type=int, default=30)
    ap.add_argument("--max-sub", type=int, default=15)
    args = ap.parse_args()
    print("| forward nodes | layers | greedy (s) | hierarchy (s) | total DAG (s) | "
          "from Graph (s) | levels | subgraphs | unique | largest | top |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    run(args.sizes, args.graph_up_to, args.max_top, args.max_sub)


if __name__ == "__main__":
    main()
