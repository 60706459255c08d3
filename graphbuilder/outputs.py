"""What a model's output holds, as the capture sees it: tensors, plain constants, and objects.

torch's pytree opens tuples, lists, dicts, named tuples and the classes registered with it
(Hugging Face's ``ModelOutput``); anything else is one leaf. A leaf that is neither a tensor nor
a plain constant (a cache object) needs no gradient and cannot live in a graph, so the wrapper
returns ``None`` in its place. A dataclass that holds tensors needing a gradient (the user's
own ``@dataclass`` of outputs) is another matter: dropping it would lose what the user trains
on, so the capture refuses it, naming the class and how to make it visible. Other objects stay
dropped: a cache object holds activations too, and is meant to be left out.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from hiremate.errors import GraphCaptureError
from hiremate.quiet import log_once

log = logging.getLogger(__name__)

#: output leaves that pass through as constants; any other non-tensor leaf is dropped
PLAIN_LEAVES = (type(None), bool, int, float, str, torch.dtype, torch.device)


def opaque_outputs(flat: list[Any]) -> set[int]:
    """Positions of output leaves that are neither tensors nor plain constants (a Hugging Face
    cache object, any Python object): they need no gradient and cannot be stored in a graph,
    so the wrapper returns ``None`` in their place (logged once per kind). Raises
    :class:`GraphCaptureError` for a leaf holding tensors that need a gradient."""
    dropped = {i for i, o in enumerate(flat) if not isinstance(o, (torch.Tensor, *PLAIN_LEAVES))}
    for i in sorted(dropped):
        hidden = _fields_needing_gradients(flat[i])
        if hidden:
            kind = type(flat[i])
            how = f"torch.utils._pytree.register_dataclass({kind.__name__})"
            raise GraphCaptureError(
                f"the model's output holds a {kind.__name__}, a class torch's pytree does not "
                f"open, with tensors that need a gradient ({', '.join(hidden[:4])}): hiremate "
                f"cannot see them, and the wrapper would lose them. Return a tuple, a dict or "
                f"a Hugging Face ModelOutput, or register the class once before building: {how}")
    kinds = sorted({type(flat[i]).__name__ for i in dropped})
    if kinds:
        log_once(log, f"dropped:{','.join(kinds)}", logging.WARNING,
                 "the model's output holds %s, which is not a tensor: the wrapped model "
                 "returns None in its place (it needs no gradient)", ", ".join(kinds))
    return dropped


def _fields_needing_gradients(obj: Any) -> list[str]:
    """Names of the fields of dataclass ``obj`` that are tensors needing a gradient, or lists
    and tuples holding one (none for an object that is not a dataclass)."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return []
    items = [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    found = []
    for name, value in items:
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, torch.Tensor) and v.requires_grad for v in values):
            found.append(name)
    return found
