"""Abandoning a HiGHS solve whose answer is no longer wanted.

Why: the composer may start the flat H-ILP on a second thread before it knows whether it will
need the answer (:mod:`hiremate.composer.early`); when it turns out not to, waiting for the
MILP's work limit would cost the wall-clock time that starting early saved. HiGHS releases the
GIL while it solves and checks for a user interrupt at its simplex, interior-point and MIP
interrupt points, so a flag set from another thread stops it within seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class SolveCancelled(Exception):
    """A solve stopped because its caller no longer wants the answer (:func:`cancellable`)."""


_local = threading.local()


@contextmanager
def cancellable(event: threading.Event) -> Iterator[None]:
    """Within it, an in-process HiGHS solve on this thread stops soon after ``event`` is set and
    raises :class:`SolveCancelled` instead of returning (a result cut short by the interrupt
    would depend on the moment, so none is returned)."""
    _local.event = event
    try:
        yield
    finally:
        _local.event = None


def watch_cancel(highs: Any) -> threading.Event | None:
    """Make the HiGHS object ``highs`` stop at its next interrupt check once this thread's
    :func:`cancellable` event is set; return that event (None outside :func:`cancellable`).
    Raises :class:`SolveCancelled` when the event is set already."""
    event = getattr(_local, "event", None)
    if event is None:
        return None
    if event.is_set():
        raise SolveCancelled("the solve was cancelled before it started")
    import highspy

    def interrupt(_kind, _message, _data_out, data_in, _user) -> None:
        if event.is_set():
            data_in.user_interrupt = True

    highs.setCallback(interrupt, None)
    kinds = highspy.cb.HighsCallbackType
    for kind in (kinds.kCallbackMipInterrupt, kinds.kCallbackSimplexInterrupt,
                 kinds.kCallbackIpmInterrupt):
        highs.startCallback(kind)
    return event
