"""Module hooks and the captured program.

A capture runs the model's forward hooks, and the backward hooks of its modules
(``register_full_backward_hook`` and its pre-hook form), on traced values: what a hook returns
becomes part of the program (a backward hook that scales a gradient is captured), but what it
does besides (keeping an activation for a feature loss, logging a gradient's norm) happens once,
on traced values, and never at a call, where the captured program runs instead of the modules.
torch's own hooks (the pre-hooks of the old ``weight_norm`` and ``spectral_norm``) only
compute, and are not counted.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.nn.modules import module as _module


def user_module_hooks(modules: Iterable[torch.nn.Module]) -> int:
    """How many forward and backward hooks and pre-hooks, global ones included, on ``modules``
    that torch itself did not register."""
    tables = [_module._global_forward_hooks, _module._global_forward_pre_hooks,
              _module._global_backward_hooks, _module._global_backward_pre_hooks]
    for m in modules:
        own = (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks, m._backward_pre_hooks)
        tables += [table for table in own if table]
    return sum(1 for table in tables for hook in table.values() if not _torch_own(hook))


def _torch_own(hook: Any) -> bool:
    origin = getattr(hook, "__module__", None) or type(hook).__module__
    return origin == "torch" or origin.startswith("torch.")
