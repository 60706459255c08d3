"""``mlp``: a plain multi-layer perceptron, the simplest chain a solver can meet."""

from __future__ import annotations

import torch
from torch import nn

from hiremate.zoo.registry import register

IN_FEATURES = 32
OUT_FEATURES = 10


@register(
    "mlp",
    "multi-layer perceptron: Linear, GELU, ..., Linear",
    defaults={"layers": 3, "width": 64, "batch": 8},
    meaning={
        "layers": "number of hidden layers (Linear + GELU)",
        "width": "hidden size",
        "batch": "batch size",
    },
)
def build_mlp(layers: int, width: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    blocks: list[nn.Module] = []
    fan_in = IN_FEATURES
    for _ in range(layers):
        blocks += [nn.Linear(fan_in, width), nn.GELU()]
        fan_in = width
    blocks.append(nn.Linear(fan_in, OUT_FEATURES))
    return nn.Sequential(*blocks), torch.randn(batch, IN_FEATURES)
