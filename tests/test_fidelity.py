"""Cost-model fidelity on every zoo model: the simulated autodiff peak against the measured one.

The measured peak is an independent truth (the profiler's allocation events, by
``hiremate.measure``); timings are too noisy for CI and live in docs/graphs.md instead.
"""

from __future__ import annotations

import pytest

import hiremate
from hiremate import zoo


@pytest.mark.parametrize("name", zoo.names())
def test_simulated_autodiff_peak_within_10_percent_of_measured(name):
    model, sample = zoo.get(name)
    graph = hiremate.build_graph(model, sample, repeats=1)
    predicted = hiremate.simulate(graph, hiremate.autodiff_schedule(graph)).peak
    args, kwargs = zoo.split_sample(sample)
    measured = hiremate.measure(model, *args, repeats=1, warmup=1, **kwargs).peak
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)
