"""The ``roofline`` cost model: op times from FLOPs and bytes, with coefficients fitted on
this machine once and cached.

An op of class ``c`` (:data:`~hiremate.graphbuilder.costs.analytic.OP_CLASSES`) is predicted
to take ``per_op[c] + per_flop[c] * FLOPs + per_byte[c] * bytes``. The coefficients come from a
short calibration: a fixed set of small programs (matrix products, convolutions with their
backward, elementwise and normalisation ops, at several sizes) traced to ATen ops and timed
the way the ``measured`` model times ops (interleaved rounds, the minimum; thread CPU time with
one intra-op thread, see :func:`~hiremate.graphbuilder.costs.timing.cpu_clock`), then fitted by
non-negative least squares on relative error. The fit is stored under the cache directory,
keyed by what decides it (CPU model or GPU name, thread count, torch version, dtype), so every
later build on this machine uses the same numbers: two builds of one model give identical
times, however busy the machine is when they run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from hiremate.errors import FormatError
from hiremate.graphbuilder.costs.analytic import (CALIBRATED_ELEMENTWISE, FIXED_MACHINE,
                                                  OP_CLASSES, bytes_moved, flops_of, op_class)
from hiremate.graphbuilder.costs.timing import device_clock, time_in_place, time_nodes
from hiremate.paths import exclusive_lock

log = logging.getLogger(__name__)

FORMAT = 9  # 9: transcendental and random ops in classes of their own (8: pointwise
# convolutions, batch norms, reductions and FFTs)
#: interleaved timing rounds of the calibration programs (the fastest of each op is kept: on a
#: shared virtual machine the host's bursts of other work can outlast several rounds)
CALIBRATION_ROUNDS = 11


@dataclass(frozen=True)
class RooflineFit:
    """Per class: (seconds per op, seconds per FLOP, seconds per byte moved); ``scale`` and
    ``dispatch``: how a training step relates to its ops timed one by one, ``step = scale *
    sum(times of the ops that are not views) + dispatch * those ops + sum(times of the
    views)``, from whole small models run eagerly. ``scale`` covers what grows with the work
    (caches the previous ops left cold, fresh allocations), ``dispatch`` what each op pays
    around it (Python, autograd's engine, module calls). A view is its class's per-op time
    alone, taken warm (back-to-back calls): most views of a step are made in C++ by autograd
    and composite ops, without the cold Python call that timing it in place would charge."""

    coefficients: dict[str, tuple[float, float, float]]
    fingerprint: dict[str, Any]
    dispatch: float = 0.0
    scale: float = 1.0

    def time(self, node: torch.fx.Node, flops: float | None = None) -> float:
        kind = op_class(node)
        if kind is None:
            return 0.0
        if kind == "view":
            return self.coefficients[kind][0]
        per_op, per_flop, per_byte = self.coefficients[kind]
        count = flops_of(node) if flops is None else flops
        return self.dispatch + self.scale * (per_op + per_flop * count
                                             + per_byte * bytes_moved(node))

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "fingerprint": self.fingerprint, "dispatch": self.dispatch,
                "scale": self.scale,
                "coefficients": {k: list(v) for k, v in self.coefficients.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RooflineFit":
        if data.get("format") != FORMAT or set(data["coefficients"]) != set(OP_CLASSES):
            raise FormatError("not a roofline fit of this format")
        coefficients = {k: tuple(float(x) for x in v) for k, v in data["coefficients"].items()}
        if any(len(v) != 3 or min(v) < 0 for v in coefficients.values()):
            raise FormatError("malformed roofline coefficients")
        dispatch = float(data["dispatch"])
        if not dispatch >= 0:
            raise FormatError("malformed roofline dispatch time")
        scale = float(data["scale"])
        if not scale > 0:
            raise FormatError("malformed roofline step scale")
        return cls(coefficients, dict(data["fingerprint"]), dispatch, scale)


def machine_fingerprint(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """What a fit depends on: the processor (or GPU), the threads torch uses, torch, dtype."""
    if device.type == "cuda":
        processor = torch.cuda.get_device_name(device)
    else:
        processor = _cpu_model() or platform.processor() or platform.machine()
    return {"device": device.type, "processor": processor, "machine": platform.machine(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "dtype": str(dtype)}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def fit_path(cache_dir: Path, fingerprint: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / "roofline" / f"{digest}.json"


def load_or_fit(device: torch.device, dtype: torch.dtype, cache_dir: Path) -> RooflineFit:
    """This machine's fit for ``dtype`` on ``device``: from the cache, else calibrated now
    (a few seconds) and stored there. Processes that find no fit at once (DDP ranks, a sweep's
    workers, parallel test workers) take turns: one calibrates, the others wait and read its
    fit, so they share its numbers, and no calibration is timed beside another one."""
    fingerprint = machine_fingerprint(device, dtype)
    path = fit_path(cache_dir, fingerprint)
    fit = _stored_fit(path, fingerprint)
    if fit is not None:
        return fit
    with exclusive_lock(path.with_suffix(".lock")):
        fit = _stored_fit(path, fingerprint)  # another process may have fitted it meanwhile
        return fit if fit is not None else _fit_and_store(device, dtype, path, fingerprint)


def _stored_fit(path: Path, fingerprint: dict[str, Any]) -> RooflineFit | None:
    try:
        fit = RooflineFit.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return fit if fit.fingerprint == fingerprint else None


def _fit_and_store(device: torch.device, dtype: torch.dtype, path: Path,
                   fingerprint: dict[str, Any]) -> RooflineFit:
    start = time.perf_counter()
    fit = calibrate(device, dtype)
    log.info("fitted the roofline cost model for %s in %.1fs: %s", fingerprint["processor"],
             time.perf_counter() - start, fit.coefficients)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(fit.to_dict(), indent=1))
        tmp.replace(path)  # atomic: concurrent builds never read half a file
    except OSError as exc:
        log.warning("could not store the roofline fit at %s (%s); the next build fits again",
                    path, exc)
    return fit


# -- calibration ------------------------------------------------------------------------------
def _programs() -> list[tuple[Callable[..., Any], list[tuple[int, ...]], bool]]:
    """Small programs (a function, the shapes of its arguments, all differentiated, and whether
    it is a small model whose eager step measures the per-op dispatch) whose ATen ops span the
    classes and sizes of the models we schedule."""
    def linear_step(x, w, b):
        y = F.linear(x, w, b)
        return torch.autograd.grad(F.gelu(y).sum(), (x, w, b))

    def batched(a, b):
        return torch.autograd.grad(torch.bmm(a, b).softmax(-1).sum(), (a, b))

    def conv_step(x, w):
        y = _conv(x, w)
        return torch.autograd.grad(torch.relu(y).sum(), (x, w))

    def strided_conv_step(x, w):  # downsampling, as in residual shortcuts and stems
        y = _conv(x, w, stride=2)
        return torch.autograd.grad(torch.relu(y).sum(), (x, w))

    def spectral_step(x, wr, wi):  # a Fourier layer, as in neural operators
        dims = tuple(range(2, x.dim()))
        modes = tuple(slice(0, m) for m in wr.shape[2:])
        spectrum = torch.fft.rfftn(x, dim=dims)[(..., *modes)]
        mixed = torch.einsum("bi...,io...->bo...", spectrum, torch.complex(wr, wi))
        y = torch.fft.irfftn(mixed, s=x.shape[2:], dim=dims)
        return torch.autograd.grad(F.gelu(y).square().sum(), (x, wr, wi))

    def norm_step(x, w, b):
        y = F.layer_norm(x, x.shape[-1:], w, b)
        return torch.autograd.grad((y * x).tanh().sum(), (x, w, b))

    def activation_step(x):  # activations and softmaxes (CALIBRATED_ELEMENTWISE)
        y = torch.tanh(x) + torch.sigmoid(x) + F.silu(x) + F.gelu(x) + torch.erf(x)
        attention = torch.ops.aten._safe_softmax.default(x, -1)  # SDPA's math path
        return torch.autograd.grad((y.exp() * x.softmax(-1) * attention).sum(), (x,))

    def dropout_step(x):  # dropout's mask as a captured graph has it: a functional draw
        mask = torch.ops.aten.bernoulli.p(torch.empty_like(x), 0.9)
        return torch.autograd.grad((x * mask).sum(), (x,))

    def batch_norm_step(x, w, b):
        y = F.batch_norm(x, None, None, w, b, training=True)
        z = F.max_pool2d(torch.relu(y), 2)
        return torch.autograd.grad(F.interpolate(z, scale_factor=2.0).sum(), (x, w, b))

    def mlp_stack(x, w1, w2, g, b):  # residual blocks with layer norm, as in transformers
        for _ in range(3):
            h = F.layer_norm(x, x.shape[-1:], g, b)
            x = x + F.linear(F.gelu(F.linear(h, w1)), w2)
        return torch.autograd.grad(x.square().mean(), (x, w1, w2, g, b))

    def conv_stack(x, w1, w2, g, b):  # residual conv blocks with batch norm, as in ResNets
        for _ in range(3):
            h = torch.relu(F.batch_norm(_conv(x, w1), None, None, g, b, training=True))
            x = x + F.batch_norm(_conv(h, w2), None, None, g, b, training=True)
        return torch.autograd.grad(torch.relu(x).mean(), (x, w1, w2, g, b))

    def attention(x, wq, wk, wv):
        batch, tokens, width = x.shape
        q, k, v = (F.linear(x, w).view(batch, tokens, 4, -1).transpose(1, 2)
                   for w in (wq, wk, wv))
        scores = (q @ k.transpose(-1, -2) / (width // 4) ** 0.5).softmax(-1)
        out = (scores @ v).transpose(1, 2).reshape(batch, tokens, width)
        return torch.autograd.grad(out.square().mean(), (x, wq, wk, wv))

    models: list[tuple[Callable[..., Any], list[tuple[int, ...]]]] = []
    for rows, width in ((64, 64), (256, 128), (512, 256)):
        models.append((mlp_stack, [(rows, width), (4 * width, width), (width, 4 * width),
                                   (width,), (width,)]))
    for n, c, hw in ((2, 8, 32), (4, 16, 16), (2, 32, 16)):
        models.append((conv_stack, [(n, c, hw, hw), (c, c, 3, 3), (c, c, 3, 3), (c,), (c,)]))
    for batch, tokens, width in ((2, 64, 64), (4, 128, 128)):
        models.append((attention, [(batch, tokens, width)] + [(width, width)] * 3))
    programs: list[tuple[Callable[..., Any], list[tuple[int, ...]]]] = []
    for m, k, n in ((32, 32, 32), (64, 256, 64), (128, 128, 128), (256, 512, 256),
                    (512, 512, 512), (1024, 256, 1024), (2048, 128, 512)):
        programs.append((linear_step, [(m, k), (n, k), (n,)]))
    for b, m, k, n in ((16, 128, 64, 128), (8, 256, 32, 256), (32, 64, 64, 64)):
        programs.append((batched, [(b, m, k), (b, k, n)]))
    for x, w in (((4, 3, 32, 32), (16, 3, 3, 3)), ((4, 16, 32, 32), (32, 16, 3, 3)),
                 ((4, 32, 16, 16), (64, 32, 3, 3)), ((2, 64, 16, 16), (64, 64, 1, 1)),
                 ((8, 8, 64, 64), (8, 8, 3, 3)), ((2, 128, 8, 8), (128, 128, 3, 3)),
                 ((4, 32, 256), (32, 32, 1)), ((2, 8, 8, 16, 16), (8, 8, 1, 1, 1)),
                 # grouped (the weight's input channels a fraction of the input's)
                 ((2, 32, 32, 32), (32, 16, 3, 3)), ((4, 32, 16, 16), (32, 4, 3, 3)),
                 ((2, 256, 8, 8), (256, 16, 3, 3)), ((2, 64, 16, 16), (64, 1, 3, 3)),
                 # small maps and 1x1 maps (squeeze-excitation), where the fixed cost shows
                 ((2, 8, 8, 8), (8, 8, 3, 3)), ((2, 32, 1, 1), (8, 32, 1, 1)),
                 ((4, 8, 1, 1), (64, 8, 1, 1)), ((2, 64, 4, 4), (64, 64, 1, 1)),
                 ((2, 32, 32, 32), (32, 32, 1, 1))):
        programs.append((conv_step, [x, w]))
    for x, w in (((2, 16, 32, 32), (32, 16, 1, 1)), ((2, 64, 8, 8), (128, 64, 1, 1)),
                 ((2, 16, 32, 32), (32, 16, 3, 3)), ((4, 3, 32, 32), (16, 3, 3, 3))):
        programs.append((strided_conv_step, [x, w]))
    for x, w in (((4, 16, 128), (16, 16, 16)), ((2, 32, 512), (32, 32, 32)),
                 ((2, 8, 32, 32), (8, 8, 8, 8)), ((2, 4, 16, 16, 16), (4, 4, 4, 4, 4))):
        programs.append((spectral_step, [x, w, w]))
    for rows, cols in ((16, 64), (64, 256), (256, 512), (1024, 1024), (512, 4096)):
        programs.append((norm_step, [(rows, cols), (cols,), (cols,)]))
    for n, c, hw in ((2, 8, 16), (4, 16, 32), (8, 32, 32), (4, 64, 64)):
        programs.append((batch_norm_step, [(n, c, hw, hw), (c,), (c,)]))
    for rows, cols in ((16, 64), (64, 256), (256, 1024), (512, 2048)):
        programs.append((activation_step, [(rows, cols)]))
        programs.append((dropout_step, [(rows, cols)]))
    return [(f, shapes, True) for f, shapes in models] + [(f, s, False) for f, s in programs]


#: the coefficients fitted per class, where not all three: a view's time is its dispatch alone;
#: a reduction's "FLOPs" count its output elements, which says nothing of the pass over its
#: input (a bias gradient sums a large tensor into a small one)
_FREE = {"view": (0,), "reduce": (0, 2)}


#: classes whose per-element rates are fitted on top of the ``memory`` class's fixed cost: an
#: activation, a softmax or a random draw is an elementwise op like any other below a few
#: thousand elements, and timed inside the calibration programs a small one reads several
#: times its own cost in cold start that a model's step does not pay, which a free intercept
#: would charge to every such op (docs/benchmarks.md)
_ELEMENTWISE_RATES = ("random", "transcendental", *CALIBRATED_ELEMENTWISE)


def _elementwise_rate(rows: list[tuple[float, float, float]],
                      memory: tuple[float, float, float]) -> tuple[float, float, float]:
    """``(per_op, per_flop, per_byte)`` of an elementwise class: the ``memory`` class's fixed
    cost, and per-element and per-byte rates fitted to the samples where the work outweighs
    that cost (at least half of the time); the ``memory`` class's own figures without any."""
    fixed = memory[0]
    work = [(f, b, t - fixed) for f, b, t in rows if t - fixed >= 0.5 * t]
    if not work:
        return memory
    _, per_flop, per_byte = _nnls_relative(work, free=(1, 2))
    return fixed, per_flop, per_byte


def _conv(x: torch.Tensor, w: torch.Tensor, stride: int = 1) -> torch.Tensor:
    """A same-padded convolution of ``x`` by ``w``, with as many groups as the shapes say."""
    padding = w.shape[-1] // 2
    groups = x.shape[1] // w.shape[1]
    return {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()](x, w, padding=padding,
                                                            stride=stride, groups=groups)


def calibrate(device: torch.device, dtype: torch.dtype) -> RooflineFit:
    """Time the calibration programs' ops on ``device`` in ``dtype`` and fit every class."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in OP_CLASSES}
    nodes_all: list[torch.fx.Node] = []
    programs = []
    models = []
    with torch.random.fork_rng(devices=[]):
        for index, (fn, shapes, whole) in enumerate(_programs()):
            inputs = [torch.randn(s, generator=gen, dtype=dtype).to(device).requires_grad_()
                      for s in shapes]
            try:
                gm = make_fx(fn)(*inputs)
            except (RuntimeError, NotImplementedError) as exc:
                # an op without a kernel for this dtype here (CPU FFTs in bfloat16): a model
                # in this dtype cannot run it either, so its class needs no fit from it
                log.debug("roofline calibration: %s skipped in %s on %s (%s)", fn.__name__,
                          dtype, device.type, exc)
                continue
            for node in gm.graph.nodes:  # names unique across the programs
                node.name = f"p{index}_{node.name}"
            plain = [t.detach() for t in inputs]
            programs.append((gm, plain))
            if whole:
                models.append((fn, inputs, gm))
    times: dict[str, float] = {}
    for gm, plain in programs:
        time_in_place(gm, plain, 0, device)  # warm-up: lazy initialisation, first allocations
    for _ in range(CALIBRATION_ROUNDS):  # rounds interleaved over the programs (load bursts)
        for gm, plain in programs:
            for name, t in time_in_place(gm, plain, 1, device, warmup=False).items():
                times[name] = min(times.get(name, float("inf")), t)
    for gm, _ in programs:
        nodes_all += [n for n in gm.graph.nodes
                      if n.op == "call_function" and op_class(n) is not None]
    warm_views = _warm_view_times(programs, device)
    for node in nodes_all:
        kind = op_class(node)
        took = warm_views[node.name] if kind == "view" else times[node.name]
        samples[kind].append((flops_of(node), bytes_moved(node), took))
    for kind in CALIBRATED_ELEMENTWISE:  # the other transcendental ops: fitted on them all
        samples["transcendental"] += samples[kind]
    rate, bandwidth, per_op = FIXED_MACHINE["cuda" if device.type == "cuda" else "cpu"]
    coefficients = {}
    for kind, rows in samples.items():
        if kind in _ELEMENTWISE_RATES:
            continue
        free = _FREE.get(kind, (0, 1, 2))
        coefficients[kind] = (_nnls_relative(rows, free) if len(rows) >= len(free)
                              else (per_op, 1.0 / rate, 1.0 / bandwidth))
    for kind in _ELEMENTWISE_RATES:
        coefficients[kind] = _elementwise_rate(samples[kind], coefficients["memory"])
    fit = RooflineFit(coefficients, machine_fingerprint(device, dtype))
    scale, dispatch = _step_terms(fit, models, device)
    return dataclasses.replace(fit, dispatch=dispatch, scale=scale)


def _warm_view_times(programs: list[tuple[torch.fx.GraphModule, list[torch.Tensor]]],
                     device: torch.device) -> dict[str, float]:
    """The view ops of the programs, timed warm: back-to-back calls on the values one run
    of each program made, the fastest over interleaved rounds (see :class:`RooflineFit`)."""
    from hiremate.graphbuilder.costs.memory import node_args

    nodes: list[torch.fx.Node] = []
    env: dict[str, Any] = {}
    with torch.no_grad():
        for gm, plain in programs:
            values = iter(plain)
            for node in gm.graph.nodes:
                if node.op == "placeholder":
                    env[node.name] = next(values)
                elif node.op == "call_function":
                    args, kwargs = node_args(node, env)
                    env[node.name] = node.target(*args, **kwargs)
                    if op_class(node) == "view":
                        nodes.append(node)
    return time_nodes(nodes, env, CALIBRATION_ROUNDS, device)


def _step_terms(fit: RooflineFit,
                models: list[tuple[Callable[..., Any], list[torch.Tensor], torch.fx.GraphModule]],
                device: torch.device) -> tuple[float, float]:
    """``(scale, dispatch)`` of :class:`RooflineFit`: the fastest eager step of each small
    model, less its views' times, against the sum of the times ``fit`` gives its other ops
    and their count, fitted by non-negative least squares on relative error (a scale of 1 and
    no dispatch when nothing fits). The fitted times, not the timed ones: the step terms
    correct the whole predictor against real steps, the class fits' systematic errors on
    small ops included. (With the timed times the dispatch comes out near zero and every
    zoo step is under-predicted: functional programs pay less per op than modules do; see
    docs/benchmarks.md.)"""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock, cost = device_clock(device)
    best = [float("inf")] * len(models)
    for _ in range(CALIBRATION_ROUNDS + 1):  # interleaved; the first round warms up
        for i, (fn, inputs, _) in enumerate(models):
            sync()
            start = clock()
            fn(*inputs)
            sync()
            best[i] = min(best[i], clock() - start - cost)
    rows = []
    for (_, _, gm), eager in zip(models, best):
        ops = [n for n in gm.graph.nodes if n.op == "call_function" and op_class(n) is not None]
        work = [n for n in ops if op_class(n) != "view"]
        views = sum(fit.time(n) for n in ops if op_class(n) == "view")
        rows.append((sum(fit.time(n) for n in work), float(len(work)), max(eager - views, 1e-9)))
    if not rows:
        return 1.0, 0.0
    _, scale, dispatch = _nnls_relative(rows, free=(1, 2))
    return (scale, dispatch) if scale > 0 else (1.0, 0.0)


def _nnls_relative(rows: list[tuple[float, ...]], free: tuple[int, ...] = (0, 1, 2)
                   ) -> tuple[float, ...]:
    """Non-negative coefficients ``(c0, c1, ...)`` minimising the squared *relative* error of
    ``c0 + c1 * x1 + c2 * x2 + ...`` against ``t`` over the rows ``(x1, x2, ..., t)`` (per
    class: ``(per_op, per_flop, per_byte)`` from ``(flops, bytes, time)``): exact, by trying
    every subset of the ``free`` coefficients (the others stay 0)."""
    features = torch.tensor([[1.0, *row[:-1]] for row in rows], dtype=torch.float64)
    target = torch.tensor([row[-1] for row in rows], dtype=torch.float64).clamp_min(1e-9)
    weighted = features / target[:, None]
    scale = weighted.abs().amax(0).clamp_min(1e-30)  # columns of comparable size
    design = weighted / scale
    ones = torch.ones_like(target)
    width = features.shape[1]
    best, best_err = (0.0,) * width, float("inf")
    for size in range(1, len(free) + 1):
        for subset in itertools.combinations(free, size):
            cols = list(subset)
            sol = torch.linalg.lstsq(design[:, cols], ones[:, None]).solution[:, 0]
            if (sol < 0).any():
                continue
            coef = torch.zeros(width, dtype=torch.float64)
            coef[cols] = sol
            err = float(((design @ coef) - ones).square().sum())
            if err < best_err:
                best_err = err
                best = tuple(float(c) for c in coef / scale)
    return best
