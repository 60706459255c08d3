"""A disk cache for option menus and solved schedules.

Menus of a block depend only on the block's canonical CD-graph (structure, sizes, measured
costs: :func:`graph_key`) and on the solver's configuration, so they can be reused across runs,
models that share blocks, and budgets. An entry is one JSON file named by the SHA-256 of its
key; writes go through a temporary file and a rename, so a crash never leaves half an entry.

Entries hold data only. A cache directory may be shared (a team's, a cluster's), and whoever
can write into it could otherwise run code in every process that reads it, as a pickle would
allow; a JSON file can only ever be data. The values are plain JSON, and the converters here
(:func:`encode_menu` / :func:`decode_menu`, :func:`encode_solve` / :func:`decode_solve`,
:func:`decode_pool`) check every field of what they read back.

A file that cannot be used (not JSON, another format or version, written for another key,
fields of the wrong kind) is reported with a warning, removed and treated as a miss: the caller
solves again. Entries of the pickle format of earlier versions are never opened: one found for
a key being looked up is reported and removed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import numbers
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

from hiremate.errors import CacheWarning, FormatError
from hiremate.ir.option import Option, option_from_dict, option_to_dict
from hiremate.ir.schedule import Schedule, schedule_from_list, schedule_to_list
from hiremate.paths import default_cache_dir

log = logging.getLogger(__name__)

#: 3: JSON entries (data only); 2: pickles that held their key (never read again)
CACHE_VERSION = 3
FORMAT = "hiremate-cache"
_LEGACY_VERSION = 2
#: the subpackages whose code decides a menu or a schedule (the graph's own key covers capture)
_SOLVING_PACKAGES = ("hiremate.ir", "hiremate.composer", "hiremate.partition", "hiremate.solvers")


@functools.lru_cache(maxsize=1)
def solving_code_revision() -> str:
    """A digest of the source of :data:`_SOLVING_PACKAGES`, part of every key.

    A menu or a schedule cached by other solver code would stay valid but could be worse
    than what this code finds (or, after a change of the options' meaning, wrong), and a
    version number is not bumped at every change; the digest is, so upgrading hiremate or
    editing a solver makes the old entries misses. Without readable sources (a frozen
    install), the package version stands in."""
    digest = hashlib.sha256()
    for package in _SOLVING_PACKAGES:
        spec = importlib.util.find_spec(package)
        roots = [Path(r) for r in spec.submodule_search_locations or []] if spec else []
        files = [(root, path) for root in roots for path in sorted(root.rglob("*.py"))]
        if not files:
            from hiremate import __version__
            return f"version-{__version__}"
        for root, path in files:
            digest.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class MenuCache:
    """``get(key)`` / ``put(key, value)`` for JSON-able keys and values; ``enabled=False``
    does nothing. ``get(key, decode)`` passes the stored value through ``decode``, which
    checks it and builds the caller's objects; whatever it raises makes the entry a miss."""

    def __init__(self, directory: str | Path | None = None, enabled: bool = True):
        self.enabled = enabled
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key_text(key: Any, version: int = CACHE_VERSION) -> str:
        if version == _LEGACY_VERSION:
            return json.dumps({"v": version, "key": key}, sort_keys=True, default=str)
        return json.dumps({"v": version, "code": solving_code_revision(), "key": key},
                          sort_keys=True, default=str)

    def path(self, key: Any) -> Path:
        digest = hashlib.sha256(self.key_text(key).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.json"

    def legacy_path(self, key: Any) -> Path:
        """Where the pickle format of earlier versions kept ``key``'s entry."""
        digest = hashlib.sha256(self.key_text(key, _LEGACY_VERSION).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.pkl"

    def get(self, key: Any, decode: Callable[[Any], Any] | None = None) -> Any | None:
        if not self.enabled:
            return None
        path = self.path(key)
        if not path.is_file():
            self._drop_legacy(key)
            self.misses += 1
            return None
        try:
            payload = json.loads(path.read_bytes().decode("utf-8"))
            if not isinstance(payload, dict) or payload.get("format") != FORMAT \
                    or payload.get("version") != CACHE_VERSION:
                raise FormatError(f"it is not a {FORMAT} file of version {CACHE_VERSION}")
            # an entry is used only for the key it was written for (a file copied or renamed
            # into place is not)
            if payload.get("key") != self.key_text(key):
                raise FormatError("it was written for another key")
            value = payload["value"]
            if decode is not None:
                value = decode(value)
        except Exception as exc:  # unusable entry: warn, drop it, solve again
            warnings.warn(f"hiremate cache entry {path} is unreadable ({exc}); it is removed "
                          "and the result solved again", CacheWarning, stacklevel=2)
            _unlink(path)
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` (JSON values: dicts with string keys, lists, strings, numbers,
        booleans, None) under ``key``; a value that is not data is logged and not stored."""
        if not self.enabled:
            return
        path = self.path(key)
        payload = {"format": FORMAT, "version": CACHE_VERSION, "key": self.key_text(key),
                   "value": value}
        try:
            text = json.dumps(payload, default=_plain)
        except (TypeError, ValueError) as exc:
            log.warning("hiremate cache entry %s not stored: the value is not plain data (%s)",
                        path, exc)
            return
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(text.encode("utf-8"))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write hiremate cache entry %s: %s", path, exc)
            if tmp is not None:
                _unlink(Path(tmp))

    def _drop_legacy(self, key: Any) -> None:
        legacy = self.legacy_path(key)
        if legacy.is_file():
            warnings.warn(f"hiremate cache entry {legacy} is in the pickle format of an earlier "
                          "version, which is never loaded (a pickle can run code); it is "
                          "removed and the result solved again", CacheWarning, stacklevel=3)
            _unlink(legacy)


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars (and other number types): their Python value."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON data")


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


# -- what the composer stores -----------------------------------------------------------------
def encode_menu(options: list[Option], error: str) -> dict[str, Any]:
    """A block's menu from one solver (its options and its error text, '' when fine)."""
    return {"options": [option_to_dict(o) for o in options], "error": str(error)}


def decode_menu(value: Any) -> tuple[list[Option], str]:
    """Inverse of :func:`encode_menu`; raises :class:`FormatError` on anything else."""
    if not isinstance(value, dict) or set(value) != {"options", "error"} \
            or not isinstance(value["options"], list) or not isinstance(value["error"], str):
        raise FormatError("a menu entry is {'options': [...], 'error': str}")
    return [option_from_dict(o) for o in value["options"]], value["error"]


def encode_solve(schedule: Schedule, report: dict[str, Any]) -> dict[str, Any]:
    """A solved schedule with its report (JSON values, string keys)."""
    return {"schedule": schedule_to_list(schedule), "report": report}


def decode_solve(value: Any) -> tuple[Schedule, dict[str, Any]]:
    """Inverse of :func:`encode_solve`; raises :class:`FormatError` on anything else."""
    if not isinstance(value, dict) or set(value) != {"schedule", "report"} \
            or not isinstance(value["report"], dict):
        raise FormatError("a solve entry is {'schedule': [...], 'report': {...}}")
    try:
        return schedule_from_list(value["schedule"]), value["report"]
    except ValueError as exc:
        raise FormatError(f"a solve entry's schedule is malformed: {exc}") from exc


def encode_pool(entries: list[tuple[Schedule, int, float, str]]) -> list[dict[str, Any]]:
    """A schedule pool: (schedule, simulated peak, simulated time, source) per entry."""
    return [{"schedule": schedule_to_list(s), "source": str(src), "peak": int(peak),
             "time": float(t)} for s, peak, t, src in entries]


def decode_pool(value: Any) -> list[tuple[Schedule, str]]:
    """Inverse of :func:`encode_pool`, kept to (schedule, source): the figures are simulated
    again with the graph at hand. Malformed items are skipped with a log line (the rest of the
    pool stays usable); anything but a list raises :class:`FormatError`."""
    if not isinstance(value, list):
        raise FormatError("a schedule pool entry is a list")
    out = []
    for item in value:
        try:
            if not isinstance(item, dict) or not isinstance(item.get("source", ""), str):
                raise FormatError(f"pool item {item!r:.80} is not a schedule record")
            out.append((schedule_from_list(item["schedule"]), item.get("source", "pool")))
        except (KeyError, ValueError) as exc:
            log.warning("schedule pool item unreadable (%s); skipped", exc)
    return out


class CallCache(MenuCache):
    """The cache of one :func:`hiremate.api.solve_graph` call when the disk cache is off:
    entries live in memory and die with the call. Why: a whole-step solve may solve the same
    graph again at a lower budget (the loss's memory, the generator states), and its menus do
    not depend on the budget, so a retry need not solve every subgraph again
    (docs/results-history.md, GPT-96). Values go through JSON as on disk, so every reader
    decodes exactly what it would have read from a file. ``enabled`` stays False: the schedule
    pool and schedule reuse, which carry schedules from one budget to another, remain off as the
    caller asked; only what ``get`` and ``put`` hold (menus, per-budget answers) is kept."""

    def __init__(self) -> None:
        super().__init__(directory=None, enabled=False)
        self._entries: dict[str, str] = {}

    def get(self, key: Any, decode: Callable[[Any], Any] | None = None) -> Any | None:
        text = self._entries.get(self.key_text(key))
        if text is None:
            self.misses += 1
            return None
        self.hits += 1
        value = json.loads(text)
        return decode(value) if decode is not None else value

    def put(self, key: Any, value: Any) -> None:
        try:
            self._entries[self.key_text(key)] = json.dumps(value, default=_plain)
        except (TypeError, ValueError) as exc:
            log.debug("in-memory cache entry not stored: the value is not plain data (%s)", exc)
