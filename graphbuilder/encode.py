"""Turn fx arguments into the serialisable arguments of :class:`hiremate.ir.graph.Op`."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from hiremate.errors import GraphCaptureError
from hiremate.ir.graph import Ref


def encode_arg(value: Any, rename: dict[str, str] | None = None) -> Any:
    """Constants stay as they are; fx nodes become :class:`Ref`; torch enums are tagged;
    tensor constants of the traced program (``torch.tensor(0)`` inside a forward, traced as an
    attribute of the graph module) are recorded by value."""
    if isinstance(value, torch.fx.Node) and value.op == "get_attr":
        return _encode_tensor(getattr(value.graph.owning_module, value.target), value.name)
    if isinstance(value, torch.Tensor):
        return _encode_tensor(value, "a tensor constant")
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


#: largest tensor constant recorded by value (a model building a big tensor from Python data
#: inside its forward is rare, and the graph stores it in its JSON)
MAX_CONSTANT_ELEMENTS = 4096


def _encode_tensor(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, torch.Tensor) or value.numel() > MAX_CONSTANT_ELEMENTS:
        raise GraphCaptureError(
            f"the traced program reads the constant {name} ({type(value).__name__}"
            f"{', ' + str(tuple(value.shape)) if isinstance(value, torch.Tensor) else ''}), "
            f"which hiremate records only for tensors of at most {MAX_CONSTANT_ELEMENTS} "
            "elements; register it as a buffer of the model instead"
        )
    return {"torch": "tensor", "value": {
        "data": value.detach().cpu().tolist(), "dtype": str(value.dtype).removeprefix("torch."),
        "device": str(value.device)}}


_DECODERS = {
    "tensor": lambda v: torch.tensor(v["data"], dtype=getattr(torch, v["dtype"]),
                                     device=v["device"]),
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
