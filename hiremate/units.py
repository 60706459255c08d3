"""Byte sizes: formatting for messages and parsing of user-given budgets."""

from __future__ import annotations

import math
import re

from hiremate.errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def fmt_bytes(n: float) -> str:
    """Human-readable size with binary units, e.g. ``fmt_bytes(3 * 2**20) == '3.00 MiB'``."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return str(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str) -> int:
    """Parse ``"512MiB"``, ``"2GB"``, ``"1.5 GiB"`` or ``"1000"`` into a number of bytes."""
    match = _PATTERN.match(text) if isinstance(text, str) else None
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(
            f"cannot read {text!r} as a memory size; write a number with an optional unit, "
            f"e.g. '512MiB', '2GB' or '1000000' (units: {', '.join(u for u in _UNITS if u)})"
        )
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    return int(round(value))
