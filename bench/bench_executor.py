"""Iteration time of the executor against eager PyTorch, on the autodiff schedule.

The autodiff schedule does what eager does (every node once, each value freed after its last
use), so the ratio measures the executor's own overhead: generated code, one autograd
Function per call, gradient hand-over. Eager and hiremate iterations are interleaved (the
machine is shared, so drifts hit both alike) and the ratio is taken of the medians.

    python bench/bench_executor.py                       # zoo gpt2 and resnet, CPU
    python bench/bench_executor.py --models gpt2 --width 256 --iters 30 --device cuda
"""

from __future__ import annotations

import argparse
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


def bench(name: str, width: int | None, batch: int | None, layers: int | None, iters: int,
          device: str, clock=time.perf_counter) -> dict:
    model, sample = zoo.get(name, width=width, batch=batch, layers=layers)
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
            "hiremate_ms": r * 1e3, "ratio": r / e}


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
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    print(f"clock: {a.clock}, threads: {a.threads}, device: {a.device}")
    print(f"{'model':8s} {'joint ops':>9s} {'eager ms':>9s} {'hiremate ms':>11s} {'ratio':>6s}")
    for name in a.models:
        clock = time.perf_counter if a.clock == "wall" else time.process_time
        r = bench(name, a.width, a.batch, a.layers, a.iters, a.device, clock)
        print(f"{r['model']:8s} {r['ops']:9d} {r['eager_ms']:9.2f} {r['hiremate_ms']:11.2f} "
              f"{r['ratio']:6.3f}")


if __name__ == "__main__":
    main()
