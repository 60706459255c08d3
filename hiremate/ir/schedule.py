"""Schedules: flat sequences of ``Compute`` and ``Delete`` steps over a CD-graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


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
    steps: list[Step] = []
    for item in items:
        if item[0] == "C":
            steps.append(Compute(int(item[1]), None if item[2] is None else int(item[2])))
        elif item[0] == "D":
            steps.append(Delete(int(item[1])))
        else:
            raise ValueError(f"unknown schedule step {item!r}")
    return tuple(steps)


def recomputations(schedule: Schedule) -> int:
    """How many compute steps repeat a node already computed earlier in the schedule."""
    seen: set[int] = set()
    repeats = 0
    for step in schedule:
        if isinstance(step, Compute):
            repeats += step.node in seen
            seen.add(step.node)
    return repeats
