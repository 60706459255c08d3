"""Capture a model's forward and backward as one flat ATen graph (the *joint* graph).

Paths, tried in order until one succeeds (docs/design.md, "Capture"):

1. ``make_fx``: ``make_fx`` (fake tensors) traces a function that runs the original module
   functionally and calls ``torch.autograd.grad``; the cheaper path, since nothing is exported
   first.
2. ``export``: ``torch.export.export(strict=False)`` first flattens the model into ATen (it
   copes with Python-level checks that fake tensors alone trip on), then the same joint tracing
   runs on the exported module.

During tracing, hooks on the autograd graph (the ones AOTAutograd uses) tag every backward op
with the ``seq_nr`` of the forward op it differentiates; that is how backward ops are paired
with forward ops. Parameters are deduplicated (tied weights appear once).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from hiremate.errors import ConfigError, GraphCaptureError
from hiremate.quiet import diverted_logger, diverted_stderr, log_once
from hiremate.graphbuilder.traceable import fixed_shape_kernels
from hiremate.graphbuilder.functionalise import functionalise
from hiremate.graphbuilder.outputs import opaque_outputs
from hiremate.graphbuilder.untouched import writes_undone
from hiremate.graphbuilder.guards import (BranchRecorder, Guard, check_static_sizes,
                                         failure_reason)

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
    guards: list[Guard] = field(default_factory=list)  # values the trace was specialised on
    #: where the forward first made a tensor of a value-dependent size (line, function)
    sized_by_values: tuple[str, str] | None = None
    # differentiable flat outputs given no tangent: the backward is assumed not to reach them
    untangented_outputs: list[int] = field(default_factory=list)


def writable_placeholders(names: list[str], first_input: int, needs_grad: list[bool]
                          ) -> set[str]:
    """Of a joint graph's placeholder ``names`` (parameters, buffers, then inputs from
    ``first_input``), those a forward may write, the executor replaying the write once per
    call as eager writes into the tensor: parameters (``nn.Embedding``'s ``max_norm``),
    buffers, and inputs that need no gradient (``x /= 255``)."""
    inputs = names[first_input:first_input + len(needs_grad)]
    return set(names[:first_input]) | {n for n, g in zip(inputs, needs_grad) if not g}


def normalise_sample(sample: Any) -> tuple[tuple, dict]:
    """A tensor, a tuple of positional arguments, or a mapping of keyword arguments (a dict, or
    a tokenizer's ``BatchEncoding``, which is a mapping but not a dict)."""
    if isinstance(sample, Mapping):
        return (), dict(sample)
    if isinstance(sample, (tuple, list)):
        return tuple(sample), {}
    return (sample,), {}


#: which differentiable outputs get a tangent: ``all``, or ``scalars`` (when some are 0-dim
#: beside others, only those, by name ``loss`` in named outputs: :func:`_loss_outputs`; a model
#: that returns its loss with its logits is trained from the loss, and a tangent for the
#: logits would be an output-sized zero held by the backward)
OUTPUT_GRADIENTS = ("all", "scalars")


def capture(model: torch.nn.Module, sample: Any, output_gradients: str = "all") -> JointCapture:
    """Trace ``model`` on ``sample``; raise :class:`GraphCaptureError` naming every failed path.
    ``output_gradients``: see :data:`OUTPUT_GRADIENTS`."""
    if output_gradients not in OUTPUT_GRADIENTS:
        raise ConfigError(f"output_gradients must be one of {', '.join(OUTPUT_GRADIENTS)}, got "
                          f"{output_gradients!r}")
    scripted = [name or type(model).__name__ for name, m in model.named_modules()
                if isinstance(m, torch.jit.ScriptModule)]
    if scripted:
        raise GraphCaptureError(
            f"{type(model).__name__} holds TorchScript modules ({', '.join(scripted[:3])}): "
            "hiremate captures eager PyTorch, and a scripted module runs as one opaque "
            "program. Build the wrapper from the module as written, before torch.jit.script",
            attempts={"make_fx": "TorchScript module", "export": "TorchScript module"})
    args, kwargs = training_call(model, *normalise_sample(sample))
    attempts: dict[str, str] = {}
    with (plain_checkpoints(type(model).__name__), _unvalidated_distributions(model),
          _tensor_hooks_noted(model), _own_conversions_checked(model), fixed_shape_kernels(),
          diverted_logger("torch", "torch's log during capture")):
        for path in ("make_fx", "export"):
            try:
                with _foreign_randomness_check(model):
                    if path == "export":
                        module = _exported(model, args, kwargs)
                    else:
                        module = model
                    result = _trace_joint(module, model, args, kwargs, path,
                                          output_gradients)
                # after the draws outside torch are checked: a SpecAugment mask is one cause
                check_static_sizes(result.gm, result.sized_by_values)
                log.info("captured %s with the %s path", type(model).__name__, path)
                return result
            except Exception as exc:  # every failure of a path is reported, none is fatal alone
                attempts[path] = failure_reason(exc)
                log.debug("capture path %s failed", path, exc_info=True)
    tried = "; ".join(f"{p}: {why}" for p, why in attempts.items())
    if len(attempts) > 1 and len(set(attempts.values())) == 1:  # the same cause, said once
        tried = f"every path: {next(iter(attempts.values()))}"
    if isinstance(sample, list) and "positional argument" in tried:
        tried += ("; the sample is a list, which gives the positional arguments as a tuple "
                  "does: pass ([...],) for a forward that takes the list as one argument")
    raise GraphCaptureError(
        f"could not capture {type(model).__name__}: every capture path failed ({tried})",
        attempts=attempts,
    )


def _exported(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.nn.Module:
    """``torch.export`` of ``model`` as a module, its warnings logged, not shown: the export
    path is the capture's own fallback (an RNN's flat weights made it warn to the user about
    attributes the user never assigned). A failed export prints its partial graph to stderr;
    that goes to the debug log too."""
    with warnings.catch_warnings(record=True) as caught, diverted_stderr("torch.export"):
        warnings.simplefilter("always")
        exported = torch.export.export(model, args, kwargs=kwargs, strict=False)
    for warning in caught:
        log.debug("torch.export warned: %s", warning.message)
    return exported.module()


@contextlib.contextmanager
def _unvalidated_distributions(model: torch.nn.Module) -> Iterator[None]:
    """Capture with ``torch.distributions``' argument checks off, and log it when the model made
    a distribution.

    A distribution made with the default ``validate_args`` checks its parameters' values
    (``constraint.check(value).all()`` on, say, the scale of a VAE's ``Normal``): a branch on
    an activation, which a captured program cannot hold. The check only decides whether to
    raise, never what is computed, so the captured program runs without it, as under
    ``python -O`` or ``Distribution.set_default_validate_args(False)``."""
    from torch.distributions import Distribution

    default = Distribution._validate_args
    made: list[str] = []
    original = Distribution.__init__

    def counting(self, *args, **kwargs):
        made.append(type(self).__name__)
        original(self, *args, **kwargs)

    # entered inside plain_checkpoints, which holds _PATCH_LOCK through the capture
    Distribution.set_default_validate_args(False)
    Distribution.__init__ = counting
    try:
        yield
    finally:
        Distribution.__init__ = original
        Distribution.set_default_validate_args(default)
    if made and default:
        log.info("%s makes torch.distributions objects (%s): captured without their argument "
                 "checks, which test activations' values; the wrapper runs without them",
                 type(model).__name__, ", ".join(sorted(set(made))))


@contextlib.contextmanager
def _tensor_hooks_noted(model: torch.nn.Module) -> Iterator[None]:
    """Warn when the forward registers gradient hooks on its tensors (``h.register_hook``): the
    traced backward holds what they return (a scaled gradient), but what else they do (keeping
    a gradient for Grad-CAM) happens once, while capturing, and never in a call."""
    registered: list[int] = []
    original = torch.Tensor.register_hook

    def counting(self, hook):
        registered.append(1)
        return original(self, hook)

    torch.Tensor.register_hook = counting  # under plain_checkpoints' lock, as above
    try:
        yield
    finally:
        torch.Tensor.register_hook = original
    if registered:
        log.warning("the forward of %s registers gradient hooks on its tensors: the captured "
                    "backward holds what they return, but what else they do (keeping a "
                    "gradient) happened once, while capturing, and does not happen in calls",
                    type(model).__name__)


@contextlib.contextmanager
def _own_conversions_checked(model: torch.nn.Module) -> Iterator[None]:
    """Let a forward's ``module.to(...)`` that changes nothing pass, and refuse one that would
    convert the module's own tensors, naming it. Why: Switch Transformers' router calls
    ``self.classifier.to(float32)`` in every forward; on traced parameters even that no-op
    failed in torch's ``_apply`` ("Couldn't swap Linear.weight")."""
    original, names = torch.nn.Module.to, {id(m): n for n, m in model.named_modules()}

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        device, dtype = torch._C._nn._parse_to(*args, **kwargs)[:2]
        for t in [*self.parameters(), *self.buffers()]:
            moved = device is not None and (t.device.type != device.type or (
                device.index is not None and t.device.index != device.index))
            cast = dtype is not None and t.dtype != dtype and (t.is_floating_point()
                                                               or t.is_complex())
            if moved or cast:
                raise GraphCaptureError(
                    f"the forward of {type(model).__name__} converts its own submodule "
                    f"{names.get(id(self), type(self).__name__)!r} to {dtype or device} with "
                    ".to(...): a traced program cannot change its parameters; convert that "
                    "submodule so before building the wrapper (then the call changes nothing)")
        return self

    torch.nn.Module.to = to  # under plain_checkpoints' lock, as above
    try:
        yield
    finally:
        torch.nn.Module.to = original


@contextlib.contextmanager
def _foreign_randomness_check(model: torch.nn.Module) -> Iterator[None]:
    """Fail a capture whose forward draws random numbers outside torch (numpy's or Python's
    global generators), and put both generators back as they were.

    torch's random ops are recorded and replayed; a draw made in Python or numpy becomes a
    constant of the traced program, so every call would reuse the sample's draw where the model
    draws anew (Hugging Face Wav2Vec2's SpecAugment masks come from numpy)."""
    import random

    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy ships with torch's dependencies
        numpy = None
    py_state = random.getstate()
    np_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        drew = random.getstate() != py_state or (
            numpy is not None and not _same_numpy_state(numpy.random.get_state(), np_state))
        random.setstate(py_state)
        if numpy is not None:
            numpy.random.set_state(np_state)
    if drew:
        config = getattr(model, "config", None)
        hint = ""
        if getattr(config, "mask_time_prob", 0) or getattr(config, "mask_feature_prob", 0):
            hint = (" This is Hugging Face SpecAugment (random time/feature masks drawn with "
                    "numpy): set mask_time_prob=0.0 and mask_feature_prob=0.0 in the model's "
                    "config, or apply the masking to the inputs outside the model.")
        raise GraphCaptureError(
            f"the forward of {type(model).__name__} draws random numbers with numpy or Python's "
            "random module: the draw would become a constant of the captured program, and "
            "every call would reuse the sample's. Draw them with torch (torch.rand, "
            f"torch.bernoulli), whose draws hiremate replays, or outside the model.{hint}")


def _same_numpy_state(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and bool((a[1] == b[1]).all()) and tuple(a[2:]) == tuple(b[2:])


def training_call(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call to capture for training: a model with a ``use_cache`` switch (Hugging Face) that
    the caller left unset runs with ``use_cache=False``. A key/value cache only serves
    generation; in training it is an output that needs no gradient, holds every layer's keys
    and values alive, and is not a tensor. Everything that runs the model on the caller's
    behalf (capture, the output structure) goes through this function, so the wrapper's
    outputs are those of this call."""
    if "use_cache" in kwargs:
        return args, kwargs
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return args, kwargs
    if "use_cache" not in params:
        return args, kwargs
    names = list(params)
    if names.index("use_cache") < len(args):  # passed positionally
        return args, kwargs
    log_once(log, f"use_cache:{type(model).__name__}", logging.INFO,
             "%s has a use_cache switch: capturing with use_cache=False (a key/value cache "
             "is for generation, not training)", type(model).__name__)
    return args, {**kwargs, "use_cache": False}


_PATCH_LOCK = threading.Lock()


class _PlainReentrantCheckpoint:
    """Stands in for ``torch.utils.checkpoint.CheckpointFunction`` while capturing: the wrapped
    function runs as plain code, so its ops are traced with their gradients."""

    calls = 0

    @classmethod
    def apply(cls, function: Any, preserve_rng_state: bool, *args: Any) -> Any:
        cls.calls += 1
        return function(*args)


def _plain_non_reentrant(function: Any, preserve_rng_state: bool, *rest: Any,
                         **kwargs: Any) -> Iterator[None]:
    """Stands in for the non-reentrant checkpoint's context generator: no saved-tensor hooks
    (which would re-run the function with the real weights during the traced backward)."""
    _PlainReentrantCheckpoint.calls += 1
    yield  # checkpoint() runs the function here, and expects the generator to end after it


_capturing = threading.local()


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Mark this thread as capturing a model: a hiremate wrapper met inside the model (a
    submodule wrapped before the whole was) then runs its model's plain forward, so that the
    capture records the model's ops instead of tracing the wrapper's executor."""
    _capturing.depth = getattr(_capturing, "depth", 0) + 1
    try:
        yield
    finally:
        _capturing.depth -= 1


def is_capturing() -> bool:
    """Whether this thread is inside :func:`capturing`."""
    return getattr(_capturing, "depth", 0) > 0


@contextlib.contextmanager
def plain_checkpoints(model_name: str, announce: bool = True) -> Iterator[None]:
    """Run ``torch.utils.checkpoint`` inside the model as the computation it wraps.

    A model that already checkpoints would otherwise trace badly: the reentrant form runs its
    function under ``no_grad`` (nothing below it gets a gradient), the non-reentrant form
    re-runs it from the backward with the real weights. hiremate's schedule decides what to
    recompute, so the model's own checkpoints are dropped while capturing. The two entry
    points that both forms reach (also through ``functools.partial(checkpoint)``, as Hugging
    Face models hold it) are replaced for the duration, under a lock.
    """
    import torch.utils.checkpoint as ckpt

    names = ("CheckpointFunction", "_checkpoint_without_reentrant_generator")
    if not all(hasattr(ckpt, n) for n in names):  # another torch layout: leave it alone
        yield
        return
    with _PATCH_LOCK:
        saved = {n: getattr(ckpt, n) for n in names}
        before = _PlainReentrantCheckpoint.calls
        ckpt.CheckpointFunction = _PlainReentrantCheckpoint
        ckpt._checkpoint_without_reentrant_generator = _plain_non_reentrant
        try:
            yield
        finally:
            for n, v in saved.items():
                setattr(ckpt, n, v)
            if announce and _PlainReentrantCheckpoint.calls > before:
                log.info("%s calls torch.utils.checkpoint: captured as the computation it "
                         "wraps (hiremate's schedule decides what to recompute)", model_name)


@contextlib.contextmanager
def _autograd_inside_backward_refused(model_name: str) -> Iterator[Any]:
    """While the capture differentiates the model (it calls the ``torch.autograd.grad``
    yielded), refuse ``torch.autograd.backward`` or ``grad`` called from a custom
    ``torch.autograd.Function``'s backward: a layer run again and differentiated by hand
    (Reformer's reversible layers, hand-made reentrant checkpoints). Such a backward adds to
    the parameters' ``.grad`` as a side effect, which no traced program holds, and reads them
    after the capture has put the real ones back (Reformer's trace then held them as constants,
    and the build ended in a ``KeyError``). Refused, the make_fx path leaves the model to the
    export path, which traces the Function's forward as plain ops. Other calls (torch's own
    re-dispatch of the capture's call) pass through."""
    real = {"backward": torch.autograd.backward, "grad": torch.autograd.grad}

    def guarded(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if _inside_custom_backward():
                raise GraphCaptureError(
                    f"{model_name} runs autograd inside a backward (torch.autograd.{name} "
                    "called by a custom torch.autograd.Function's backward: a layer recomputed "
                    "and differentiated by hand, as reversible layers and hand-made checkpoints "
                    "do); the gradients it adds to parameters as a side effect cannot be "
                    "captured. Use torch.utils.checkpoint instead (hiremate captures it as "
                    "plain code and decides what to recompute), or wrap a model without such a "
                    "Function")
            return real[name](*args, **kwargs)
        return call

    torch.autograd.backward, torch.autograd.grad = guarded("backward"), guarded("grad")
    try:
        yield real["grad"]
    finally:
        torch.autograd.backward, torch.autograd.grad = real["backward"], real["grad"]


def _inside_custom_backward() -> bool:
    """Whether a caller up the stack, below the capture's own differentiation (``joint``), is
    the ``backward(ctx, ...)`` of a Function written outside torch. The frames above ``joint``
    are not the model's: a capture may itself run inside a backward (the executor's, when a
    backward through an output the graph gave no gradient builds the module again)."""
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "joint" and frame.f_globals.get("__name__") == __name__:
            return False
        if (code.co_name == "backward" and code.co_varnames[:1] == ("ctx",)
                and not frame.f_globals.get("__name__", "").startswith("torch")):
            return True
        frame = frame.f_back
    return False


def _distinct(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` as leaves, with every repeat of one tensor object replaced by a copy.
    Tracing turns each input into a fake tensor memoised by identity, so a sample that passes
    one tensor twice (``model(input_ids, labels=input_ids)``, the Hugging Face idiom) would
    become one graph input read in both places, and every later call would use the first
    argument for both. An input computed upstream (a wrapped submodule's, say) is detached:
    the capture needs its value and whether it needs a gradient, not its history (tracing
    reads ``.grad`` of its inputs, which on a non-leaf tensor warns)."""
    seen: set[int] = set()
    out = []
    for t in tensors:
        original = id(t)
        if original in seen:
            t = t.detach().clone().requires_grad_(t.requires_grad)
        elif not t.is_leaf:
            t = t.detach().requires_grad_(t.requires_grad)
        seen.add(original)
        out.append(t)
    return out


def _trace_joint(module: torch.nn.Module, original: torch.nn.Module, args: tuple,
                 kwargs: dict, path: str, output_gradients: str = "all") -> JointCapture:
    # the grad_fn form, which older releases have too (2.13's *_from_tensors wrapper, which
    # this used before, is not in 2.11)
    from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks

    named = dict(module.named_parameters(remove_duplicate=True))
    params = {k: v for k, v in named.items() if v.requires_grad}
    frozen = {k: v.detach() for k, v in named.items() if not v.requires_grad}
    buffers = dict(module.named_buffers(remove_duplicate=True))
    original_names = {n for n, _ in original.named_parameters(remove_duplicate=False)}
    missing = [n for n in params if n not in original_names]
    if missing:
        raise GraphCaptureError(f"captured parameters {missing[:3]} do not match the model's "
                                "parameter names, so this path cannot map them back to the model")

    leaves, in_spec = pytree.tree_flatten_with_path((args, kwargs))
    tensor_pos = [i for i, (_, v) in enumerate(leaves) if isinstance(v, torch.Tensor)]
    constants = {i: v for i, (_, v) in enumerate(leaves) if not isinstance(v, torch.Tensor)}
    input_tensors = _distinct([leaves[i][1] for i in tensor_pos])
    input_paths = [pytree.keystr(leaves[i][0]) for i in tensor_pos]
    needs_grad = [t.requires_grad and t.is_floating_point() for t in input_tensors]
    spec = pytree.tree_structure((args, kwargs))

    def rebuild(tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
        values = [leaves[i][1] for i in range(len(leaves))]
        for pos, t in zip(tensor_pos, tensors):
            values[pos] = t
        return pytree.tree_unflatten(values, spec)

    # outputs' shapes and differentiability, from one eager run that changes nothing (a write
    # into a parameter or an input is undone; the capture refuses it below)
    probe_buffers = {k: v.clone() for k, v in buffers.items()}

    def probe(guarded: list[torch.Tensor]) -> Any:
        with torch.random.fork_rng(devices=_devices(input_tensors, params)), writes_undone(
                guarded):
            a, k = rebuild([t.detach().requires_grad_(g)
                            for t, g in zip(input_tensors, needs_grad)])
            return torch.func.functional_call(module, ({**params, **frozen}, probe_buffers),
                                              a, k, tie_weights=True)

    try:
        out = probe([*params.values(), *frozen.values(), *input_tensors])
    except Exception:  # noqa: BLE001 - an op the write watch cannot see through: run it plain
        out = probe([])
    flat_out, out_spec = pytree.tree_flatten(out)
    dropped = opaque_outputs(flat_out)
    diff = [i for i, o in enumerate(flat_out)
            if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
    if not diff:
        raise GraphCaptureError(
            f"no output of {type(original).__name__} needs a gradient: nothing to train, so "
            "nothing to rematerialise; check that parameters have requires_grad=True"
        )
    untangented: list[int] = []
    scalars = _loss_outputs(out, flat_out, diff)
    if output_gradients == "scalars" and scalars and len(scalars) < len(diff):
        untangented = [i for i in diff if i not in scalars]
        diff = scalars
    tangents = [torch.zeros_like(flat_out[i]).detach() for i in diff]
    del out, flat_out

    marker: dict[str, str] = {}
    wrt_inputs = [i for i, g in enumerate(needs_grad) if g]

    def joint(p: dict, f: dict, b: dict, ins: list, tans: list):
        ins = [t.detach().requires_grad_(g) if g else t for t, g in zip(ins, needs_grad)]
        a, k = rebuild(ins)
        out = torch.func.functional_call(module, ({**p, **f}, b), a, k, tie_weights=True)
        flat = [None if i in dropped else o for i, o in enumerate(pytree.tree_leaves(out))]
        roots = [flat[i] for i in diff]
        mode = get_proxy_mode()
        if mode is not None:
            marker["last"] = next(iter(reversed(mode.tracer.graph.nodes))).name
        setup_stacktrace_preservation_hooks(
            [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None])
        wrt = list(p.values()) + [ins[i] for i in wrt_inputs]
        with _autograd_inside_backward_refused(type(original).__name__) as grad:
            grads = grad(roots, wrt, tans, allow_unused=True)
        return flat, list(grads)

    # functional_call swaps tensors in and out of the modules; with a submodule registered
    # under two names, tracing left fake tensors in the user's model: put back every one
    held = [(m, table, name, t) for m in module.modules()
            for table in (m._parameters, m._buffers) for name, t in list(table.items())]
    roles: list[tuple[str, int | str | None]] = (
        [("param", name) for name in [*params, *frozen]]
        + [("buffer", name) for name in buffers]
        + [("input", i) if not g else ("grad_input", None) for i, g in enumerate(needs_grad)]
        + [("tangent", None)] * len(tangents))
    recorder = BranchRecorder(roles, [t.detach() for t in input_tensors], original)
    try:
        with torch.fx.traceback.preserve_node_meta(), recorder:
            gm = make_fx(joint, tracing_mode="fake", _allow_non_fake_inputs=True)(
                params, frozen, buffers, input_tensors, tangents
            )
    finally:
        for m, table, name, t in held:
            if table.get(name) is not t:
                table[name] = t
    if "last" not in marker:
        raise GraphCaptureError("could not locate the end of the forward in the traced graph "
                                "(no tracing mode was active while the model ran): this path "
                                "cannot capture the model with this torch")
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    first_buffer = len(params) + len(frozen)
    written = writable_placeholders(placeholders, first_buffer + len(buffers), needs_grad)
    gm, marker["last"] = functionalise(gm, marker["last"], written)
    return JointCapture(
        gm=gm, path=path, param_names=list(params), frozen_names=list(frozen),
        buffer_names=list(buffers), input_paths=input_paths, input_requires_grad=needs_grad,
        tangent_for_output=diff, untangented_outputs=untangented,
        n_outputs=out_spec.num_leaves,
        last_forward=marker["last"], output_spec=out_spec, input_spec=spec, constants=constants,
        guards=recorder.guards, sized_by_values=recorder.sized_by_values,
    )


def _loss_outputs(out: Any, flat_out: list, diff: list[int]) -> list[int]:
    """Of the differentiable flat outputs ``diff``, the 0-dim ones, which a backward is taken
    to start from (``output_gradients="scalars"``); in an output with named entries (a dict, a
    Hugging Face ``ModelOutput``) only the one named ``loss``: without labels a mixture of
    experts returns its auxiliary loss beside the logits, and the training loss uses both."""
    scalars = [i for i in diff if flat_out[i].dim() == 0]
    try:
        paths = [path for path, _ in pytree.tree_flatten_with_path(out)[0]]
    except Exception:  # a pytree node registered without keys: positions only
        return scalars
    names = [[getattr(k, "key", getattr(k, "name", None)) for k in path] for path in paths]
    if not any(isinstance(n, str) for entry in names for n in entry):
        return scalars
    return [i for i in scalars if names[i][:1] == ["loss"]]


def _devices(tensors: list[torch.Tensor], params: dict) -> list[int]:
    cuda = {t.device.index or 0 for t in list(tensors) + list(params.values())
            if isinstance(t, torch.Tensor) and t.is_cuda}
    return sorted(cuda)
