"""A disk cache for option menus and solved schedules.

Menus of a block depend only on the block's canonical CD-graph (structure, sizes, measured
costs: :func:`graph_key`) and on the solver's configuration, so they can be reused across runs,
models that share blocks, and budgets. An entry is one pickle file named by the SHA-256 of its
key; writes go through a temporary file and a rename, so a crash never leaves half an entry.
A file that cannot be read (corrupted, truncated, from an incompatible version) is reported with
a warning, removed and treated as a miss: the caller solves again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import tempfile
import warnings
from pathlib import Path
from typing import Any

from hiremate.errors import CacheWarning

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: entries hold their key, checked before use


def default_cache_dir() -> Path:
    env = os.environ.get("HIREMATE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "hiremate"


class MenuCache:
    """``get(key)`` / ``put(key, value)`` for JSON-able keys; ``enabled=False`` does nothing."""

    def __init__(self, directory: str | Path | None = None, enabled: bool = True):
        self.enabled = enabled
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key_text(key: Any) -> str:
        return json.dumps({"v": CACHE_VERSION, "key": key}, sort_keys=True, default=str)

    def path(self, key: Any) -> Path:
        digest = hashlib.sha256(self.key_text(key).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.pkl"

    def get(self, key: Any) -> Any | None:
        if not self.enabled:
            return None
        path = self.path(key)
        if not path.is_file():
            self.misses += 1
            return None
        try:
            with path.open("rb") as fh:
                payload = pickle.load(fh)
            # an entry is used only for the key it was written for (a file copied or renamed
            # into place, or written by another version, is not)
            if not isinstance(payload, dict) or payload.get("key") != self.key_text(key):
                raise ValueError("it was written for another key")
            value = payload["value"]
        except Exception as exc:  # corrupted entry: warn, drop it, solve again
            warnings.warn(f"hiremate cache entry {path} is unreadable ({exc}); it is removed "
                          "and the result solved again", CacheWarning, stacklevel=2)
            try:
                path.unlink()
            except OSError:
                pass
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, key: Any, value: Any) -> None:
        if not self.enabled:
            return
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                pickle.dump({"key": self.key_text(key), "value": value}, fh,
                            protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write hiremate cache entry %s: %s", path, exc)
