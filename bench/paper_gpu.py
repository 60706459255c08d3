"""The paper's Table 3 models on a GPU, at widths and batches where kernels outlast launches.

The paper's own figures come from measured GPU times on full-size models. The zoo's paper
settings (``hiremate.zoo.paper``) keep the paper's depths but small widths, so that a CPU can
run them; on a GPU those kernels are shorter than their launches and the step is dispatch time.
This script keeps the depths and scales width and batch (:data:`GPU_SCALE`) so that an eager
step takes tens of milliseconds, and runs in three phases, so that the solving, which needs no
GPU, can be done elsewhere:

``capture`` (on the GPU): every model built on the device in float32, its graph captured with
    ``--cost`` (``measured``: CUDA-event node times) and saved to ``OUT/NAME.graph``; one JSON
    line per model in ``OUT/capture.jsonl``: eager's step (fastest of ``--rounds``) and whole-step
    peak, the graph's predicted autodiff step and its whole-step autodiff peak
    (:func:`hiremate.ir.simulator.step_peak` with the loss's measured bytes).
``solve`` (anywhere): for every saved graph, the whole step solved at ``--budget`` times the
    graph's autodiff peak with the default preset, the schedule kept in the menu cache
    ``OUT/cache`` (``execute`` reads it back instead of solving again); one line per model in
    ``OUT/solve.jsonl``. The graph's own problem (the paper's) is ``bench/paper_table.py
    --graphs OUT``.
``execute`` (on the GPU): every model built again (same weights), wrapped with
    ``HRockmate.from_graph`` on the saved graph (a cache hit), and timed against eager in
    alternated rounds (fastest of ``--rounds`` each); measured peaks over the budget and over
    eager's, the largest gradient difference relative to the largest gradient. One line per
    model in ``OUT/execute.jsonl``.

Run::

    python bench/paper_gpu.py capture --out /tmp/pg                  # on the GPU
    python bench/paper_gpu.py solve --out /tmp/pg --n-jobs 2         # here
    python bench/paper_gpu.py execute --out /tmp/pg                  # on the GPU again
    bash bench/paper_gpu_all.sh /tmp/pg fno1d fno3d   # all three on the GPU machine, one lease

``--scale NAME=WIDTH,BATCH`` overrides :data:`GPU_SCALE` (repeatable). Results: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

import hiremate
from hiremate import zoo
from hiremate.ir.graph import Graph
from hiremate.ir.simulator import autodiff_schedule, simulate, step_peak

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_common import PAPER_TABLE3C, make_config, moved  # noqa: E402

log = logging.getLogger("bench.paper_gpu")

#: (width, batch) per paper model on a GPU: the depths stay the paper settings'. The FNOs'
#: are larger than in the first run (fno1d 64, 512 and fno3d 32, 64, docs/results-history.md "Stop
#: 38"), where their steps stayed bound by launches.
GPU_SCALE: dict[str, tuple[int, int]] = {
    "gpt-24": (768, 64),
    "unet": (64, 128),
    "mlpmixer": (512, 256),
    "regnet32": (64, 128),
    "resnet101": (32, 128),
    "transformer-6-6": (512, 256),
    "fno1d": (128, 4096),
    "fno3d": (64, 256),
}


def build(name: str, scale: dict[str, tuple[int, int]], device: torch.device
          ) -> tuple[torch.nn.Module, Any]:
    """The paper model ``name`` at ``scale``'s width and batch, on ``device`` (float32)."""
    m = zoo.paper_model(name)
    width, batch = scale[name]
    model, sample = zoo.get(m.zoo_name, layers=m.layers, width=width, batch=batch)
    return model.to(device), moved(sample, device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_seconds(fn: Callable[..., Any], model: torch.nn.Module, sample: Any,
                 device: torch.device) -> float:
    """One training step of ``fn`` (forward, ``zoo.output_loss``, backward), in seconds."""
    args, kwargs = zoo.split_sample(sample)
    for p in model.parameters():
        p.grad = None
    _sync(device)
    start = time.perf_counter()
    zoo.output_loss(fn(*args, **kwargs)).backward()
    _sync(device)
    return time.perf_counter() - start


def paired_times(fns: dict[str, Callable[..., Any]], model: torch.nn.Module, sample: Any,
                 device: torch.device, rounds: int) -> dict[str, float]:
    """The fastest step of each of ``fns``, run in alternation ``rounds`` times after one
    warm-up each: a burst of load hits both sides of a round, not one side's whole series."""
    for fn in fns.values():
        step_seconds(fn, model, sample, device)
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            best[k] = min(best[k], step_seconds(fn, model, sample, device))
    return best


def _graph_path(out: Path, name: str) -> Path:
    return out / f"{name}.graph"


def _emit(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row, default=float) + "\n")
    print(json.dumps(row, default=float), flush=True)


def capture(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from hiremate.runtime.measurement import loss_memory

    model, sample = build(name, args.scale, device)
    start = time.perf_counter()
    graph = hiremate.build_graph(model, sample, cost_model=args.cost)
    build_s = time.perf_counter() - start
    graph.save(_graph_path(args.out, name))
    call_args, kwargs = zoo.split_sample(sample)
    eager = hiremate.measure(model, *call_args, loss_fn=zoo.output_loss, repeats=args.rounds,
                             **kwargs)
    loss_bytes = int(loss_memory(model, sample, zoo.output_loss, graph.tangent_bytes))
    autodiff = autodiff_schedule(graph)
    sim = simulate(graph, autodiff)
    return {
        "model": name, "scale": list(args.scale[name]), "device": str(device),
        "cost": graph.meta.get("cost_model"), "compute_nodes": len(graph.nodes),
        "in_situ_share": graph.meta.get("in_situ_share"),
        "build_s": round(build_s, 1), "eager_step_ms": min(eager.times) * 1e3,
        "predicted_step_ms": sim.time * 1e3, "predicted_over_eager": sim.time / min(eager.times),
        "autodiff_peak": sim.peak, "loss_bytes": loss_bytes,
        "predicted_step_peak": step_peak(graph, autodiff, loss_bytes, rng_states=False),
        "eager_step_peak": eager.peak, "peak_method": eager.method,
    }


def _config(args: argparse.Namespace):
    return make_config(args.config, args.set, cache=True, cache_dir=str(args.out / "cache"),
                       calibrate=0, n_jobs=args.n_jobs, progress=False)


def _saved(name: str, args: argparse.Namespace) -> tuple[Graph, Any, int]:
    """The graph ``capture`` saved, its autodiff simulation and the budget (``--budget`` times
    its autodiff peak)."""
    graph = Graph.load(_graph_path(args.out, name))
    ad = simulate(graph, autodiff_schedule(graph))
    return graph, ad, int(args.budget * ad.peak)


def solve(name: str, args: argparse.Namespace) -> dict[str, Any]:
    graph, ad, budget = _saved(name, args)
    start = time.perf_counter()
    result = hiremate.solve_graph(graph, budget, _config(args),
                                  loss_bytes=2 * int(graph.tangent_bytes))
    rep = result.report
    return {"model": name, "budget": budget, "solve_s": round(time.perf_counter() - start, 1),
            "solver": rep.get("solver"), "relative_time": rep["relative_time"],
            "predicted_peak": rep["predicted_peak"],
            "relative_time_bound": (rep["time_bound"] / ad.time
                                    if rep.get("time_bound") is not None else None),
            "autodiff_time": ad.time, "paper_relative_time": PAPER_TABLE3C[name][3]}


def execute(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from hiremate.api import HRockmate

    graph, _, budget = _saved(name, args)
    model, sample = build(name, args.scale, device)
    start = time.perf_counter()
    remat = HRockmate.from_graph(model, graph, budget, config=_config(args), sample=sample)
    wrap_s = time.perf_counter() - start
    rep = remat.report()
    best = paired_times({"eager": model, "hiremate": remat}, model, sample, device, args.rounds)
    call_args, kwargs = zoo.split_sample(sample)
    peak = hiremate.measure(remat, *call_args, loss_fn=zoo.output_loss, repeats=1, **kwargs).peak
    eager_peak = hiremate.measure(model, *call_args, loss_fn=zoo.output_loss, repeats=1,
                                  **kwargs).peak
    grads = {}
    for key, fn in (("eager", model), ("hiremate", remat)):
        step_seconds(fn, model, sample, device)
        grads[key] = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                      if p.grad is not None}
    scale = max(float(g.abs().max()) for g in grads["eager"].values())
    diff = max(float((grads["hiremate"][k] - g).abs().max()) for k, g in grads["eager"].items())
    return {
        "model": name, "budget": budget, "wrap_s": round(wrap_s, 1),
        "cache_hits": rep.get("cache_hits"), "solver": rep.get("solver"),
        "predicted_relative_time": rep["relative_time"],
        "measured_relative_time": best["hiremate"] / best["eager"],
        "eager_step_ms": best["eager"] * 1e3, "hiremate_step_ms": best["hiremate"] * 1e3,
        "predicted_peak": rep["predicted_peak"], "measured_peak": peak,
        "measured_peak_over_budget": peak / budget, "measured_relative_peak": peak / eager_peak,
        "paper_relative_time": PAPER_TABLE3C[name][3], "paper_observed": PAPER_TABLE3C[name][4],
        "paper_relative_peak": PAPER_TABLE3C[name][2],
        "max_grad_diff_relative": diff / scale if scale else diff,
    }


def _scale(items: list[str]) -> dict[str, tuple[int, int]]:
    out = dict(GPU_SCALE)
    for item in items:
        name, _, rest = item.partition("=")
        width, _, batch = rest.partition(",")
        out[name] = (int(width), int(batch))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("capture", "solve", "execute"))
    parser.add_argument("models", nargs="*", help="paper model names (default: GPU_SCALE's)")
    parser.add_argument("--out", type=Path, required=True, help="folder of graphs and results")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cost", default="measured")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--budget", type=float, default=0.5,
                        help="budget as a fraction of the graph's autodiff peak (default 0.5)")
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--config", default="hiremate")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--scale", action="append", default=[], metavar="NAME=WIDTH,BATCH")
    args = parser.parse_intermixed_args()  # models may follow the options
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    args.scale = _scale(args.scale)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    names = args.models or list(GPU_SCALE)
    results = args.out / f"{args.phase}.jsonl"
    for name in names:
        start = time.perf_counter()
        try:
            if args.phase == "capture":
                row = capture(name, args, device)
            elif args.phase == "solve":
                row = solve(name, args)
            else:
                row = execute(name, args, device)
        except Exception as exc:  # one model's failure must not cost the others' figures
            log.exception("%s: %s failed", name, args.phase)
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
        row["phase_s"] = round(time.perf_counter() - start, 1)
        _emit(results, row)
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
