"""Where hiremate keeps what it computes once and reuses: menus, fitted cost coefficients."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


def default_cache_dir() -> Path:
    """``$HIREMATE_CACHE``, else ``~/.cache/hiremate``."""
    env = os.environ.get("HIREMATE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "hiremate"


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (made if missing) for the block: processes
    that would compute the same cached result wait for the one computing it. Where no lock can
    be taken (an unwritable directory, a system without ``fcntl``) the block runs unlocked:
    the result is then computed more than once, never wrong (its file is written atomically)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+b")
    except OSError:
        yield
        return
    with handle:  # closing the file releases its lock
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
