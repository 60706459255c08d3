"""Noticing that a model was changed after its graph was captured.

A captured graph is the program of the model as it was: its modules, their settings, the
shapes of their parameters and buffers. Training code changes models in place: a new
classification head for fine-tuning (``model.fc = nn.Linear(...)``), an adapter inserted, an
embedding resized. The executor reads parameters through their owners' tables, so a module
replaced after the build would leave it running the old module's parameters, silently.

Checking the whole model at every call costs a walk over its modules. Instead, torch's global
registration hooks (every ``register_module``/``register_parameter``/``register_buffer``,
which attribute assignment goes through) bump a counter, and a module compares its
:func:`fingerprint` only when the counter moved since its last look: a call costs one integer
comparison while nothing is registered anywhere. ``insert`` into and ``del`` from a
``Sequential``, ``ModuleList`` or ``ModuleDict`` edit the container's table without
registering, so each call also compares those containers' lengths (:func:`containers`).

What is compared: each submodule's path, class and ``extra_repr()`` (torch's modules print
their settings there: a convolution's stride and padding, dropout's ``p``), and each
parameter's and buffer's path, shape and dtype. A setting assigned in place (``model.drop.p =
0.5``, a BatchNorm's ``momentum``) registers nothing; torch's modules declare theirs in
``__constants__``, and each call compares those with the values seen last (:func:`settings`:
about 26 us on a 12-layer GPT2 or the zoo's ResNet, whose steps take milliseconds). Attributes
of a user's own modules are not watched: build again after changing one.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Callable

import torch

from hiremate.errors import InvalidGraphError

log = logging.getLogger(__name__)
_generation = 0
_installed = False


def _bump(*_args: Any) -> None:
    """The registration hooks' body. Not while torch.compile traces: a forward that registers
    a module at every call (Hugging Face's Llama slices its ``ModuleList`` of layers) would
    otherwise make the compiled code guard on this counter and write it back, so that every
    call of any compiled model in the process recompiles it, until torch gives up compiling
    and runs it eagerly. What a compiled graph registers while it is traced is not a change
    of a model we watch (a temporary container), and the compiled code does not register
    it again when it runs."""
    global _generation
    if torch.compiler.is_compiling():
        return
    _generation += 1


def generation() -> int:
    """How many modules, parameters and buffers have been registered since the hooks were
    installed (on the first call in the process, so a module unpickled elsewhere counts too)."""
    global _installed
    if not _installed:
        from torch.nn.modules import module as nn_module

        nn_module.register_module_module_registration_hook(_bump)
        nn_module.register_module_parameter_registration_hook(_bump)
        nn_module.register_module_buffer_registration_hook(_bump)
        _installed = True
    return _generation


class ModelWatch:
    """What a module was captured from, and what it last saw of it (module docstring)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.fingerprint = fingerprint(model)
        self._look()

    def _look(self) -> None:
        self._generation = generation()
        self._containers = containers(self.model)
        self._settings = settings(self.model)

    def change(self, on_same: Callable[[], None] = lambda: None) -> str | None:
        """What changed since the capture, or None. Costs one comparison, the containers'
        lengths and the declared settings unless something was registered since the last
        look; when the model is then walked and found equal, the look is taken again and
        ``on_same`` runs (its modules may have been replaced by equal ones)."""
        if (generation() == self._generation and not resized(self._containers)
                and not settings_changed(self._settings)):
            return None
        now = fingerprint(self.model)
        if now != self.fingerprint:
            return describe_change(self.fingerprint, now)
        self._look()
        on_same()
        return None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_generation"] = -1  # another process counts registrations anew
        return state


def fingerprint(model: torch.nn.Module) -> tuple:
    """What of ``model`` its captured program depends on, beyond parameter values (module
    docstring)."""
    modules = tuple((name, type(m).__qualname__, _settings(m))
                    for name, m in model.named_modules())
    tensors = tuple((kind, name, tuple(t.shape), t.dtype)
                    for kind, named in (("parameter", model.named_parameters()),
                                        ("buffer", model.named_buffers()))
                    for name, t in named if t is not None)
    return modules, tensors


_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def containers(model: torch.nn.Module) -> tuple[tuple[torch.nn.Module, int], ...]:
    """Each container module of ``model`` with its length now."""
    return tuple((m, len(m._modules)) for m in model.modules() if isinstance(m, _CONTAINERS))


def resized(seen: tuple[tuple[torch.nn.Module, int], ...]) -> bool:
    """Whether a container of :func:`containers` has another length now."""
    return any(len(m._modules) != n for m, n in seen)


def to_json(print_: tuple) -> list:
    """A :func:`fingerprint` as JSON data (saved beside a schedule)."""
    modules, tensors = print_
    return [[list(m) for m in modules],
            [[kind, name, list(shape), str(dtype).removeprefix("torch.")]
             for kind, name, shape, dtype in tensors]]


def from_json(data: Any) -> tuple:
    """The :func:`fingerprint` of :func:`to_json`'s data, comparable with one made now."""
    modules, tensors = data
    return (tuple((str(n), str(c), str(s)) for n, c, s in modules),
            tuple((str(k), str(n), tuple(int(d) for d in shape), getattr(torch, str(dt)))
                  for k, n, shape, dt in tensors))


_PLAIN = (bool, int, float, str, type(None), tuple)


def settings(model: torch.nn.Module) -> tuple:
    """For each module of ``model`` that declares its settings in ``__constants__`` (torch's:
    dropout's ``p``, a norm's ``eps`` and ``momentum``, an activation's slope), a getter of
    those settings and their values now; settings that are not plain values are left out."""
    seen = []
    for m in model.modules():
        names = [n for n in getattr(type(m), "__constants__", ())
                 if isinstance(getattr(m, n, None), _PLAIN)]
        if names:
            get = operator.attrgetter(*names)
            seen.append((m, get, get(m)))
    return tuple(seen)


def settings_changed(seen: tuple) -> bool:
    """Whether a setting of :func:`settings` has another value now."""
    return any(get(m) != values for m, get, values in seen)


def _settings(module: torch.nn.Module) -> str:
    try:
        return module.extra_repr()
    except Exception:  # noqa: BLE001 - a user's extra_repr may fail on a changed module
        return "?"


def describe_change(before: tuple, after: tuple, limit: int = 3) -> str:
    """What differs between two fingerprints, in words (at most ``limit`` items per kind)."""
    parts = []
    old_modules = {name: rest for name, *rest in before[0]}
    new_modules = {name: rest for name, *rest in after[0]}
    for label, names in (
            ("modules added", [n for n in new_modules if n not in old_modules]),
            ("modules removed", [n for n in old_modules if n not in new_modules]),
            ("modules changed", [n for n in new_modules
                                 if n in old_modules and new_modules[n] != old_modules[n]])):
        if names:
            shown = ", ".join(repr(n or "(the model)") for n in names[:limit])
            parts.append(f"{label}: {shown}{', ...' if len(names) > limit else ''}")
    old_tensors = {(k, n): (s, d) for k, n, s, d in before[1]}
    new_tensors = {(k, n): (s, d) for k, n, s, d in after[1]}
    changed = [f"{k} {n!r} {_kind(*old_tensors[k, n], d)} -> {_kind(s, d, old_tensors[k, n][1])}"
               for (k, n), (s, d) in new_tensors.items()
               if (k, n) in old_tensors and old_tensors[k, n] != (s, d)]
    added = [f"{k} {n!r}" for k, n in new_tensors if (k, n) not in old_tensors]
    removed = [f"{k} {n!r}" for k, n in old_tensors if (k, n) not in new_tensors]
    for label, items in (("changed", changed), ("added", added), ("removed", removed)):
        if items:
            parts.append(f"{label}: {', '.join(items[:limit])}"
                         f"{', ...' if len(items) > limit else ''}")
    return "; ".join(parts) or "its structure"


def _kind(shape: tuple, dtype: torch.dtype, other_dtype: torch.dtype) -> str:
    """A tensor's shape, and its dtype where the other side's differs."""
    if dtype == other_dtype:
        return str(tuple(shape))
    return f"{tuple(shape)} {str(dtype).removeprefix('torch.')}"


def check_saved_model(saved: Any, model: torch.nn.Module, path: Any) -> None:
    """Raise :class:`InvalidGraphError` when ``model`` is not the model that
    :meth:`hiremate.HRockmate.save` saved the schedule of (its modules, their settings, its
    parameter and buffer shapes): the program would run on another model's parameters, or
    leave out its other layers."""
    if saved is None:  # a file saved before the model was recorded
        log.warning("%s does not record the model it was saved for; loading it on a model of "
                    "another architecture would run the saved one's program", path)
        return
    now = fingerprint(model)
    if from_json(saved) != now:
        raise InvalidGraphError(
            f"{path} holds the schedule of another model than this one "
            f"({describe_change(from_json(saved), now)}); load it on the model it was saved "
            "for, or build HRockmate(model, sample, budget) for this one")
