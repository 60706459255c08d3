"""Schedules: flat sequences of ``Compute`` and ``Delete`` steps over a CD-graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from hiremate.errors import InvalidScheduleError


@dataclass(frozen=True, slots=True)
class Compute:
    """Run compute node ``node`` (with ``option`` when the node stands for a subgraph)."""

    node: int
    option: int | None = None

    def __str__(self) -> str:
        return f"C{self.node}" if self.option is None else f"C{self.node}[{self.option}]"


@dataclass(frozen=True, slots=True)
class Delete:
    """Free data node ``data``."""

    data: int

    def __str__(self) -> str:
        return f"D{self.data}"


Step = Union[Compute, Delete]
Schedule = tuple[Step, ...]


def schedule_to_list(schedule: Schedule) -> list[list[int | str | None]]:
    """JSON-friendly form: ``[["C", node, option], ["D", data], ...]``."""
    out: list[list[int | str | None]] = []
    for step in schedule:
        if isinstance(step, Compute):
            out.append(["C", step.node, step.option])
        else:
            out.append(["D", step.data])
    return out


def schedule_from_list(items: list) -> Schedule:
    """Inverse of :func:`schedule_to_list`; a malformed step raises
    :class:`~hiremate.errors.InvalidScheduleError` naming it (the list may come from a file)."""
    if not isinstance(items, (list, tuple)):
        raise InvalidScheduleError(f"a schedule is a list of steps, got {type(items).__name__}; "
                                   "write it with schedule_to_list")
    steps: list[Step] = []
    for i, item in enumerate(items):
        if (isinstance(item, (list, tuple)) and len(item) == 3 and item[0] == "C"
                and _is_index(item[1]) and (item[2] is None or _is_index(item[2]))):
            steps.append(Compute(int(item[1]), None if item[2] is None else int(item[2])))
        elif isinstance(item, (list, tuple)) and len(item) == 2 and item[0] == "D" \
                and _is_index(item[1]):
            steps.append(Delete(int(item[1])))
        else:
            raise InvalidScheduleError(
                f"schedule step {i} is {item!r}, which is neither ['C', node, option or None] "
                "nor ['D', data] with non-negative integer indices; write schedules with "
                "schedule_to_list", step=i)
    return tuple(steps)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def recomputations(schedule: Schedule) -> int:
    """How many compute steps repeat a node already computed earlier in the schedule."""
    seen: set[int] = set()
    repeats = 0
    for step in schedule:
        if isinstance(step, Compute):
            repeats += step.node in seen
            seen.add(step.node)
    return repeats
