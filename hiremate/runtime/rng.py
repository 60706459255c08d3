"""Random-number state for recomputation: a recomputed random node draws what it drew first.

Before the first execution of a random node the executor saves the generator states (CPU and
the CUDA generator of the device in use); a recomputation sets them back, runs the node, and
restores the states the generators had just before, so the global random state at the end of
a call is the one eager PyTorch leaves (the first executions follow the graph's order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class CallState:
    """State of one call of a :class:`hiremate.runtime.executor.RematModule`: saved RNG states."""

    cuda_device: int | None = None
    rng: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    #: copies of buffers from before the forward wrote them (hiremate.ir.buffer_writes)
    snap: dict[int, Any] = field(default_factory=dict)


def _states(call: CallState) -> tuple[Any, Any]:
    cuda = (torch.cuda.get_rng_state(call.cuda_device) if call.cuda_device is not None
            else None)
    return torch.get_rng_state(), cuda


def generator_states(cuda_device: int | None) -> tuple[Any, Any]:
    """The CPU generator's state and the CUDA device's (None without one): what
    :func:`set_generator_states` puts back."""
    return _states(CallState(cuda_device))


def set_generator_states(cuda_device: int | None, states: tuple[Any, Any]) -> None:
    _set(CallState(cuda_device), states)


def _set(call: CallState, states: tuple[Any, Any]) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, call.cuda_device)


def rng_save(call: CallState, k: int) -> None:
    """Before the first execution of random node number ``k``."""
    call.rng[k] = _states(call)


def rng_replay(call: CallState, k: int) -> tuple[CallState, tuple[Any, Any]]:
    """Before a recomputation of random node ``k``: returns what :func:`rng_restore` needs."""
    current = _states(call)
    _set(call, call.rng[k])
    return call, current


def rng_restore(token: tuple[CallState, tuple[Any, Any]]) -> None:
    """After a recomputation: the generators continue where they were."""
    call, states = token
    _set(call, states)


def rng_release(call: CallState, k: int) -> None:
    """After the last recomputation of random node ``k``: its saved states (a few KiB each) are
    not needed any more."""
    call.rng.pop(k, None)
