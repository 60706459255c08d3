"""A forward that reads a buffer it writes (a running mean updated, then subtracted): a step
that reads the buffer after the write, a recomputation in the backward, takes the value from
before the write, which the executor copies just before it and the simulator counts."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hiremate
from hiremate.ir.buffer_writes import snapshot_spans, written_buffers
from hiremate.ir import simulator
from hiremate.ir.simulator import step_peak
from hiremate.runtime.executor import RematModule
from test_executor_schedules import activations, keep_schedule
from test_executor_util import (
    assert_close, compare, fresh_sample, get_model, graph_of, run_step, schedules_of, split)


@pytest.mark.parametrize("schedule", ["autodiff", "keep-none", "keep-half", "keep-third"])
def test_a_forward_reading_the_buffer_it_updates_trains_as_eager(schedule: str) -> None:
    """Outputs, gradients and buffers equal eager's; before, keep-none's recomputed running
    means read the updated buffers and its gradients differed."""
    compare("running", schedule)


def test_the_copy_is_taken_where_a_step_reads_after_the_write_and_counted(monkeypatch) -> None:
    graph = graph_of("running")
    assert len(written_buffers(graph)) == 3
    schedules = schedules_of(graph)
    assert snapshot_spans(graph, schedules["autodiff"]) == []
    spans = snapshot_spans(graph, schedules["keep-none"])
    assert spans, "keep-none recomputes the running means after their writes"
    model, sample = get_model("running")
    remat = RematModule(model, graph, schedules["keep-none"])
    forward, backward = remat._get_programs(sample[0].device)
    assert "C.snap[" in forward.source and "C.snap.pop(" in backward.source
    counted = step_peak(graph, schedules["keep-none"])
    with monkeypatch.context() as patch:
        patch.setattr(simulator, "snapshot_spans", lambda *_: [])
        uncounted = step_peak(graph, schedules["keep-none"])
    assert uncounted <= counted <= uncounted + sum(b.size for b, _, _ in spans)
    measured = hiremate.measure(remat, *split(sample)[0], repeats=1, warmup=0)
    assert measured.peak <= counted * 1.02 + 4096


def test_batch_norm_needs_no_copy() -> None:
    """BatchNorm reads its running statistics only to update them in training mode (the
    backward is passed them and ignores them): no schedule copies them."""
    for name in ("convbn", "resnet"):
        graph = graph_of(name)
        for schedule in schedules_of(graph).values():
            assert snapshot_spans(graph, schedule) == []


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.data())
def test_any_kept_set_trains_as_eager_within_the_counted_peak(data) -> None:
    """Property: whichever activations a schedule keeps (the rest recomputed in the
    backward), the step equals eager's and its measured peak stays within ``step_peak``."""
    graph = graph_of("running")
    acts = activations(graph)
    keep = data.draw(st.sets(st.sampled_from(acts)))
    schedule = keep_schedule(graph, keep)
    assert hiremate.simulate(graph, schedule).valid
    model, sample = get_model("running")
    eager = copy.deepcopy(model)
    remat = RematModule(model, graph, schedule)
    out, grads = run_step(remat, fresh_sample(sample))
    out_eager, grads_eager = run_step(eager, fresh_sample(sample))
    assert_close(out, out_eager)
    for g, e in zip(grads, grads_eager):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
    for b, e in zip(model.buffers(), eager.buffers()):
        torch.testing.assert_close(b, e, rtol=0, atol=0)
    measured = hiremate.measure(remat, *split(sample)[0], repeats=1, warmup=0)
    assert measured.peak <= step_peak(graph, schedule) * 1.02 + 4096
