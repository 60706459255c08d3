"""A module that stands in for the model it wraps: same state, names, mode and attributes.

:class:`ModelWrapper` is the base of :class:`hiremate.HRockmate`. A wrapper that registered the
model as a submodule would name every parameter ``<submodule>.<name>``, so a checkpoint saved
from it would not load into the plain model (torch.compile's ``_orig_mod.`` prefix is the
well-known case), and code written for the model (``.config``, ``.generate``,
``.save_pretrained``, a training loop that inspects ``forward``) would not find what it looks
for. Here the wrapper *shares* the model's tables instead: its ``_parameters``, ``_buffers``,
``_modules`` (and the state-dict hook tables) are the model's own dict objects, so every piece
of ``nn.Module`` machinery that walks them (``named_parameters``, ``state_dict``,
``load_state_dict``, ``named_modules``, ``zero_grad``, also when the wrapper is itself a
submodule of a larger model) sees the model's tensors under the model's names, and nothing is
copied: an optimizer built on ``wrapper.parameters()`` trains the model.

What else is the model's:

- attributes the wrapper does not define are read from, written to and deleted on the model
  (but for new private names, which stay on the wrapper);
- ``state_dict``/``load_state_dict``, ``_apply`` (``.to()``, ``.double()``...), ``apply`` and
  ``train`` call the model's own methods, so its overrides and hooks run; ``training`` is the
  model's flag;
- ``forward`` reports the model's forward signature to :func:`inspect.signature` (Hugging Face's
  ``Trainer`` keeps only the dataset columns the signature names).

Wrapper-own attributes live in the instance ``__dict__`` (set with :meth:`_own`), never in the
shared tables, so that building the wrapper never adds anything to the model.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from hiremate.errors import ConfigError

# the nn.Module tables that the wrapper shares with the model (the same dict objects)
SHARED_TABLES = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules",
                 "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                 "_load_state_dict_post_hooks")

_MODEL = "_wrapped_model_"  # the instance-dict key of the model (unlikely to collide)


class _Forward:
    """The wrapper's ``forward`` as an instance attribute: calls the class's ``forward``, and
    answers :func:`inspect.signature` with the model's (a bound method's signature would be
    the class function's ``(*args, **kwargs)``, the same for every model)."""

    __name__ = "forward"

    def __init__(self, owner: "ModelWrapper"):
        self.owner = owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.owner).forward(self.owner, *args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.owner.wrapped_model.forward)

    def __repr__(self) -> str:
        return f"<forward of {type(self.owner).__name__} wrapping " \
               f"{type(self.owner.wrapped_model).__name__}>"


class ModelWrapper(torch.nn.Module):
    """Base of a module that stands for ``model`` (see the module docstring). Subclasses call
    :meth:`_wrap` once their own state is set, and define ``forward``."""

    # -- wrapping ---------------------------------------------------------------------------------
    def _wrap(self, model: torch.nn.Module) -> None:
        """Share ``model``'s tables and make it the target of attribute fall-through."""
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"the model must be a torch.nn.Module, got {type(model).__name__}")
        d = self.__dict__
        for name in SHARED_TABLES:
            d[name] = model.__dict__[name]
        d["forward"] = _Forward(self)
        d[_MODEL] = model

    def _own(self, name: str, value: Any) -> None:
        """Set a wrapper-own attribute (kept out of the shared tables and off the model)."""
        self.__dict__[name] = value

    @property
    def wrapped_model(self) -> torch.nn.Module:
        """The model this wrapper stands for (its parameters are the wrapper's)."""
        model = self.__dict__.get(_MODEL)
        if model is None:
            raise AttributeError("the wrapper has no model yet (it is being built)")
        return model

    # -- attributes: the wrapper's own, else the model's ------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # reached only when ordinary lookup failed; nn.Module's looks in the (shared) tables
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self.__dict__.get(_MODEL)
            # no fall-through during __init__ or unpickling (no model yet: no recursion), nor
            # for special names, which copy and pickle look up on the instance (a model's
            # __deepcopy__ would copy the model instead of the wrapper)
            if model is None or (name.startswith("__") and name.endswith("__")):
                raise
        return getattr(model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        model = d.get(_MODEL)
        if name in d:  # the wrapper's own (also a module such as the executor: not registered)
            object.__setattr__(self, name, value)
        elif model is None or hasattr(type(self), name):
            super().__setattr__(name, value)
        elif (name.startswith("_") and not hasattr(model, name)
              and not isinstance(value, (torch.nn.Module, torch.Tensor))):
            # private bookkeeping that code holding the wrapper keeps on it (nn.Module's
            # __setstate__ filling tables an old pickle lacks, say): the wrapper's own
            object.__setattr__(self, name, value)
        else:
            setattr(model, name, value)

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        model = d.get(_MODEL)
        if model is None or name in d or hasattr(type(self), name):
            super().__delattr__(name)
        else:
            delattr(model, name)

    def __dir__(self) -> list[str]:
        model = self.__dict__.get(_MODEL)
        own = list(super().__dir__())
        return sorted(set(own) | set(dir(model))) if model is not None else own

    # -- mode -------------------------------------------------------------------------------------
    @property
    def training(self) -> bool:  # type: ignore[override]
        """The model's training flag (``nn.Module.__init__`` sets it before there is a model)."""
        model = self.__dict__.get(_MODEL)
        return model.training if model is not None else self.__dict__.get("_own_training", True)

    @training.setter
    def training(self, mode: bool) -> None:
        model = self.__dict__.get(_MODEL)
        if model is not None:
            model.training = mode
        else:
            self.__dict__["_own_training"] = mode

    def train(self, mode: bool = True) -> "ModelWrapper":
        """``model.train(mode)`` (its override, if any, runs); returns the wrapper."""
        self.wrapped_model.train(mode)
        return self

    # -- state: the model's, under the model's names ----------------------------------------------
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The model's ``state_dict`` (keys as the plain model's: a checkpoint saved from the
        wrapper loads into the model, and the other way round)."""
        return self.wrapped_model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """The model's ``load_state_dict``: a checkpoint of the plain model loads as it is."""
        return self.wrapped_model.load_state_dict(state_dict, strict=strict, assign=assign)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        self.wrapped_model._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        # called by an enclosing module's load_state_dict; the shared _modules make it recurse
        # into the model's children afterwards
        self.wrapped_model._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn: Any, recurse: bool = True) -> "ModelWrapper":
        self.wrapped_model._apply(fn, recurse)
        return self

    def apply(self, fn: Any) -> "ModelWrapper":
        """``model.apply(fn)``: ``fn`` sees the model (not the wrapper) after its submodules."""
        self.wrapped_model.apply(fn)
        return self

    def _get_name(self) -> str:
        # nn.Module's repr header, and what Hugging Face's Trainer matches against its model
        # tables (a causal LM's label smoothing shifts the labels)
        return self.wrapped_model._get_name()


__all__ = ["ModelWrapper", "SHARED_TABLES"]
