"""What the composer asks of a solver, one ``typing.Protocol`` per role.

A configuration places solvers at three levels (:mod:`hiremate.config`), and each level asks for
one role:

- ``flat``: a :class:`FlatSolver` schedules a whole graph within a budget;
- ``bottom``: a :class:`MenuSolver` gives a block a menu of options (see
  :class:`hiremate.ir.option.Option`), one per budget it meets;
- ``top``: a :class:`Composer` schedules the sequence of blocks, each with its menu.

Every path ends in the same result type, :class:`hiremate.ir.blocks.Candidate`: a full-graph
schedule with its simulation, and where it came from. The composer turns a flat solver's schedule
into one; a composer returns them directly.

A flat solver without a ``menu`` method still serves at the bottom level: :func:`menu_of` asks
it for one schedule per budget and keeps the Pareto front of the options they make. Solvers are
registered as they are; nothing is added to a class after the fact.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, runtime_checkable

from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.blocks import Candidate, TopProblem
from hiremate.ir.graph import Graph
from hiremate.ir.option import Option, pareto_front
from hiremate.ir.schedule import Schedule


@runtime_checkable
class FlatSolver(Protocol):
    """Schedules a whole graph: ``schedule`` raises :class:`hiremate.InfeasibleBudgetError` when
    it cannot meet ``budget``. It may also offer ``min_budget(graph) -> int``, the smallest
    budget it is known to meet, which the composer uses to say how far off a budget is."""

    name: str

    def applicable(self, graph: Graph) -> bool: ...

    def schedule(self, graph: Graph, budget: int) -> Schedule: ...


@runtime_checkable
class MenuSolver(Protocol):
    """Gives a block's graph a menu of options. ``budgets`` are peaks (ints), or ``(peak, save)``
    pairs when the class sets ``menu_pairs = True`` (the H-ILP bounds the memory held at the
    loss as well, so it can offer options that save less for the same peak)."""

    name: str
    menu_pairs: bool

    def applicable(self, graph: Graph) -> bool: ...

    def menu(self, graph: Graph, budgets: Iterable[Any]) -> list[Option]: ...


@runtime_checkable
class Composer(Protocol):
    """Schedules the blocks of a :class:`hiremate.ir.blocks.TopProblem` within ``budget``.

    Returns the candidates it found (each already simulated on the full graph and within the
    budget) and the smallest budget it knows it could meet (None when unknown). A composer
    whose ``compose`` also takes ``chains`` runs after those that do not and gets their
    candidates' block-chain operations (a candidate's ``detail["ops"]``, rk-Rotor's), fastest
    first, as feasible schedules of its own search (:func:`compose_chains`; ``hilp-top`` makes
    them floors under its MILPs' results)."""

    name: str

    def applicable(self, graph: Graph) -> bool: ...

    def compose(self, problem: TopProblem, budget: int) -> tuple[list[Candidate], int | None]: ...


def roles(cls: type) -> list[str]:
    """The roles a solver class can play: ``flat``, ``bottom``, ``top`` (checked on the class's
    methods, so it works before the class is instantiated)."""
    has = lambda attr: callable(getattr(cls, attr, None))  # noqa: E731
    out = []
    if has("applicable") and has("schedule"):
        out.append("flat")
    if has("applicable") and (has("menu") or has("schedule")):
        out.append("bottom")
    if has("applicable") and has("compose"):
        out.append("top")
    return out


def menu_pairs(solver: Any) -> bool:
    """Whether ``solver`` takes ``(peak, save)`` budget pairs in ``menu``."""
    return bool(getattr(solver, "menu_pairs", False))


def menu_of(solver: Any, graph: Graph, budgets: Iterable[Any]) -> list[Option]:
    """The menu ``solver`` gives ``graph``: its own ``menu`` when it has one, else one schedule
    per peak budget it meets (or, when it meets none, the schedule at its ``min_budget``)."""
    if callable(getattr(solver, "menu", None)):
        return list(solver.menu(graph, budgets))
    from hiremate.solvers.menu import option_from_schedule

    options = []
    for b in sorted({int(x if not isinstance(x, tuple) else x[0]) for x in budgets}):
        try:
            options.append(option_from_schedule(graph, solver.schedule(graph, b), solver.name))
        except InfeasibleBudgetError:
            continue
    if not options and callable(getattr(solver, "min_budget", None)):
        low = solver.min_budget(graph)
        options.append(option_from_schedule(graph, solver.schedule(graph, low), solver.name))
    return pareto_front(options)


def takes_chains(composer: Any) -> bool:
    """Whether ``composer.compose`` takes ``chains``, the other composers' operations."""
    import inspect

    return "chains" in inspect.signature(composer.compose).parameters


def compose_chains(candidates: Iterable[Candidate]) -> list[tuple[float, tuple]]:
    """``(simulated time, block-chain operations)`` of the ``candidates`` that have them
    (what a composer that takes ``chains`` gets, sorted)."""
    return [(c.sim.time, tuple(c.detail["ops"])) for c in candidates if c.detail.get("ops")]


def compose_menu(composer: Any, problem: TopProblem, budgets: Iterable[Any],
                 ceiling: int | None = None) -> list[Option]:
    """The menu a composer gives the graph of ``problem`` (a subgraph whose children are the
    problem's blocks): its own ``compose_menu`` when it has one, else one :meth:`compose` per
    distinct peak of ``budgets`` (ints or ``(peak, save)`` pairs), every candidate an option.
    ``ceiling``: the highest peak of the whole budget grid when ``budgets`` is a part of it,
    passed to a ``compose_menu`` that takes it (its models are then scaled as for the whole
    grid)."""
    own = getattr(composer, "compose_menu", None)
    if callable(own):
        import inspect

        if ceiling is not None and "ceiling" in inspect.signature(own).parameters:
            return list(own(problem, budgets, ceiling=ceiling))
        return list(own(problem, budgets))
    from hiremate.solvers.menu import option_from_schedule

    options = []
    for b in sorted({int(x if not isinstance(x, tuple) else x[0]) for x in budgets}):
        try:
            cands, _ = composer.compose(problem, b)
        except InfeasibleBudgetError:
            continue
        options.extend(option_from_schedule(problem.graph, c.schedule, composer.name)
                       for c in cands)
    return pareto_front(options)
