"""The composer ranks and reports schedules as the executor runs them: a solver may skip an
effect-only buffer write (BatchNorm's ``num_batches_tracked += 1``, which nothing reads), and
the executor then runs it before the loss (``complete_effects``). Before this was shared, the
reported time left those nodes out while autodiff's counted them, so a ResNet-101 with measured
costs was predicted at 0.988 of autodiff's time."""

from __future__ import annotations

import torch

import hiremate
from hiremate.api import solve_graph
from hiremate.ir.schedule import Compute
from hiremate.ir.sequence import complete_effects
from hiremate.ir.tracker import is_effect_only


def _bn_graph():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layers = []
        for _ in range(4):
            layers += [torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                       torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers)
        x = torch.randn(2, 4, 8, 8)
    return hiremate.build_graph(model, x, cost_model="flops")


def _effect_only(graph) -> list[int]:
    return [n.id for n in graph.nodes if n.is_fwd and n.mutates and is_effect_only(graph, n)]


def test_reported_schedule_runs_every_buffer_write():
    graph = _bn_graph()
    writes = set(_effect_only(graph))
    assert len(writes) == 4  # one num_batches_tracked per BatchNorm
    for preset in ("hiremate", "fastsa", "twremat"):
        res = solve_graph(graph, 0.95, preset, cache=False, calibrate=0, n_jobs=1,
                          progress=False)
        computed = {s.node for s in res.schedule if isinstance(s, Compute)}
        assert writes <= computed, preset
        assert complete_effects(graph, res.schedule) is res.schedule
        sim = hiremate.simulate(graph, res.schedule)
        assert sim.time == res.report["predicted_time"] and sim.peak <= res.report["budget"]


def test_complete_effects_adds_skipped_writes_before_the_loss():
    graph = _bn_graph()
    ad = tuple(hiremate.autodiff_schedule(graph))
    writes = _effect_only(graph)
    skipped = tuple(s for s in ad if not (isinstance(s, Compute) and s.node in writes))
    done = complete_effects(graph, skipped)
    loss_at = next(i for i, s in enumerate(done) if isinstance(s, Compute)
                   and s.node == graph.loss)
    assert [s.node for s in done[loss_at - len(writes):loss_at]] == writes
    assert hiremate.simulate(graph, done).valid
    assert complete_effects(graph, ad) is ad
