"""Capture the models users bring: every model of ``capture_zoo`` captured, solved at
0.5 of its autodiff peak (or at the ``min_budget`` of a clear ``InfeasibleBudgetError``), its
float64 loss and gradients equal to eager PyTorch's (relative 1e-10), ``.grad is None`` where
eager's is, its measured peak at most the budget x 1.05, and its state (``state_dict`` bit for
bit, training flags, torch RNG) untouched by the build. The checks live in ``capture_check.py``
(shared with ``bench/capture_models.py``, which writes ``docs/models.md``).

Default run: the cases built with ``default_run=True`` in
``capture_zoo.CASES`` (ViT, Wav2Vec2's LayerDrop and SpecAugment errors, the timm-like blocks,
LSTM, the in-place/BatchNorm models, both checkpoint models), with the default preset plus
``capture_zoo.FAST`` (work limits: H-ILP at its root on at most 40 nodes, hilp-top 10
branch-and-bound nodes; rk-Rotor 100 slots, one process, no polish) and a fresh menu cache
(the roofline fit is the run's, ``conftest.py``).
Every other case is ``slow`` (``pytest -m slow tests/test_capture_models.py``) and runs the
default preset as it is, with a fresh menu cache.
timm cases skip, naming the import error, when ``import timm`` fails.
"""

from __future__ import annotations

import pytest
import torch

import capture_check
import capture_zoo


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a shared, loaded CPU two threads contend, and these tests compare
    values, not speeds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _params():
    for case in capture_zoo.CASES:
        marks = [pytest.mark.slow] if case.slow else []
        yield pytest.param(case.name, marks=marks, id=case.name)


@pytest.mark.parametrize("name", list(_params()))
def test_capture_model(name, tmp_path):
    case = capture_zoo.get(name)
    overrides = {"cache_dir": str(tmp_path / "menus"), **(case.fast_config or {})}
    out = capture_check.check_case(case, 0.5, **overrides)
    if out.status == "skipped":
        pytest.skip(out.error)
    if case.expect is not None:
        assert out.status == "expected-error", (
            f"expected {case.expect[0]} matching {case.expect[1]!r}: {out.error}")
        assert not out.state_changed, f"the failed build changed {out.state_changed}"
        return
    if out.retried_at is not None:
        print(f"{name}: infeasible at 0.5, built at min_budget = {out.retried_at:.3f} of autodiff")
    assert out.status == "ok", out.error
    # every check at once (state, loss, gradients, .grad None, buffers after a step, peak)
    assert out.failures() == [], f"{name}: " + "; ".join(out.failures())
