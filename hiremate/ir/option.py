"""Options: the ways one subgraph can be scheduled, as a menu for the level above.

An option (HiRemate, appendix B.1) is a pair of sub-schedules over the
subgraph's own CD-graph: the forward part runs the subgraph's forward and keeps some values
(the *phantom*) for the backward part; the backward part produces the gradients of the
subgraph's inputs. The level above sees only the costs recorded here.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, fields
from typing import Any

from hiremate.errors import FormatError
from hiremate.ir.schedule import Schedule, schedule_from_list, schedule_to_list


@dataclass(frozen=True, slots=True)
class Option:
    """One schedule of a subgraph, summarised for the level above.

    Times are in seconds. Memory figures are in bytes and exclude the subgraph's interface
    (its inputs, its outputs and the gradients that cross its boundary), which the level above
    accounts for itself:

    - ``fwd_peak`` / ``bwd_peak``: highest memory above the interface while the part runs;
    - ``phantom``: bytes kept from the end of the forward part to the start of the backward
      part (internal values the backward needs);
    - ``fwd_profile`` / ``bwd_profile``: memory above the interface after each step, which the
      correction terms of H-ILP (B.3) use.
    """

    fwd: Schedule
    bwd: Schedule
    fwd_time: float
    bwd_time: float
    fwd_peak: int
    bwd_peak: int
    phantom: int
    fwd_profile: tuple[int, ...] = ()
    bwd_profile: tuple[int, ...] = ()
    solver: str = ""

    @property
    def time(self) -> float:
        return self.fwd_time + self.bwd_time

    def dominates(self, other: "Option") -> bool:
        """At least as good on time, peaks and phantom, and better on one of them."""
        mine = (self.time, max(self.fwd_peak, self.bwd_peak), self.phantom)
        theirs = (other.time, max(other.fwd_peak, other.bwd_peak), other.phantom)
        return all(a <= b for a, b in zip(mine, theirs)) and mine != theirs


def pareto_front(options: list[Option]) -> list[Option]:
    """Options not dominated by another, duplicates removed, sorted by phantom then time."""
    unique: dict[tuple, Option] = {}
    for o in options:
        key = (o.time, o.fwd_peak, o.bwd_peak, o.phantom)
        unique.setdefault(key, o)
    kept = [o for o in unique.values() if not any(p.dominates(o) for p in unique.values())]
    return sorted(kept, key=lambda o: (o.phantom, o.time, max(o.fwd_peak, o.bwd_peak)))


# -- data-only form (caches store options as JSON, never as pickles) ------------------------------
_INT_FIELDS = ("fwd_peak", "bwd_peak", "phantom")
_TIME_FIELDS = ("fwd_time", "bwd_time")
_FIELDS = tuple(f.name for f in fields(Option))


def option_to_dict(option: Option) -> dict[str, Any]:
    """``option`` as plain JSON values (lists, ints, floats, strings); the inverse is
    :func:`option_from_dict`. Memory figures must be integers (numpy integers are accepted),
    times real numbers; anything else raises ``TypeError``."""
    out: dict[str, Any] = {"fwd": schedule_to_list(option.fwd),
                           "bwd": schedule_to_list(option.bwd)}
    for name in _TIME_FIELDS:
        out[name] = float(getattr(option, name))
    for name in _INT_FIELDS:
        out[name] = operator.index(getattr(option, name))
    for name in ("fwd_profile", "bwd_profile"):
        out[name] = [operator.index(v) for v in getattr(option, name)]
    out["solver"] = str(option.solver)
    return out


def option_from_dict(data: Any) -> Option:
    """The :class:`Option` that :func:`option_to_dict` wrote. The data may come from a file
    anyone could have written, so every field is checked: a missing, unknown or ill-typed one
    raises :class:`~hiremate.errors.FormatError`, and nothing in the data is ever executed."""
    if not isinstance(data, dict):
        raise FormatError(f"a stored option is a JSON object, got {type(data).__name__}")
    if set(data) != set(_FIELDS):
        raise FormatError(f"a stored option has the fields {sorted(_FIELDS)}, got "
                          f"{sorted(map(str, data))}; it was written by another version")
    try:
        fwd, bwd = schedule_from_list(data["fwd"]), schedule_from_list(data["bwd"])
    except ValueError as exc:
        raise FormatError(f"a stored option's schedule is malformed: {exc}") from exc
    for name in _TIME_FIELDS:
        if not _is_real(data[name]) or data[name] < 0:
            raise FormatError(f"a stored option's {name} is {data[name]!r}, not a time in "
                              "seconds")
    for name in _INT_FIELDS:
        if not _is_int(data[name]):
            raise FormatError(f"a stored option's {name} is {data[name]!r}, not a byte count")
    for name in ("fwd_profile", "bwd_profile"):
        if not isinstance(data[name], list) or not all(map(_is_int, data[name])):
            raise FormatError(f"a stored option's {name} is not a list of byte counts")
    if not isinstance(data["solver"], str):
        raise FormatError(f"a stored option's solver is {data['solver']!r}, not a name")
    return Option(fwd=fwd, bwd=bwd, fwd_time=float(data["fwd_time"]),
                  bwd_time=float(data["bwd_time"]), fwd_peak=data["fwd_peak"],
                  bwd_peak=data["bwd_peak"], phantom=data["phantom"],
                  fwd_profile=tuple(data["fwd_profile"]), bwd_profile=tuple(data["bwd_profile"]),
                  solver=data["solver"])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
