"""The model and the user's loss as one module, so that the loss is captured and scheduled.

When :class:`hiremate.HRockmate` is given ``loss_fn``, the step it bounds is forward, loss and
backward. Running the loss outside the module would leave what it keeps (cross-entropy's
log-softmax, a squared error's residual) and the output gradient it hands back out of the
schedule: the solvers could neither free nor recompute them, only reserve room. Capturing
``loss_fn(model(*args, **kwargs), target)`` as one program puts the loss's nodes in the graph
beside the model's, and the module's output becomes the scalar loss, whose gradient is one
element.

Targets change from batch to batch, so they are inputs of the captured program
(:class:`LossStep` takes them as arguments), never values the loss function reads from
elsewhere: a tensor a loss function closes over would be traced as a constant, and every call
would silently train against the sample's targets. :func:`outside_tensors` finds such tensors
before the capture so that the build can refuse them.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from hiremate.errors import ConfigError
from hiremate.graphbuilder.capture import normalise_sample, training_call

#: the keyword a call passes the loss's target with, when the module was built with one
TARGET_KEYWORD = "target"

class LossStep(torch.nn.Module):
    """``loss_fn(model(*args, **kwargs), *targets)`` as a module: called as
    ``step(args, kwargs, *targets)`` (at most one target; none when the loss takes the output
    alone). The model is a submodule (parameter names gain a ``model.`` prefix, which only
    the graph and the executor built from this module see); a loss that is a module (with a
    class-weight buffer, say) is one too."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor]):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        # the refusal of a non-scalar loss, kept because the capture reports it as one of
        # its paths' failures; the build raises it as the configuration error it is
        self.output_error: ConfigError | None = None

    def forward(self, args: tuple, kwargs: dict, *targets: Any) -> torch.Tensor:
        # the call the capture makes of a model alone (use_cache off for Hugging Face models)
        args, kwargs = training_call(self.model, tuple(args), dict(kwargs))
        loss = self.loss_fn(self.model(*args, **kwargs), *targets)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.is_floating_point():
            what = (f"a tensor of shape {tuple(loss.shape)} and dtype {loss.dtype}"
                    if isinstance(loss, torch.Tensor) else type(loss).__name__)
            self.output_error = ConfigError(
                f"loss_fn returned {what}; it must return a floating-point scalar tensor "
                "(reduce the loss with .mean() or .sum())")
            raise self.output_error
        return loss

    def step_inputs(self, sample: Any, target: Any = None) -> tuple:
        """The positional arguments of this module for a model ``sample`` (a tensor, a tuple of
        positional arguments or a dict of keyword arguments) and the loss's ``target`` (None:
        the loss takes the output alone)."""
        args, kwargs = normalise_sample(sample)
        return (args, kwargs) if target is None else (args, kwargs, target)


def check_loss_fn(loss_fn: Any, model: torch.nn.Module, has_target: bool) -> None:
    """Refuse a loss that cannot be captured faithfully: not callable, reading tensors from
    outside its arguments, or (with a target) a model whose forward takes a ``target`` keyword
    of its own, which the call could not tell from the loss's."""
    if not callable(loss_fn):
        raise ConfigError(f"loss_fn must be callable ((output[, target]) -> scalar loss), got "
                          f"{type(loss_fn).__name__}")
    if has_target:
        try:
            names = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            names = {}
        if TARGET_KEYWORD in names:
            raise ConfigError(
                f"{type(model).__name__}.forward takes a '{TARGET_KEYWORD}' argument itself, so a "
                f"call could not pass the loss's target as {TARGET_KEYWORD}=...; compute the loss "
                "inside the model, or pass capture_loss=False (the loss then runs outside the "
                "module and its memory is measured at build)")
    found = outside_tensors(loss_fn)
    if found:
        raise ConfigError(
            f"loss_fn reads tensor(s) {', '.join(sorted(found))} from outside its arguments: the "
            "capture would freeze their values, and every call would use the sample's. Pass "
            "targets as HRockmate(..., target=...) and call the module with target=...; a "
            "constant (class weights) can be a buffer of an nn.Module loss, e.g. "
            "nn.CrossEntropyLoss(weight=w)")


def outside_tensors(fn: Any, _depth: int = 0) -> set[str]:
    """Names of the tensors ``fn`` reads other than through its arguments: closure cells,
    globals it names, defaults, a ``functools.partial``'s bound arguments, a bound method's
    object's attributes, a module's tensor attributes that are neither parameters nor buffers."""
    if _depth > 3:
        return set()
    found: set[str] = set()
    if isinstance(fn, functools.partial):
        for i, value in enumerate(fn.args):
            if _holds_tensor(value):
                found.add(f"partial argument {i}")
        found |= {f"partial keyword {k}" for k, v in fn.keywords.items() if _holds_tensor(v)}
        return found | outside_tensors(fn.func, _depth + 1)
    if isinstance(fn, torch.nn.Module):
        for m_name, m in fn.named_modules():
            for key, value in vars(m).items():
                if not key.startswith("_") and _holds_tensor(value):
                    found.add(f"{m_name + '.' if m_name else ''}{key}")
        return found
    if inspect.ismethod(fn):
        owner = fn.__self__
        if isinstance(owner, torch.nn.Module):
            found |= outside_tensors(owner, _depth + 1)
        else:
            found |= {k for k, v in vars(owner).items() if _holds_tensor(v)} \
                if hasattr(owner, "__dict__") else set()
        return found | outside_tensors(fn.__func__, _depth + 1)
    if inspect.isfunction(fn):
        try:
            seen = inspect.getclosurevars(fn)
        except (TypeError, ValueError):  # builtins and odd callables: nothing to inspect
            return found
        for name, value in {**seen.globals, **seen.nonlocals}.items():
            if _holds_tensor(value):
                found.add(name)
        for value in (fn.__defaults__ or ()):
            if _holds_tensor(value):
                found.add("a default argument")
        found |= {k for k, v in (fn.__kwdefaults__ or {}).items() if _holds_tensor(v)}
        return found
    call = getattr(type(fn), "__call__", None)
    if inspect.isfunction(call) and hasattr(fn, "__dict__"):
        found |= {k for k, v in vars(fn).items() if _holds_tensor(v)}
    return found


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple, dict)):
        try:
            return any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value))
        except Exception:  # noqa: BLE001 - an unflattenable container holds no traced tensor
            return False
    return False


__all__ = ["LossStep", "TARGET_KEYWORD", "check_loss_fn", "outside_tensors"]
