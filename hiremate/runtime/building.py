"""What a build prepares from the caller's sample and autograd state, and the training flags
it records: helpers of :class:`hiremate.HRockmate`'s builds."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree


def trainable_build() -> contextlib.ExitStack:
    """Autograd on and inference mode off while building: a wrapper built (or captured again)
    under ``no_grad`` or ``inference_mode`` is still made for training."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.inference_mode(False))
    stack.enter_context(torch.enable_grad())
    return stack


def traceable(sample: Any) -> Any:
    """``sample`` with its inference-mode tensors copied: those cannot be traced, copies can."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.clone() if t.is_inference() else t,
                                dict(sample) if isinstance(sample, Mapping) else sample)


def training_modes(model: torch.nn.Module) -> list[bool]:
    """Every module's training flag, in ``modules()`` order: the mode a graph was captured in."""
    return [m.training for m in model.modules()]
