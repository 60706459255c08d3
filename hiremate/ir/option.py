"""Options: the ways one subgraph can be scheduled, as a menu for the level above.

An option (``papers/hiremate-hierarchical.txt`` B.1) is a pair of sub-schedules over the
subgraph's own CD-graph: the forward part runs the subgraph's forward and keeps some values
(the *phantom*) for the backward part; the backward part produces the gradients of the
subgraph's inputs. The level above sees only the costs recorded here.
"""

from __future__ import annotations

from dataclasses import dataclass

from hiremate.ir.schedule import Schedule


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
