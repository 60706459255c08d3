"""RematModule inside DistributedDataParallel (gloo, two CPU processes on 127.0.0.1): the
all-reduced gradients equal those of the original model under DDP."""

from __future__ import annotations

import copy
import gc
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, graph_text: str, out_dir: str) -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    from hiremate import Graph, zoo
    from hiremate.runtime.executor import RematModule
    from test_executor_schedules import recomputing_schedules

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        graph = Graph.from_dict(__import__("json").loads(graph_text))
        model, _ = zoo.get("mlp", dtype=torch.float64)
        ref = copy.deepcopy(model)
        remat = torch.nn.parallel.DistributedDataParallel(
            RematModule(model, graph, recomputing_schedules(graph)["keep-half"]))
        eager = torch.nn.parallel.DistributedDataParallel(ref)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
        x = torch.randn(8, 32, generator=gen, dtype=torch.float64)
        for m in (remat, eager):
            m(x).pow(2).sum().backward()
        diffs = [(p.grad - q.grad).abs().max().item()
                 for p, q in zip(model.parameters(), ref.parameters())]
        torch.save({"diffs": diffs, "grads": [p.grad for p in model.parameters()]},
                   os.path.join(out_dir, f"rank{rank}.pt"))
        # DDP's reducers go before the process group: left to the interpreter's exit, one of
        # them sometimes aborts the process ("terminate called without an active exception",
        # SIGABRT) after the work is done
        del remat, eager, m
        gc.collect()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_ddp_gradients_equal_eager_ddp(tmp_path) -> None:
    from test_executor_util import graph_of

    graph = graph_of("mlp")
    mp.spawn(_worker, args=(2, _free_port(), graph.dumps(), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in results:
        assert max(r["diffs"]) <= 1e-12
    # all-reduced: both ranks hold the same gradients
    for a, b in zip(results[0]["grads"], results[1]["grads"]):
        assert torch.equal(a, b)
