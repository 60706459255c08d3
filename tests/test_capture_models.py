"""Issue 16, "capture the models users bring": every model of ``capture_zoo`` captured, solved at
0.5 of its autodiff peak (or at the ``min_budget`` of a clear ``InfeasibleBudgetError``), its
float64 loss and gradients equal to eager PyTorch's (relative 1e-10), ``.grad is None`` where
eager's is, its measured peak at most the budget x 1.05, and its state (``state_dict`` bit for
bit, training flags, torch RNG) untouched by the build. The checks live in ``capture_check.py``
(shared with ``bench/capture_models.py``, which writes ``docs/models.md``).

Default run (about a minute in all once capture works): the cases built with
``default_run=True`` in ``capture_zoo.CASES`` (GPT2, ViT, Wav2Vec2's LayerDrop error, the timm-like
blocks, LSTM, GRU, the in-place/BatchNorm models, both checkpoint models), with the default preset
plus ``capture_zoo.FAST`` (HiGHS limited to 2 s per MILP, hilp-top to 5 s, rk-Rotor 100 slots, one
process) and a fresh menu cache. Every other case is ``slow`` (``pytest -m slow
tests/test_capture_models.py``) and runs the default preset as it is (with a fresh menu cache).
timm cases skip, naming the import error, when ``import timm`` fails.
"""

from __future__ import annotations

import pytest

import capture_check
import capture_zoo


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
    assert not out.state_changed, f"the build changed {out.state_changed}"
    assert out.loss_error <= capture_check.GRAD_RTOL, f"loss relative error {out.loss_error:.3g}"
    bad = {k: e for k, e in out.grad_errors.items() if e > capture_check.GRAD_RTOL}
    assert not bad, f"gradients differ from eager's: {bad}"
    assert not out.none_mismatch, f".grad is None differs from eager's on {out.none_mismatch}"
    assert out.step_state_error <= capture_check.GRAD_RTOL, (
        f"buffers after one step differ from eager's by {out.step_state_error:.3g}")
    assert out.measured_peak <= out.budget * capture_check.PEAK_SLACK, (
        f"measured {out.measured_peak} B > budget {out.budget} B x {capture_check.PEAK_SLACK}")
    assert out.failures() == []
