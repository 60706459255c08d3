"""Option menus for a subgraph, and the choice of options for the level above.

A subgraph's CD-graph has its own loss node, standing for the rest of the model. Solving it
over a grid of ``(M_peak, M_save)`` budgets gives schedules; each splits at the loss step into
a forward part (steps before it) and a backward part (steps after it), summarised as an
:class:`~hiremate.ir.option.Option` (HiRemate, appendix B.1). Only the
Pareto-optimal, distinct ones are kept.

Option figures, relative to the interface (what the level above accounts for itself):
``O`` = counted bytes of the subgraph's outputs (``graph.outputs``), ``G`` = of the loss node's
outputs (gradients of the outputs), ``F`` = of the final values (input gradients).

- ``phantom`` = memory held just before the loss step, minus ``O``;
- ``fwd_peak`` = highest memory (``simulate``'s model, during or after a step) over the forward
  part, minus ``O``; ``bwd_peak`` = the same over the backward part, minus ``O + G + F`` and
  minus the phantom (which the level above holds while the backward runs); both clipped at 0;
- profiles: memory after each step of the part, minus the same interface (not clipped).

Option selection (section 3.2, "Schedule selection"): a total of ``N_o`` options is shared
between the nodes in proportion to their number of basic operations, and each node keeps the
options whose peaks are farthest apart: the highest peak, the lowest, the one nearest the
middle, and so on (farthest-point order).
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

import numpy as np

from hiremate.errors import InfeasibleBudgetError, SolverError
from hiremate.ir.graph import Graph
from hiremate.ir.option import Option, pareto_front
from hiremate.ir.schedule import Compute, Schedule
from hiremate.ir.simulator import autodiff_schedule, simulate, trace
from hiremate.ir.tracker import counted_sizes

log = logging.getLogger(__name__)


def output_bytes(graph: Graph) -> int:
    """Counted bytes of the subgraph's outputs: the least memory held at its loss step (the
    lowest save of :func:`budget_grid`, the ``O`` of the module docstring)."""
    counted = counted_sizes(graph)
    return sum(counted[d] for d in set(graph.outputs))


def step_memory(graph: Graph, schedule: Schedule) -> tuple[list[int], list[int]]:
    """Per step: the highest memory while it runs, and the memory after it (the simulator's
    :func:`~hiremate.ir.simulator.trace`, as lists)."""
    tr = trace(graph, schedule)
    return list(tr.during), list(tr.after)


def option_from_schedule(graph: Graph, schedule: Schedule, solver: str = "") -> Option:
    """Split ``schedule`` at its loss step and summarise both parts (see module docstring)."""
    sim = simulate(graph, schedule, trace=True).raise_if_invalid()
    cut = schedule.index(Compute(graph.loss))
    fwd, bwd = schedule[:cut], schedule[cut + 1:]
    counted = counted_sizes(graph)
    out_b = output_bytes(graph)
    grad_b = sum(counted[d] for d in graph.nodes[graph.loss].outputs)
    final_b = sum(counted[d] for d in graph.final_data)
    during, after = sim.trace.during, sim.trace.after
    held = after[cut - 1] if cut else 0
    phantom = max(held - out_b, 0)
    fwd_peak = max(during[:cut], default=0) - out_b
    iface_b = out_b + grad_b + final_b
    bwd_peak = max(during[cut + 1:], default=0) - iface_b - phantom
    times = [graph.nodes[s.node].time if isinstance(s, Compute) else 0.0 for s in schedule]
    return Option(
        fwd=fwd, bwd=bwd, fwd_time=sum(times[:cut]), bwd_time=sum(times[cut + 1:]),
        fwd_peak=max(fwd_peak, 0), bwd_peak=max(bwd_peak, 0), phantom=phantom,
        fwd_profile=tuple(a - out_b for a in after[:cut]),
        bwd_profile=tuple(a - iface_b for a in after[cut + 1:]), solver=solver,
    )


def checkpointed(graph: Graph, again: Sequence[int], solver: str = "") -> Option:
    """The option whose forward part runs every forward node once and keeps only the
    subgraph's outputs, and whose backward part runs the compute nodes ``again`` (ids, in
    order: a recomputation of the forward, then the backward). With ``again`` another option's
    steps, this is that option behind a checkpoint: phantom-free, for one plain forward more,
    at about its peak (the output gradients arrive before the recomputation). The
    recomputations nothing reads go (:func:`~hiremate.ir.sequence.drop_unused_recomputations`:
    the first forward's outputs are kept to the end, and a value only the forward read is not
    needed by the backward)."""
    from hiremate.ir.sequence import drop_unused_recomputations, sequence_to_schedule

    seq = [n.id for n in graph.fwd_nodes] + [graph.loss] + list(again)
    schedule = drop_unused_recomputations(graph, sequence_to_schedule(graph, seq))
    return option_from_schedule(graph, schedule, solver)


def option_steps(option: Option) -> list[int]:
    """The compute nodes ``option`` runs, forward part then backward part."""
    return [s.node for s in (*option.fwd, *option.bwd) if isinstance(s, Compute)]


def budget_grid(graph: Graph, n_peak: int = 4, n_save: int = 3) -> list[tuple[int, int]]:
    """``n_peak x n_save`` budgets: peaks evenly spaced above the least memory any schedule needs up
    to what the store-everything schedule uses (peak, and memory held before the loss)."""
    from hiremate.ir.tracker import memory_floor

    ad = autodiff_schedule(graph)
    tr = trace(graph, ad)
    peak_hi = tr.peak
    cut = ad.index(Compute(graph.loss))
    save_hi = tr.after[cut - 1] if cut else 0
    save_lo = output_bytes(graph)
    peak_lo = memory_floor(graph)
    # the memory floor is left out of the peaks: a budget there is almost never feasible and a
    # MILP takes long to prove it (the composers add each block's checkpoint option, the least
    # memory a block can do with); the lowest save stays (options keeping only the outputs
    # are what lets the level above free a block's values and get them back cheaply)
    peaks = np.unique(np.linspace(peak_lo, peak_hi, max(n_peak, 1) + 1)[1:].round().astype(int))
    saves = np.unique(np.linspace(save_lo, save_hi, max(n_save, 1)).round().astype(int))
    return [(int(p), int(s)) for p in peaks for s in saves]


def grid_peaks(budgets: Iterable[tuple[int, int]]) -> list[int]:
    """The distinct peaks of ``(peak, save)`` budgets, lowest first: a menu solved in parts
    has one part per peak."""
    return sorted({int(p) for p, _ in budgets})


def part_of(budgets: Iterable[tuple[int, int]], part: int) -> list[tuple[int, int]]:
    """The budgets of the ``part``-th peak (:func:`grid_peaks`)."""
    budgets = list(budgets)
    peak = grid_peaks(budgets)[part]
    return [b for b in budgets if int(b[0]) == peak]


def loosest_first(budgets: Sequence) -> list[int]:
    """Indices of ``budgets`` (int peaks or ``(peak, save)`` pairs) in the order to solve
    them: peaks in their given order, the saves of one peak loosest first (no save bound
    before any), so that a budget proved infeasible settles the tighter ones after it
    (:class:`InfeasibleBudgets`) without their MILPs. A result never depends on this order:
    the options are gathered back in the given order."""
    first_seen: dict[int, int] = {}
    for b in budgets:
        first_seen.setdefault(_peak_save(b)[0], len(first_seen))

    def key(i: int) -> tuple:
        peak, save = _peak_save(budgets[i])
        return (first_seen[peak], save is not None, -(save or 0), i)

    return sorted(range(len(budgets)), key=key)


def _peak_save(b) -> tuple[int, int | None]:
    if isinstance(b, (int, np.integer)):
        return int(b), None
    return int(b[0]), None if b[1] is None else int(b[1])


class InfeasibleBudgets:
    """Budgets a solver proved infeasible, to skip the budgets they dominate.

    Why it is sound: a schedule within peak ``p`` and save ``s`` is within any looser pair,
    so where no schedule meets ``(p2, s2)`` none meets ``(p, s)`` with ``p <= p2`` and
    ``s <= s2`` (no save bound counts as the loosest). What is recorded is a proof (an exact
    MILP's infeasible status), never a heuristic that found nothing; the one exception is
    ``hilp-top``'s menus, which also record a MILP that found no schedule within its work
    limit (the tighter budget's MILP, with the same limit, would spend as much to find
    none). A MILP proving infeasibility near a subgraph's floor is among the slowest a menu
    solves."""

    def __init__(self) -> None:
        self._proved: list[tuple[int, int | None]] = []

    def add(self, peak: int, save: int | None) -> None:
        self._proved.append((int(peak), None if save is None else int(save)))

    def settles(self, peak: int, save: int | None) -> bool:
        """Whether a recorded proof shows ``(peak, save)`` infeasible too."""
        return any(peak <= p2 and (s2 is None or (save is not None and save <= s2))
                   for p2, s2 in self._proved)


def solve_menu(solver, graph: Graph, budgets: Iterable, exact: bool = False) -> list[Option]:
    """Solve ``graph`` for each budget (an int peak, or a ``(peak, save)`` pair); return the
    Pareto front of the options found. Infeasible budgets are skipped. ``exact``: the
    solver's :class:`InfeasibleBudgetError` is a proof (an exact MILP), so a budget it
    dominates is not solved (:class:`InfeasibleBudgets`)."""
    budgets = list(budgets)
    found: dict[int, Option] = {}
    proved = InfeasibleBudgets()
    for i in loosest_first(budgets) if exact else range(len(budgets)):
        peak, save = _peak_save(budgets[i])
        if exact and proved.settles(peak, save):
            log.debug("menu: budget (%s, %s) infeasible (a looser one is)", peak, save)
            continue
        try:
            result = solver.solve(graph, int(peak), save)
        except InfeasibleBudgetError:
            log.debug("menu: budget (%s, %s) infeasible", peak, save)
            if exact:  # only a proof settles the tighter budgets
                proved.add(peak, save)
            continue
        except SolverError as exc:
            # a time-out on one budget leaves the menu without that option, like an infeasible
            # budget, instead of losing the options of the other budgets; other errors are bugs
            if not getattr(exc, "timed_out", False):
                raise
            log.warning("menu: budget (%s, %s) skipped: %s", peak, save, exc)
            continue
        found[i] = option_from_schedule(graph, result.schedule, solver.name)
    options = [found[i] for i in sorted(found)]
    if not options:
        raise InfeasibleBudgetError(
            f"{solver.name}: none of the {len(budgets)} menu budgets is feasible; widen the "
            "grid (budget_grid) or raise the budgets")
    return pareto_front(options)


def allocate(sizes: Sequence[int], n_total: int) -> list[int]:
    """Options per node, proportional to ``sizes`` (basic operations), at least one each."""
    if not sizes:
        return []
    if any(s <= 0 for s in sizes):
        raise SolverError("option allocation needs positive node sizes (basic operations)")
    total = sum(sizes)
    share = [max(1, int(n_total * s / total)) for s in sizes]
    # hand out what rounding left, largest remainders first
    left = n_total - sum(share)
    rema = sorted(range(len(sizes)), key=lambda i: -(n_total * sizes[i] / total - share[i]))
    for i in rema[:max(left, 0)]:
        share[i] += 1
    return share


def spread(options: Sequence[Option], k: int) -> list[Option]:
    """At most ``k`` options whose peaks are farthest apart (highest, lowest, middle, ...)."""
    if k >= len(options):
        return list(options)
    if k <= 0:
        return []
    peak = [max(o.fwd_peak, o.bwd_peak) for o in options]
    order = sorted(range(len(options)), key=lambda i: (-peak[i], options[i].time))
    chosen = [order[0]]
    if k > 1:
        chosen.append(min(range(len(options)), key=lambda i: (peak[i], options[i].time)))
    while len(chosen) < k:
        rest = [i for i in range(len(options)) if i not in chosen]
        best = max(rest, key=lambda i: (min(abs(peak[i] - peak[c]) for c in chosen),
                                        -options[i].time))
        chosen.append(best)
    return [options[i] for i in sorted(set(chosen), key=chosen.index)]


def select_options(menus: Sequence[Sequence[Option]], sizes: Sequence[int],
                   n_total: int) -> list[list[Option]]:
    """Apply the ``N_o`` limit to the menus of the nodes of one graph (see module docstring)."""
    return [spread(menu, k) for menu, k in zip(menus, allocate(sizes, n_total))]
