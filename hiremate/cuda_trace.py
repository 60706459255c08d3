"""The CUDA caching allocator's own record of allocations, for the two places that read it.

Capture (each op's scratch, :mod:`hiremate.graphbuilder.costs.memory`) and measurement (a
step's peak, :mod:`hiremate.runtime.measurement`) both need to know *which* blocks were
allocated and freed, in order, not only the allocator's running totals: a parameter gradient
is memory no budget counts, and the totals cannot say whether it was allocated before or after
an op's peak. The allocator's history (a private PyTorch API) says; this module is the one
place that turns it on and off and reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


def record_cuda_history(device: torch.device, enabled: bool) -> bool:
    """Start or stop recording ``device``'s allocator history. Started, it says whether the
    history began empty (torch versions without ``clear_history`` keep what came before).
    Raises whatever the private API raises where it is missing or refuses."""
    from torch.cuda import memory as cuda_memory

    if not enabled:
        cuda_memory._record_memory_history(enabled=None, device=device)
        return False
    try:
        cuda_memory._record_memory_history(
            enabled="all", context=None, stacks="python", device=device, clear_history=True,
            skip_actions=["free_requested", "segment_alloc", "segment_free", "snapshot"],
        )
        return True
    except TypeError:  # an older signature: no skip_actions (the trace is then longer)
        pass
    try:
        cuda_memory._record_memory_history(enabled="all", context=None, stacks="python",
                                           device=device, clear_history=True)
        return True
    except TypeError:  # older still: no clear_history
        cuda_memory._record_memory_history(enabled="all", context=None, device=device)
        return False


def device_trace(device: torch.device) -> list[Mapping[str, Any]]:
    """The recorded history of ``device`` (an indexed CUDA device) since recording started."""
    return torch.cuda.memory._snapshot(device)["device_traces"][device.index]


def events_from_cuda_trace(trace: Iterable[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """``(address, bytes)`` events from one device trace of ``torch.cuda.memory._snapshot()``.

    ``alloc`` adds a block, ``free_completed`` removes it (that is when the caching allocator's
    allocated-bytes statistic drops; ``free_requested`` only marks a block whose stream use is
    still pending). Segment actions move reserved, not allocated, memory and are ignored.
    """
    events: list[tuple[int, int]] = []
    for entry in trace:
        action = entry.get("action")
        if action == "alloc":
            events.append((int(entry["addr"]), int(entry["size"])))
        elif action == "free_completed":
            events.append((int(entry["addr"]), -int(entry["size"])))
    return events
