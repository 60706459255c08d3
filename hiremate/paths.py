"""Where hiremate keeps what it computes once and reuses: menus, fitted cost coefficients."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$HIREMATE_CACHE``, else ``~/.cache/hiremate``."""
    env = os.environ.get("HIREMATE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "hiremate"
