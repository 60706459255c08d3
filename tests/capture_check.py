"""The capture acceptance check on one case of ``capture_zoo``, shared by the test and the
table (``bench/capture_models.py``), so both measure the same things the same way.

:func:`check_case` runs, in order:

1. eager PyTorch: one seeded training step (forward, ``loss_fn``, backward) gives the reference
   loss, the parameter gradients and the state after a step; the model's state is then put back;
2. ``HRockmate(model, sample, budget)``; on :class:`InfeasibleBudgetError` once more at its
   ``min_budget`` (recorded). The model's ``state_dict()`` and non-persistent buffers (bit for
   bit), its training and ``requires_grad`` flags and the global torch RNG state must be what
   they were before the build;
3. one hiremate step with the same seed: loss and gradients against eager's (relative error,
   per tensor: ``max|a - b| / max|b|``), ``.grad is None`` on the same parameters, the state
   after the step (BatchNorm running statistics) against eager's;
4. ``hiremate.measure`` of the built module: the measured peak against the budget the solver
   used (``report()["budget"]``).

Nothing raised is swallowed unless ``catch=True`` (the table): the :class:`Outcome` then holds
the error class and its first line, and the stage it came from.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import hiremate
from capture_zoo import Case, Unavailable
from hiremate.api import HRockmate
from hiremate.errors import InfeasibleBudgetError
from hiremate.graphbuilder.capture import normalise_sample

SEED = 1234
PEAK_SLACK = 1.05
GRAD_RTOL = 1e-10


@dataclass
class Outcome:
    name: str
    status: str = "ok"           # ok | skipped | error | expected-error | no-expected-error
    stage: str = ""              # build | eager | hiremate | measure, where it stopped
    error: str = ""              # "Class: first line"
    nodes: int | None = None     # compute nodes of the graph
    build_time: float | None = None      # HRockmate(...) wall time, all attempts
    capture_time: float | None = None    # hiremate.build_graph in the last attempt
    solve_time: float | None = None      # report()["solve_time"] (with calibration re-solves),
                                         # plus the infeasible attempt's solving
    calibration_time: float | None = None
    retried_at: float | None = None      # fraction of the autodiff peak, after infeasible 0.5
    budget: int | None = None
    autodiff_peak: int | None = None
    predicted_peak: int | None = None
    measured_peak: int | None = None
    loss_error: float | None = None
    grad_error: float | None = None      # max over parameters (and the loss)
    grad_errors: dict[str, float] = field(default_factory=dict)
    none_mismatch: list[str] = field(default_factory=list)
    state_changed: list[str] = field(default_factory=list)   # by the build
    step_state_error: float | None = None  # state after one step vs eager's (buffers)

    def failures(self) -> list[str]:
        """What falls short of the acceptance text (empty: the case passes)."""
        if self.status in ("skipped", "expected-error"):
            return []
        if self.status != "ok":
            return [f"{self.stage}: {self.error}"]
        out = []
        if self.state_changed:
            out.append(f"the build changed {', '.join(self.state_changed[:5])}")
        if self.loss_error is None or self.loss_error > GRAD_RTOL:
            out.append(f"loss differs from eager's by {self.loss_error:.3g} (relative)")
        bad = {k: e for k, e in self.grad_errors.items() if e > GRAD_RTOL}
        if bad:
            worst = sorted(bad, key=bad.get, reverse=True)[:3]
            out.append(f"{len(bad)} gradients differ from eager's, e.g. "
                       + ", ".join(f"{k} ({bad[k]:.3g})" for k in worst))
        if self.none_mismatch:
            out.append(f".grad is None differs from eager's on {', '.join(self.none_mismatch[:5])}")
        if self.step_state_error is not None and self.step_state_error > GRAD_RTOL:
            out.append(f"state after one step differs from eager's by {self.step_state_error:.3g}")
        if self.measured_peak is not None and self.measured_peak > self.budget * PEAK_SLACK:
            out.append(f"measured peak {self.measured_peak} B is above budget {self.budget} B "
                       f"x {PEAK_SLACK}")
        return out


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item() if b.numel() else 0.0
    diff = (a - b).abs().max().item() if b.numel() else 0.0
    return diff / scale if scale > 0 else diff


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``state_dict()`` and the non-persistent buffers (rotary ``inv_freq``, masks) too."""
    state = dict(model.state_dict(keep_vars=True))
    for name, buf in model.named_buffers():
        state.setdefault(name, buf)
    return state


def snapshot(model: torch.nn.Module) -> dict[str, Any]:
    return {
        "state": {k: v.detach().clone() for k, v in _state(model).items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "rng": torch.get_rng_state(),
    }


def differences(before: dict[str, Any], model: torch.nn.Module) -> list[str]:
    """What changed since :func:`snapshot`: state keys, training flags, RNG (bit for bit)."""
    now = snapshot(model)
    out = [k for k, v in before["state"].items()
           if k not in now["state"] or now["state"][k].dtype != v.dtype
           or now["state"][k].shape != v.shape or not torch.equal(now["state"][k], v)]
    out += [f"new state entry {k}" for k in now["state"] if k not in before["state"]]
    if now["training"] != before["training"]:
        out.append("training flags")
    if now["requires_grad"] != before["requires_grad"]:
        out.append("requires_grad flags")
    if not torch.equal(now["rng"], before["rng"]):
        out.append("torch RNG state")
    return out


def restore(model: torch.nn.Module, before: dict[str, Any]) -> None:
    with torch.no_grad():
        for k, v in _state(model).items():
            v.copy_(before["state"][k])


def training_step(fn: Any, model: torch.nn.Module, sample: Any, loss_fn: Any):
    """One seeded step of ``fn`` (the model or its hiremate module): the loss, every parameter's
    ``.grad`` (None kept), and the buffers after the step. The caller's RNG states are kept."""
    args, kwargs = normalise_sample(sample)
    for p in model.parameters():
        p.grad = None
    np_state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        np.random.seed(SEED)
        loss = loss_fn(fn(*args, **kwargs))
        loss.backward()
    np.random.set_state(np_state)
    grads = {n: None if p.grad is None else p.grad.detach().clone()
             for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = None
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    return loss.detach().clone(), grads, buffers


@contextlib.contextmanager
def timed_capture(times: list[float]):
    """Record the wall time of each ``hiremate.build_graph`` call (``HRockmate`` looks it up
    on the package at each build) in ``times``."""
    original = hiremate.build_graph

    def timed(*args: Any, **kwargs: Any):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - start)

    hiremate.build_graph = timed
    try:
        yield times
    finally:
        hiremate.build_graph = original


def build(model, sample, budget: float, out: Outcome, **overrides: Any) -> HRockmate:
    """``HRockmate(model, sample, budget)``, once more at ``min_budget`` when infeasible."""
    start = time.perf_counter()
    failed = 0.0
    with timed_capture([]) as captures:
        try:
            rm = HRockmate(model, sample, budget, **overrides)
        except InfeasibleBudgetError as exc:
            if exc.min_budget is None:
                raise
            failed = time.perf_counter() - start - sum(captures)
            rm = HRockmate(model, sample, int(exc.min_budget), **overrides)
            out.retried_at = exc.min_budget / rm.report()["autodiff_peak"]
    out.build_time = time.perf_counter() - start
    rep = rm.report()
    out.capture_time = captures[-1]
    out.calibration_time = rep.get("calibration_time", 0.0)
    out.solve_time = rep.get("solve_time", 0.0) + failed
    out.nodes = len(rm.graph.nodes)
    out.budget, out.autodiff_peak = rep["budget"], rep["autodiff_peak"]
    out.predicted_peak = rep["predicted_peak"]
    return rm


def check_case(case: Case, budget: float = 0.5, catch: bool = False, measure: bool = True,
               **overrides: Any) -> Outcome:
    """The whole check on ``case``; ``overrides`` go to ``HRockmate`` (e.g. ``cache_dir``)."""
    out = Outcome(case.name)
    try:
        model, sample, loss_fn = case.build()
    except Unavailable as exc:
        out.status, out.stage, out.error = "skipped", "build", str(exc)
        return out
    stage = "eager"
    try:
        before = snapshot(model)
        eager_loss, eager_grads, eager_buffers = training_step(model, model, sample, loss_fn)
        restore(model, before)
        stage = "build"
        before = snapshot(model)
        try:
            rm = build(model, sample, budget, out, **overrides)
        finally:
            out.state_changed = differences(before, model)
        if case.expect is not None:
            out.status, out.error = "no-expected-error", f"expected {case.expect[0]}, got none"
            return out
        stage = "hiremate"
        loss, grads, buffers = training_step(rm, model, sample, loss_fn)
        out.loss_error = relative_error(loss, eager_loss)
        out.none_mismatch = [n for n in eager_grads
                             if (eager_grads[n] is None) != (grads.get(n) is None)]
        out.grad_errors = {n: relative_error(grads[n], g) for n, g in eager_grads.items()
                           if g is not None and grads.get(n) is not None}
        out.grad_error = max([out.loss_error, *out.grad_errors.values()])
        out.step_state_error = max([relative_error(buffers[k].double(), v.double())
                                    for k, v in eager_buffers.items()], default=0.0)
        restore(model, before)
        if measure:
            stage = "measure"
            args, kwargs = normalise_sample(sample)
            m = hiremate.measure(rm, *args, loss_fn=loss_fn, repeats=1, warmup=1, **kwargs)
            out.measured_peak = m.peak
            restore(model, before)
    except Exception as exc:
        if case.expect is not None and stage == "build":
            cls, pattern = case.expect
            if type(exc).__name__ == cls and re.search(pattern, str(exc)):
                out.status, out.error = "expected-error", first_line(exc)
                return out
        if not catch:
            raise
        out.status, out.stage, out.error = "error", stage, first_line(exc)
    return out
