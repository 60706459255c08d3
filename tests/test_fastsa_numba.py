"""FastSA's numba kernel takes exactly the Python reference's path.

The truth is the pure-Python annealer (``accelerate="python"``): for each graph, budget and
seed, the kernel must return the same sequence, peak and time, the same counters (attempts,
evaluated, accepted, and even ``bounded``: the same bounds decide), the same best visited
sequence, and leave ``random.Random`` in the same state. Skipped when numba is not installed.
"""

from __future__ import annotations

import logging
import random

import pytest

pytest.importorskip("numba")

import hiremate  # noqa: E402
from hiremate.errors import ConfigError  # noqa: E402
from hiremate.solvers.fastsa import accel as fastsa_accel  # noqa: E402
from hiremate.solvers.fastsa.solver import FastSA, primitive_table  # noqa: E402
from hiremate.testing.synthetic import chain_graph, random_graph  # noqa: E402


def _run(graph, frac: float, accelerate: str, **kw):
    budget = int(frac * hiremate.simulate(graph, hiremate.autodiff_schedule(graph)).peak)
    solver = FastSA(accelerate=accelerate, time_limit=1e9, **kw)
    result = solver.solve(graph, budget)
    stats = [(s.attempts, s.evaluated, s.accepted, s.bounded, s.best) for s in solver.last_stats]
    return result, stats


CASES = [  # (graph, budget fraction, solver settings)
    (random_graph(0, 20), 0.05, dict(seed=0)),
    (random_graph(1, 60), 0.5, dict(seed=7)),
    (random_graph(3, 40, 2), 0.75, dict(seed=3)),
    (random_graph(5, 120), 0.5, dict(seed=11, iters_grouped=6_000, iters_fine=6_000)),
    (chain_graph([10] * 20, [1.0] * 20), 0.5, dict(seed=2)),
    (random_graph(4, 50), 0.5, dict(seed=3, grouping=False)),
    (random_graph(6, 80), 0.4, dict(seed=1, move_window=5, gap=2)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_takes_the_python_path(case):
    graph, frac, kw = CASES[case]
    kw = dict(iters_grouped=10_000, iters_fine=10_000) | kw
    assert _run(graph, frac, "numba", **kw) == _run(graph, frac, "python", **kw)


def test_kernel_leaves_state_and_generator_as_python_does():
    """Everything a later caller reads: the slot state's lists, profile, cost, peak, the
    first-slot cache and the generator's next draws."""
    g = random_graph(8, 40)
    peak = hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak
    ends = []
    for accelerate in ("numba", "python"):
        solver = FastSA(accelerate=accelerate)
        table = primitive_table(g)
        state = solver._state(g, table, list(range(len(g))))
        rng = random.Random(4)
        stats = solver.anneal(state, peak // 2, 5_000, 1e3, 1e-1, rng, False, float("inf"))
        ends.append((state.seq, state.prods, state.uses, state.mem.tolist(), state.cost,
                     state.peak, state.peak_at, state.first_cache, rng.random(),
                     stats.attempts, stats.evaluated, stats.best))
    assert ends[0] == ends[1]


def test_widened_rows_change_nothing(monkeypatch, caplog):
    """Rows start tiny here, so the kernel has to stop, widen and resume many times."""
    monkeypatch.setattr(fastsa_accel, "MIN_ROWS", 0)
    g = chain_graph([10] * 20, [1.0] * 20)
    kw = dict(seed=5, iters_grouped=8_000, iters_fine=8_000)
    with caplog.at_level(logging.DEBUG, logger=fastsa_accel.__name__):
        fast = _run(g, 0.4, "numba", **kw)
    assert any("widened" in r.getMessage() for r in caplog.records)
    assert fast == _run(g, 0.4, "python", **kw)


def test_accelerate_setting_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="accelerate"):
        FastSA(accelerate="gpu")
    monkeypatch.setattr(fastsa_accel, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"hiremate\[fast\]"):
        FastSA(accelerate="numba")
    # "auto" falls back to the Python loop when numba is missing (the kernel is never called)

    def no_kernel(*args, **kwargs):
        raise AssertionError("the kernel ran without numba")

    monkeypatch.setattr(fastsa_accel, "anneal", no_kernel)
    g = random_graph(2, 15)
    budget = hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak // 2
    kw = dict(seed=1, iters_grouped=2_000, iters_fine=2_000, time_limit=1e9)
    assert FastSA(**kw).solve(g, budget) == FastSA(accelerate="python", **kw).solve(g, budget)
