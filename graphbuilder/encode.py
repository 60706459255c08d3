"""Turn fx arguments into the serialisable arguments of :class:`hiremate.graph.Op`."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from hiremate.errors import GraphCaptureError
from hiremate.graph import Ref


def encode_arg(value: Any, rename: dict[str, str] | None = None) -> Any:
    """Constants stay as they are; fx nodes become :class:`Ref`; torch enums are tagged."""
    if isinstance(value, torch.fx.Node):
        name = value.name
        return Ref(rename.get(name, name) if rename else name)
    if isinstance(value, (list, tuple)):
        items = [encode_arg(v, rename) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return {"torch": "dtype", "value": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"torch": "device", "value": str(value)}
    if isinstance(value, torch.layout):
        return {"torch": "layout", "value": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"torch": "memory_format", "value": str(value).removeprefix("torch.")}
    raise GraphCaptureError(
        f"an operation takes an argument of type {type(value).__name__} ({value!r}) that "
        "hiremate cannot record; please report this model"
    )


_DECODERS = {
    "dtype": lambda v: getattr(torch, v),
    "layout": lambda v: getattr(torch, v),
    "memory_format": lambda v: getattr(torch, v),
    "device": torch.device,
}


def decode_arg(value: Any, env: dict[str, Any]) -> Any:
    """Inverse of :func:`encode_arg`, reading :class:`Ref` s from ``env``."""
    if isinstance(value, Ref):
        return env[value.name]
    if isinstance(value, list):
        return [decode_arg(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(decode_arg(v, env) for v in value)
    if isinstance(value, dict) and "torch" in value:
        return _DECODERS[value["torch"]](value["value"])
    return value
