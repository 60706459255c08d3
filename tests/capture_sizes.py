"""Sizes, sample makers and losses shared by the capture table's model builders
(``capture_zoo.py`` for the Hugging Face and timm models, ``capture_zoo_torch.py`` for the ones
written here in plain PyTorch): tiny sizes, float64 samples, one loss per kind of output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

VOCAB = 128
SEQ = 16
BATCH = 2
WIDTH = 32
HEADS = 4
LAYERS = 2
FFN = 64
IMAGE = 16
PATCH = 4

Built = tuple[nn.Module, Any, Callable[[Any], torch.Tensor]]


class Unavailable(Exception):
    """A case's dependency cannot be imported; the message says which and why."""


def _tokens(length: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, length))


def _pixels(channels: int = 3, size: int = IMAGE) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, dtype=torch.float64)


def logits_sum(out: Any) -> torch.Tensor:
    return out.logits.sum()


def last_hidden_sum(out: Any) -> torch.Tensor:
    return out.last_hidden_state.sum()


def model_loss(out: Any) -> torch.Tensor:
    return out.loss


def tensor_sum(out: torch.Tensor) -> torch.Tensor:
    return out.sum()
