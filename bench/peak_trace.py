"""Where a predicted autodiff peak and eager's measured one part: allocator traces to compare.

For each zoo model (default sizes, float32) on ``--device``: the graph captured with ``--cost``
and saved (``OUT/NAME.graph``), the whole-step peak the simulator predicts for the autodiff
schedule (:func:`hiremate.ir.simulator.step_peak`, the loss's measured bytes added), eager's
measured whole-step peak, and eager's allocator trace on CUDA (every allocation and completed
free with its address and size) in ``OUT/NAME-trace.json``, to be matched
against the graph's nodes offline. One JSON line per model in ``OUT/peaks.jsonl``.

Run::

    python bench/peak_trace.py --out /tmp/pt mlp vit resnet gpt2 neox      # on a GPU

Why: on an H100 the predicted autodiff peak was 1.9x eager's on the MLP and 1.19x on the ViT,
and below it on GPT2 and NeoX (docs/benchmarks.md, "On a GPU"); the traces say which tensors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

import hiremate
from hiremate import zoo
from hiremate.cuda_trace import device_trace, events_from_cuda_trace, record_cuda_history
from hiremate.ir.simulator import autodiff_schedule, simulate, step_peak
from hiremate.runtime.measurement import loss_memory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_common import moved  # noqa: E402


def eager_trace(model: torch.nn.Module, sample: Any, device: torch.device) -> list[list[int]]:
    """Eager's step (forward, ``zoo.output_loss``, backward), parameter gradients cleared first:
    ``[address, bytes]`` per allocation (bytes < 0: a completed free), in order."""
    args, kwargs = zoo.split_sample(sample)
    zoo.output_loss(model(*args, **kwargs)).backward()  # warm-up: cuBLAS handles, workspaces
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize(device)
    record_cuda_history(device, True)
    try:
        zoo.output_loss(model(*args, **kwargs)).backward()
        torch.cuda.synchronize(device)
        trace = device_trace(device)
    finally:
        record_cuda_history(device, False)
    return [list(event) for event in events_from_cuda_trace(trace)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["mlp", "vit", "resnet", "gpt2", "neox"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cost", default="measured")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for name in args.models:
        model, sample = zoo.get(name)
        model = model.to(device)
        sample = moved(sample, device)
        graph = hiremate.build_graph(model, sample, cost_model=args.cost)
        graph.save(args.out / f"{name}.graph")
        call_args, kwargs = zoo.split_sample(sample)
        eager = hiremate.measure(model, *call_args, loss_fn=zoo.output_loss, repeats=2, **kwargs)
        loss_bytes = int(loss_memory(model, sample, zoo.output_loss, graph.tangent_bytes))
        schedule = autodiff_schedule(graph)
        row = {"model": name, "device": str(device), "nodes": len(graph.nodes),
               "graph_autodiff_peak": simulate(graph, schedule).peak, "loss_bytes": loss_bytes,
               "tangent_bytes": int(graph.tangent_bytes),
               "predicted_step_peak": step_peak(graph, schedule, loss_bytes, rng_states=False),
               "eager_step_peak": eager.peak, "method": eager.method}
        if device.type == "cuda":
            trace = eager_trace(model, sample, device)
            (args.out / f"{name}-trace.json").write_text(json.dumps(trace))
            row["trace_events"] = len(trace)
        with (args.out / "peaks.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
