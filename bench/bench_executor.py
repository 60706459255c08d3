"""Iteration time of the executor against eager PyTorch, on the autodiff schedule.

The autodiff schedule does what eager does (every node once, each value freed after its last
use), so the ratio measures the executor's own overhead: generated code, one autograd
Function per call, gradient hand-over. Eager and hiremate iterations are interleaved (the
machine is shared, so drifts hit both alike) and the ratio is taken of the medians.

    python bench/bench_executor.py                       # zoo gpt2 and resnet, CPU
    python bench/bench_executor.py --models gpt2 --width 256 --iters 30 --device cuda
    python bench/bench_executor.py --device cuda --ops \
        sized:gpt2:layers=6,width=512,heads=8,seq=512,batch=8,vocab=8192

A model is a zoo name or ``sized:NAME:KEY=VALUE,...`` (a Hugging Face model of
:mod:`hiremate.zoo.sized`, every argument at its default). ``--ops`` also prints the captured
graph's most frequent ATen ops and its attention ops: where eager runs a fused attention kernel
that the capture decomposed, the executor runs more kernels than eager (the question stop 46's
GPU table left open, docs/benchmarks-sweeps.md).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

import hiremate
from hiremate import zoo
from hiremate.runtime.executor import RematModule
from hiremate.runtime.measurement import loss_of


def _step(fn, args, kwargs, sync, clock) -> float:
    start = clock()
    out = fn(*args, **kwargs)
    loss_of(out).backward()
    sync()
    return clock() - start


def build(name: str, width: int | None, batch: int | None, layers: int | None):
    """A zoo model, or ``sized:NAME:KEY=VALUE,...`` from :mod:`hiremate.zoo.sized`."""
    if not name.startswith("sized:"):
        return zoo.get(name, width=width, batch=batch, layers=layers)
    from hiremate.zoo import sized

    _, factory, *rest = name.split(":")
    sizes = dict(item.split("=") for item in rest[0].split(",")) if rest and rest[0] else {}
    return getattr(sized, factory)(**{k: int(v) for k, v in sizes.items()})


def op_summary(graph, top: int = 8) -> str:
    """The ``top`` most frequent ATen ops of the graph's compute nodes, and its attention ops."""
    counts = collections.Counter(str(op.get("target") if isinstance(op, dict)
                                     else getattr(op, "target", op))
                                 for node in graph.nodes for op in node.ops)
    attention = sorted(k for k in counts if "attention" in k or "softmax" in k)
    common = ", ".join(f"{k} {n}" for k, n in counts.most_common(top))
    return f"  ops: {common}\n  attention ops: {', '.join(attention) or 'none'}"


def bench(name: str, width: int | None, batch: int | None, layers: int | None, iters: int,
          device: str, clock=time.perf_counter, ops: bool = False) -> dict:
    model, sample = build(name, width, batch, layers)
    model = model.to(device)
    args, kwargs = zoo.split_sample(sample)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    graph = hiremate.build_graph(model, (args, kwargs) if args and kwargs else
                                 (kwargs if kwargs else args), cost_model="flops")
    remat = RematModule(model, graph, hiremate.autodiff_schedule(graph))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        _step(model, args, kwargs, sync, clock)
        _step(remat, args, kwargs, sync, clock)
    eager_t, remat_t = [], []
    for _ in range(iters):
        model.zero_grad(set_to_none=True)
        eager_t.append(_step(model, args, kwargs, sync, clock))
        model.zero_grad(set_to_none=True)
        remat_t.append(_step(remat, args, kwargs, sync, clock))
    e, r = statistics.median(eager_t), statistics.median(remat_t)
    return {"model": name, "ops": graph.meta.get("joint_ops"), "eager_ms": e * 1e3,
            "hiremate_ms": r * 1e3, "ratio": r / e,
            "op_summary": op_summary(graph) if ops else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "resnet"])
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or the process's CPU time (steadier on a shared CPU)")
    parser.add_argument("--ops", action="store_true",
                        help="print the captured graph's frequent and attention ops")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    print(f"clock: {a.clock}, threads: {a.threads}, device: {a.device}")
    print(f"{'model':8s} {'joint ops':>9s} {'eager ms':>9s} {'hiremate ms':>11s} {'ratio':>6s}")
    for name in a.models:
        clock = time.perf_counter if a.clock == "wall" else time.process_time
        r = bench(name, a.width, a.batch, a.layers, a.iters, a.device, clock, a.ops)
        print(f"{r['model']:8s} {r['ops']:9d} {r['eager_ms']:9.2f} {r['hiremate_ms']:11.2f} "
              f"{r['ratio']:6.3f}")
        if r["op_summary"]:
            print(r["op_summary"])


if __name__ == "__main__":
    main()
