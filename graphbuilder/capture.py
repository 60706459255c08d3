"""Capture a model's forward and backward as one flat ATen graph (the *joint* graph).

Paths, tried in order until one succeeds (DESIGN.md, "Capture"):

1. ``make_fx``: ``make_fx`` (fake tensors) traces a function that runs the original module
   functionally and calls ``torch.autograd.grad``; the fastest path (about half the time of
   the next one on GPT2).
2. ``export``: ``torch.export.export(strict=False)`` first flattens the model into ATen (it
   copes with Python-level checks that fake tensors alone trip on), then the same joint tracing
   runs on the exported module.

During tracing, hooks on the autograd graph (the ones AOTAutograd uses) tag every backward op
with the ``seq_nr`` of the forward op it differentiates; that is how backward ops are paired
with forward ops. Parameters are deduplicated (tied weights appear once).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from hiremate.errors import GraphCaptureError

log = logging.getLogger(__name__)


@dataclass
class JointCapture:
    """The traced joint graph and what each of its placeholders and outputs means."""

    gm: torch.fx.GraphModule
    path: str
    param_names: list[str]             # placeholders, in order, for parameters needing grad
    frozen_names: list[str]            # parameters that need no grad (treated as buffers)
    buffer_names: list[str]
    input_paths: list[str]             # pytree key path of each tensor leaf of (args, kwargs)
    input_requires_grad: list[bool]
    tangent_for_output: list[int]      # index in the flat outputs of each tangent placeholder
    n_outputs: int                     # flat outputs of the model (tensor or not)
    last_forward: str                  # name of the last fx node traced before the backward
    output_spec: Any = None            # pytree spec of the model's output
    input_spec: Any = None             # pytree spec of (args, kwargs)
    constants: dict[int, Any] = field(default_factory=dict)  # non-tensor leaves of (args, kwargs)


def normalise_sample(sample: Any) -> tuple[tuple, dict]:
    """A tensor, a tuple of positional arguments, or a dict of keyword arguments."""
    if isinstance(sample, dict):
        return (), dict(sample)
    if isinstance(sample, (tuple, list)):
        return tuple(sample), {}
    return (sample,), {}


def capture(model: torch.nn.Module, sample: Any) -> JointCapture:
    """Trace ``model`` on ``sample``; raise :class:`GraphCaptureError` naming every failed path."""
    args, kwargs = normalise_sample(sample)
    attempts: dict[str, str] = {}
    for path in ("make_fx", "export"):
        try:
            if path == "export":
                exported = torch.export.export(model, args, kwargs=kwargs, strict=False)
                module = exported.module()
            else:
                module = model
            result = _trace_joint(module, model, args, kwargs, path)
            log.info("captured %s with the %s path", type(model).__name__, path)
            return result
        except GraphCaptureError:
            raise
        except Exception as exc:  # every failure of a path is reported, none is fatal alone
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            attempts[path] = f"{type(exc).__name__}: {first_line[:300]}"
            log.debug("capture path %s failed", path, exc_info=True)
    tried = "; ".join(f"{p}: {why}" for p, why in attempts.items())
    raise GraphCaptureError(
        f"could not capture {type(model).__name__}: every capture path failed ({tried}). "
        "Models whose Python control flow depends on tensor values cannot be traced; rewrite "
        "that branch with torch.where / torch.cond, or wrap only the traceable part",
        attempts=attempts,
    )


def _trace_joint(module: torch.nn.Module, original: torch.nn.Module, args: tuple,
                 kwargs: dict, path: str) -> JointCapture:
    from torch._functorch._aot_autograd.logging_utils import (
        setup_stacktrace_preservation_hooks_from_tensors,
    )

    named = dict(module.named_parameters(remove_duplicate=True))
    params = {k: v for k, v in named.items() if v.requires_grad}
    frozen = {k: v.detach() for k, v in named.items() if not v.requires_grad}
    buffers = dict(module.named_buffers(remove_duplicate=True))
    original_names = {n for n, _ in original.named_parameters(remove_duplicate=False)}
    missing = [n for n in params if n not in original_names]
    if missing:
        raise RuntimeError(f"captured parameters {missing[:3]} do not match the model's names")

    leaves, in_spec = pytree.tree_flatten_with_path((args, kwargs))
    tensor_pos = [i for i, (_, v) in enumerate(leaves) if isinstance(v, torch.Tensor)]
    constants = {i: v for i, (_, v) in enumerate(leaves) if not isinstance(v, torch.Tensor)}
    input_tensors = [leaves[i][1] for i in tensor_pos]
    input_paths = [pytree.keystr(leaves[i][0]) for i in tensor_pos]
    needs_grad = [t.requires_grad and t.is_floating_point() for t in input_tensors]
    spec = pytree.tree_structure((args, kwargs))

    def rebuild(tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
        values = [leaves[i][1] for i in range(len(leaves))]
        for pos, t in zip(tensor_pos, tensors):
            values[pos] = t
        return pytree.tree_unflatten(values, spec)

    # outputs' shapes and differentiability, from one eager run that changes nothing
    probe_buffers = {k: v.clone() for k, v in buffers.items()}
    with torch.random.fork_rng(devices=_devices(input_tensors, params)):
        a, k = rebuild([t.detach().requires_grad_(g) for t, g in zip(input_tensors, needs_grad)])
        out = torch.func.functional_call(module, ({**params, **frozen}, probe_buffers), a, k,
                                         tie_weights=True)
    flat_out, out_spec = pytree.tree_flatten(out)
    diff = [i for i, o in enumerate(flat_out)
            if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
    if not diff:
        raise GraphCaptureError(
            f"no output of {type(original).__name__} needs a gradient: nothing to train, so "
            "nothing to rematerialise; check that parameters have requires_grad=True"
        )
    tangents = [torch.zeros_like(flat_out[i]).detach() for i in diff]
    del out, flat_out

    marker: dict[str, str] = {}
    wrt_inputs = [i for i, g in enumerate(needs_grad) if g]

    def joint(p: dict, f: dict, b: dict, ins: list, tans: list):
        ins = [t.detach().requires_grad_(g) if g else t for t, g in zip(ins, needs_grad)]
        a, k = rebuild(ins)
        out = torch.func.functional_call(module, ({**p, **f}, b), a, k, tie_weights=True)
        flat = pytree.tree_leaves(out)
        roots = [flat[i] for i in diff]
        mode = get_proxy_mode()
        if mode is not None:
            marker["last"] = next(reversed(mode.tracer.graph.nodes)).name
        setup_stacktrace_preservation_hooks_from_tensors(roots)
        wrt = list(p.values()) + [ins[i] for i in wrt_inputs]
        grads = torch.autograd.grad(roots, wrt, tans, allow_unused=True)
        return flat, list(grads)

    # functional_call swaps tensors in and out of the modules; with a submodule registered
    # under two names, tracing left fake tensors in the user's model: put back every one
    held = [(m, table, name, t) for m in module.modules()
            for table in (m._parameters, m._buffers) for name, t in list(table.items())]
    try:
        with torch.fx.traceback.preserve_node_meta():
            gm = make_fx(joint, tracing_mode="fake", _allow_non_fake_inputs=True)(
                params, frozen, buffers, input_tensors, tangents
            )
    finally:
        for m, table, name, t in held:
            if table.get(name) is not t:
                table[name] = t
    if "last" not in marker:
        raise RuntimeError("could not locate the end of the forward in the traced graph")
    return JointCapture(
        gm=gm, path=path, param_names=list(params), frozen_names=list(frozen),
        buffer_names=list(buffers), input_paths=input_paths, input_requires_grad=needs_grad,
        tangent_for_output=diff, n_outputs=out_spec.num_leaves,
        last_forward=marker["last"], output_spec=out_spec, input_spec=spec, constants=constants,
    )


def _devices(tensors: list[torch.Tensor], params: dict) -> list[int]:
    cuda = {t.device.index or 0 for t in list(tensors) + list(params.values())
            if isinstance(t, torch.Tensor) and t.is_cuda}
    return sorted(cuda)
