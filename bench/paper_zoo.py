"""The zoo at the HiRemate paper's sizes: graph sizes and H-Partition beside the paper's Table 3.

For every setting of ``hiremate.zoo.paper_models()``: our forward nodes beside the paper's
Table 3(a) "size fwd only" and their ratio, our compute nodes (forward, loss and backward) and
data nodes, the seconds the graph build took, the milliseconds of one eager forward+backward
step, and H-Partition's summary with its defaults (``HPartition()``) beside the paper's Table
3(b) (depth / subgraphs / unique / largest). Results in docs/graphs.md, "Zoo at the paper's
sizes".

Run: ``python bench/paper_zoo.py`` (all models) or ``python bench/paper_zoo.py fno1d unet``.
Graphs use the analytic cost model (deterministic). ``--cache DIR`` saves each built graph
there and reuses it on the next run (the build column then reads 0). Prints a Markdown table
(``--json``: one JSON object per line instead).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import hiremate
from hiremate import zoo
from hiremate.ir.graph import Graph
from hiremate.partition import HPartition
from hiremate.zoo.paper import PaperModel

HEADER = ("paper model", "zoo setting", "fwd nodes", "paper", "ratio", "compute nodes",
          "data nodes", "build s", "step ms", "H-Partition (ours)", "H-Partition (paper)")


def setting(m: PaperModel) -> str:
    layers = "x".join(map(str, m.layers)) if isinstance(m.layers, tuple) else str(m.layers)
    return f"{m.zoo_name} L={layers} W={m.width} B={m.batch}"


def build(m: PaperModel, cache: Path | None) -> tuple[Graph, float]:
    """The setting's graph (flops cost model) and the seconds it took (0 when cached)."""
    from paper_common import graph_of

    return graph_of(f"paper-{m.paper_name}", lambda: zoo.get_paper(m.paper_name), "flops", cache)


def step_ms(m: PaperModel, repeats: int = 3) -> float:
    """Best wall time of one eager forward+backward of ``zoo.output_loss``, after a warm-up."""
    model, sample = zoo.get_paper(m.paper_name)
    args, kwargs = zoo.split_sample(sample)
    best = float("inf")
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        zoo.output_loss(model(*args, **kwargs)).backward()
        if i:
            best = min(best, time.perf_counter() - start)
    return best * 1000


def figures(m: PaperModel, cache: Path | None = None) -> dict:
    graph, build_s = build(m, cache)
    s = HPartition().partition(graph).summary()
    fwd = len(graph.fwd_nodes)
    return {
        "paper_model": m.paper_name, "setting": setting(m), "note": m.note,
        "fwd_nodes": fwd, "paper_fwd_nodes": m.paper_fwd_nodes,
        "ratio": round(fwd / m.paper_fwd_nodes, 2),
        "compute_nodes": len(graph.nodes), "data_nodes": len(graph.data),
        "build_s": round(build_s, 1), "step_ms": round(step_ms(m), 1),
        "partition": [s["levels"], s["subgraphs"], s["unique_subgraphs"],
                      s["largest_subgraph"]],
        "paper_partition": list(m.paper_partition),
    }


def _emit(row: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
        return
    cells = (row["paper_model"], row["setting"], row["fwd_nodes"], row["paper_fwd_nodes"],
             row["ratio"], row["compute_nodes"], row["data_nodes"], row["build_s"],
             row["step_ms"], "/".join(map(str, row["partition"])),
             "/".join(map(str, row["paper_partition"])))
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="paper model names (default: all)")
    parser.add_argument("--cache", type=Path, default=None, help="folder of built graphs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    chosen = [zoo.paper_model(name) for name in args.models] or list(zoo.paper_models().values())
    if not args.json:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
    for m in chosen:
        _emit(figures(m, args.cache), args.json)


if __name__ == "__main__":
    main()
