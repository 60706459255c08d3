"""Keeping the library quiet: native code's console output, and progress bars.

The library reports through :mod:`logging` only. Some of the native code it calls writes to the
process's file descriptors directly, below Python's ``sys.stdout``: HiGHS prints a banner when
its first solver object is created, and the PyTorch profiler (kineto) prints a line when it
starts and when it stops (and torch's allocator may warn while it runs). Neither has a switch
that takes effect at that moment, so :func:`silenced_fds` points the descriptors at a temporary
file for the duration of such a call and hands whatever was written there to the debug log
instead of the console.

This module sits at the bottom of the package (standard library only), so that every stage may
use it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import threading
import warnings
from typing import Any, Iterator

from hiremate.errors import ConfigError

log = logging.getLogger(__name__)

#: the values ``Config.progress`` accepts: on, off, or on only when stderr is a terminal
PROGRESS_CHOICES = (True, False, "auto")

_lock = threading.RLock()
_depth = 0
_libc: Any = None


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers, so that text a native library printed before (or
    while) the descriptors were swapped lands where the descriptor pointed at that time."""
    global _libc
    try:
        if _libc is None:
            import ctypes

            _libc = ctypes.CDLL(None)
        _libc.fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library to reach (some platforms)
        _libc = False


def _flush_python() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing to keep
            pass


@contextlib.contextmanager
def silenced_fds(fds: tuple[int, ...] = (1, 2), what: str = "native code") -> Iterator[None]:
    """Within the block, what is written to the file descriptors ``fds`` goes to a temporary
    file, then to the debug log (as lines of ``what``), not to the console.

    For calls into native code that prints (HiGHS's banner, the profiler's lines), kept short:
    another thread's output to those descriptors is diverted meanwhile too (to the same debug
    log). Nested and concurrent uses are serialised: only the outermost one swaps the
    descriptors."""
    global _depth
    with _lock:
        if _depth > 0:
            _depth += 1
            try:
                yield
            finally:
                _depth -= 1
            return
        _flush_python()
        _flush_c_stdio()
        saved: list[tuple[int, int]] = []
        sink = tempfile.TemporaryFile()
        try:
            for fd in fds:
                try:
                    saved.append((fd, os.dup(fd)))
                except OSError:  # that descriptor is not open: nothing to divert
                    continue
                os.dup2(sink.fileno(), fd)
            _depth = 1
            try:
                yield
            finally:
                _depth = 0
                _flush_python()
                _flush_c_stdio()
                for fd, copy in saved:
                    os.dup2(copy, fd)
                    os.close(copy)
                saved.clear()
                sink.seek(0)
                _debug_lines(what, sink.read().decode(errors="replace"))
        finally:
            for fd, copy in saved:  # only when swapping the descriptors failed half-way
                os.dup2(copy, fd)
                os.close(copy)
            sink.close()


def _debug_lines(what: str, text: str) -> None:
    """Each non-blank line of ``text`` (diverted console output) to the debug log."""
    for line in text.splitlines():
        if line.strip():
            log.debug("%s: %s", what, line.rstrip())


class QuietContext:
    """A context manager (a profiler) run with the descriptors ``fds`` diverted by
    :func:`silenced_fds` from its entry to its exit, body included: besides its start and
    stop lines, torch's allocator warns on stderr, from native code, when a block allocated
    before profiling is freed during it."""

    def __init__(self, inner: Any, what: str, fds: tuple[int, ...] = (2,)) -> None:
        self.inner = inner
        self.what = what
        self.fds = fds
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(silenced_fds(self.fds, self.what))
        # and its Python-level notices (torch 2.11's profiler warns that it clears its events
        # at the end of each cycle, which is what we want)
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.profiler")
        try:
            value = self.inner.__enter__()
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return value

    def __exit__(self, exc_type, exc, tb) -> Any:
        stack, self._stack = self._stack, None
        try:
            return self.inner.__exit__(exc_type, exc, tb)
        finally:
            if stack is not None:
                stack.close()


def check_progress(value: Any) -> None:
    """Raise :class:`hiremate.ConfigError` (a ``ValueError``) unless ``value`` is one of
    :data:`PROGRESS_CHOICES`."""

    if not any(value is c if isinstance(c, bool) else value == c for c in PROGRESS_CHOICES):
        raise ConfigError(f"progress must be true, false or 'auto', got {value!r}")


def show_progress(progress: Any) -> bool:
    """Whether a progress bar is drawn: ``True`` / ``False`` as given; ``"auto"`` only when
    stderr (where the bars go) is a terminal, so that logs and pipes stay clean."""
    if progress == "auto":
        try:
            return bool(sys.stderr is not None and sys.stderr.isatty())
        except (AttributeError, ValueError):
            return False
    return bool(progress)


class _ToDebugLog(logging.Filter):
    """A logger filter that hands each record to this module's debug log instead."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def filter(self, record: logging.LogRecord) -> bool:
        first = record.getMessage().strip().splitlines()
        log.debug("%s (%s): %s", self.what, record.name, first[0] if first else "")
        return False


@contextlib.contextmanager
def diverted_logger(name: str, what: str) -> Iterator[None]:
    """Within the block, records of the logger ``name`` and of its descendants that exist at
    entry go to the debug log (first line only) instead of their handlers. torch writes its
    log to stderr through a handler of its own, and a failed ``torch.export`` warns there
    (symbolic shapes: "Unable to find user code ..."): noise before the error hiremate raises
    with the cause. The filter sits on the loggers, not on torch's handler, which torch may
    replace meanwhile."""
    divert = _ToDebugLog(what)
    loggers = [logging.getLogger(name)] + [
        logger for key, logger in list(logging.root.manager.loggerDict.items())
        if key.startswith(name + ".") and isinstance(logger, logging.Logger)]
    for logger in loggers:
        logger.addFilter(divert)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(divert)


@contextlib.contextmanager
def diverted_stderr(what: str) -> Iterator[None]:
    """Within the block, what Python code writes to ``sys.stderr`` goes to the debug log (as
    lines of ``what``). For a library call that prints there (a failed ``torch.export``
    prints its partial graph); logging handlers keep the stream they were made with."""
    sink = io.StringIO()
    with contextlib.redirect_stderr(sink):
        try:
            yield
        finally:
            _debug_lines(what, sink.getvalue())


_LOGGED_ONCE: set[str] = set()


def log_once(logger: logging.Logger, key: str, level: int, msg: str, *args: Any) -> None:
    """``logger.log(level, msg, *args)`` the first time ``key`` is met in this process: a
    remark about a model (its cache switch, an output the wrapper drops) said once, not at
    every build or re-capture."""
    if key not in _LOGGED_ONCE:
        _LOGGED_ONCE.add(key)
        logger.log(level, msg, *args)
