"""Leaving a model as the caller left it: parameters, buffers, gradients and the global RNG.

Building a wrapper runs the model for real more than once (cost measurement, the output
structure, calibration with :func:`hiremate.measure`), and a real run of a model in training
mode writes its buffers (BatchNorm's running statistics and ``num_batches_tracked``) and draws
from the global random generators (dropout). The wrapper promises (docs/design.md, "The executor") that
building never changes them: :func:`preserved` is the one place that keeps that promise, used
once around the whole build by :class:`hiremate.HRockmate` (and around every re-capture for a
new input shape), and around its runs by :func:`hiremate.measure`.

What is kept, and how:

- buffers: a copy of each one's value (buffers are small next to parameters), written back
  into the original tensor at exit when it changed, so references the caller holds stay
  valid;
- parameters: not copied (that would double the model's memory); nothing in a build writes
  them, and their version counters are checked at exit: a write is logged as an error;
- the tensor objects themselves: a parameter or buffer that a run replaced in its module's
  table (``functional_call`` with a submodule registered twice can leave a stand-in) is put
  back;
- ``.grad`` of every parameter, by reference;
- the CPU generator's state, and each CUDA device's when CUDA is initialised (reading a state
  from an uninitialised CUDA would initialise it, and nothing can have drawn from it);
- lazy modules not yet initialised (``nn.LazyLinear``): not at all (:func:`initialise_lazy`
  initialises them before a build; a run inside the block may, and that is kept);
- the modules' plain Python attributes that a forward may change (a call counter, a list it
  appends to): numbers, strings, booleans and None by value, lists, dicts and sets by their
  contents (element identity). With ``python_state_warning`` a change is also a warning: the
  wrapper's steps run the captured program, not the forward's Python code, so such an
  attribute stops changing in training, and a branch on it follows its value at the build.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

log = logging.getLogger(__name__)


class ModelState:
    """A snapshot of what :func:`preserved` restores (see the module docstring)."""

    def __init__(self, modules: Iterable[torch.nn.Module], python_state_warning: bool = False):
        self._slots: list[tuple[dict, str, torch.Tensor]] = []
        self._attributes: list[tuple[str, dict, str, Any, Any]] = []
        self._warn = python_state_warning
        self._lazy: set[int] = set()  # parameters of lazy modules not yet initialised
        seen_modules: set[int] = set()
        for root in modules:
            for path, m in root.named_modules():
                if id(m) in seen_modules:
                    continue
                seen_modules.add(id(m))
                if _uninitialised(m):  # its first call initialises it: that is kept
                    self._lazy.update(id(p) for p in m.parameters(recurse=False))
                    continue
                self._attributes += _plain_attributes(type(root).__name__, path, m)
                for table in (m._parameters, m._buffers):
                    for name, t in table.items():
                        if t is not None:
                            self._slots.append((table, name, t))
        params: dict[int, torch.Tensor] = {}
        buffers: dict[int, torch.Tensor] = {}
        for table, _, t in self._slots:
            if isinstance(t, torch.nn.Parameter):
                params.setdefault(id(t), t)
            else:
                buffers.setdefault(id(t), t)
        self._params = list(params.values())
        self._param_versions = [p._version for p in self._params]
        self._grads = [p.grad for p in self._params]
        with torch.no_grad():
            self._buffers = [(b, b._version, b.detach().clone()) for b in buffers.values()]
        self._cpu_rng = torch.get_rng_state()
        self._cuda_rng = (torch.cuda.get_rng_state_all()
                          if torch.cuda.is_available() and torch.cuda.is_initialized() else None)

    def restore(self) -> None:
        """Put everything back; the parameters' values are checked, not restored."""
        self._restore_attributes()
        for table, name, t in self._slots:
            # ``in`` and ``[]``, which a TorchScript module's tables have too (no ``get``)
            if (table[name] if name in table else None) is not t:
                table[name] = t
        with torch.no_grad():
            for b, version, saved in self._buffers:
                # a write that bypassed the version counter (through ``.data``) is caught by
                # the comparison; an unchanged buffer is not written, since a write would bump
                # its version and break a pending backward that saved it (BatchNorm in eval)
                if not _unchanged(b, version, saved):
                    b.copy_(saved)
        for p, g in zip(self._params, self._grads):
            if p.grad is not g:
                p.grad = g
        written = [tuple(p.shape) for p, v in zip(self._params, self._param_versions)
                   if p._version != v and id(p) not in self._lazy]
        if written:
            log.error("%d parameter(s) (shapes %s) were written in place while hiremate ran the "
                      "model; their values were not restored", len(written), written[:3])
        torch.set_rng_state(self._cpu_rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state_all(self._cuda_rng)

    def _restore_attributes(self) -> None:
        changed = []
        for where, table, key, value, contents in self._attributes:
            now = table.get(key, _MISSING)
            if contents is None and _same_scalar(now, value):  # set again to what it was
                continue
            if now is not value:
                table[key] = value
            elif contents is not None and not _same_elements(value, contents):
                if isinstance(value, list):
                    value[:] = contents
                else:
                    value.clear()
                    value.update(contents)
            else:
                continue
            changed.append(where)
        if changed:
            shown = ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "")
            log.log(logging.WARNING if self._warn else logging.DEBUG,
                    "running the model's forward changed %d Python attribute(s) (%s); they "
                    "were put back. Training steps through the wrapper run the captured "
                    "program, not the forward's Python code: these attributes will not change "
                    "then, and a branch on one follows its value at the build", len(changed),
                    shown)


_MISSING = object()
#: what nn.Module keeps in every instance's ``__dict__`` (its tables and hooks)
_MODULE_KEYS = frozenset(torch.nn.Module().__dict__)
_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def initialise_lazy(model: torch.nn.Module, sample: Any) -> None:
    """Initialise ``model``'s lazy modules (``nn.LazyLinear``, ``nn.LazyBatchNorm2d``...) by one
    forward on ``sample``, as torch asks ("call forward with a dummy batch") and as their first
    eager call would: the capture cannot trace parameters that do not exist yet. The forward
    runs in eval mode without autograd, so no buffer is updated and nothing is recorded; the
    random numbers the initialisation draws are eager's first call's, and the global generator
    is left where it was."""
    lazy = [name for name, m in model.named_modules() if _uninitialised(m)]
    if not lazy:
        return
    from hiremate.graphbuilder.capture import normalise_sample, training_call
    from hiremate.graphbuilder.untouched import writes_undone

    args, kwargs = training_call(model, *normalise_sample(sample))
    modules = list(model.modules())
    modes = [m.training for m in modules]
    try:
        model.train(False)  # eval mode
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]), writes_undone(
                    pytree.tree_leaves((args, kwargs))):  # a write into the sample is put back
                model(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op the write watch cannot see through
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                model(*args, **kwargs)
    finally:
        for m, mode in zip(modules, modes):
            m.training = mode
    log.info("initialised %d lazy module(s) (%s) with one forward on the sample, as their "
             "first call would", len(lazy), ", ".join(lazy[:3]))


def _uninitialised(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a lazy module (``nn.LazyLinear``...) whose parameters its first call
    will create: that call (the build's first run) sets its parameters and attributes and
    turns it into its plain class, as it would in eager; none of that is put back."""
    from torch.nn.modules.lazy import LazyModuleMixin

    return isinstance(module, LazyModuleMixin) and module.has_uninitialized_params()


def _plain_attributes(root: str, path: str, module: torch.nn.Module
                      ) -> list[tuple[str, dict, str, Any, Any]]:
    """``(name, table, key, value, contents)`` of ``module``'s plain attributes worth
    keeping: scalars (``contents`` None) and lists, dicts and sets (a shallow copy). None of
    hiremate's own modules (the step that wraps a model with its loss keeps the loss's error in
    an attribute, for the build to raise)."""
    if type(module).__module__.startswith("hiremate."):
        return []
    table = module.__dict__
    kept = []
    for key, value in table.items():
        if key in _MODULE_KEYS:
            continue
        where = ".".join(p for p in (root, path, key) if p)
        if isinstance(value, _SCALARS):
            kept.append((where, table, key, value, None))
        elif type(value) in (list, dict, set):
            kept.append((where, table, key, value, copy.copy(value)))
    return kept


def _same_scalar(now: Any, value: Any) -> bool:
    """Whether an attribute holds the scalar ``value`` again (a float computed anew each call
    is another object of the same value)."""
    return now is value or (type(now) is type(value) and now == value)


def _same_elements(value: Any, contents: Any) -> bool:
    """Whether a list, dict or set holds the same objects as its copy ``contents``."""
    if len(value) != len(contents):
        return False
    if isinstance(value, list):
        return all(a is b for a, b in zip(value, contents))
    if isinstance(value, dict):
        return all(k in contents and contents[k] is v for k, v in value.items())
    kept = {id(b) for b in contents}
    return all(id(a) in kept for a in value)


def _unchanged(buffer: torch.Tensor, version: int, saved: torch.Tensor) -> bool:
    """Whether ``buffer`` still holds ``saved``: its version, and for a dense tensor its values
    (``torch.equal`` has no kernel for sparse layouts, whose in-place writes bump the version)."""
    if buffer._version != version:
        return False
    return buffer.layout is not torch.strided or torch.equal(buffer, saved)


@contextlib.contextmanager
def preserved(*modules: torch.nn.Module, python_state_warning: bool = False
              ) -> Iterator[ModelState]:
    """Run the body, then restore ``modules``' buffers, tensors, gradients and plain
    attributes and the global RNG states as they were on entry (also when the body raises).
    ``python_state_warning``: a changed attribute is a warning (a build), not only put back."""
    state = ModelState(modules, python_state_warning)
    try:
        yield state
    finally:
        state.restore()


__all__ = ["ModelState", "initialise_lazy", "preserved"]
