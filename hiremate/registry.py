"""Solver and partitioner registries: built-in algorithms, decorators, and plugins.

A solver is a class; ``register_solver("name")`` records it. What a solver must offer depends on
the level where a configuration places it (``hiremate.config``):

- ``flat``: ``applicable(graph) -> bool`` and ``schedule(graph, budget) -> Schedule``
  (``min_budget(graph) -> int`` optional: the smallest budget it meets);
- ``bottom``: ``applicable(graph)`` and ``menu(graph, budgets) -> list[Option]``; ``budgets``
  are peaks (ints), or ``(peak, save)`` pairs when the class sets ``menu_pairs = True``;
- ``top``: ``compose(blocks, budget)`` (see :mod:`hiremate.composer.solve`).

Plugins register through the entry-point groups ``hiremate.solvers`` and
``hiremate.partitioners`` (the entry point's name is the registered name, its object the class),
read once, the first time a name is looked up. Built-in solvers are registered here, without
touching their modules, with thin adapters where a protocol method was missing.
"""

from __future__ import annotations

import logging
from importlib import metadata
from typing import Any, Callable

from hiremate.errors import ConfigError

log = logging.getLogger(__name__)

SOLVER_GROUP = "hiremate.solvers"
PARTITIONER_GROUP = "hiremate.partitioners"

_SOLVERS: dict[str, type] = {}
_PARTITIONERS: dict[str, type] = {}
_loaded: set[str] = set()


def register_solver(name: str, cls: type | None = None) -> Callable[[type], type] | type:
    """Register a solver class under ``name`` (decorator, or call with the class)."""
    def deco(c: type) -> type:
        _SOLVERS[name] = c
        if not getattr(c, "name", None):
            c.name = name
        return c
    return deco(cls) if cls is not None else deco


def register_partitioner(name: str, cls: type | None = None) -> Callable[[type], type] | type:
    """Register a partitioner class (``partition(graph) -> Hierarchy``) under ``name``."""
    def deco(c: type) -> type:
        _PARTITIONERS[name] = c
        return c
    return deco(cls) if cls is not None else deco


def _entry_points(group: str) -> list[Any]:
    try:
        return list(metadata.entry_points(group=group))
    except TypeError:  # very old importlib.metadata
        return list(metadata.entry_points().get(group, []))


def load_plugins(force: bool = False) -> None:
    """Read the entry-point groups (once, or again with ``force``)."""
    for group, table in ((SOLVER_GROUP, _SOLVERS), (PARTITIONER_GROUP, _PARTITIONERS)):
        if group in _loaded and not force:
            continue
        _loaded.add(group)
        for ep in _entry_points(group):
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plugin must not break hiremate
                log.warning("cannot load %s plugin %r (%s): %s", group, ep.name, ep.value, exc)
                continue
            table[ep.name] = obj
            if group == SOLVER_GROUP and not getattr(obj, "name", None):
                obj.name = ep.name


def solver_names() -> list[str]:
    _builtins()
    load_plugins()
    return sorted(_SOLVERS)


def partitioner_names() -> list[str]:
    _builtins()
    load_plugins()
    return sorted(_PARTITIONERS)


def solver_class(name: str) -> type:
    names = solver_names()
    if name not in _SOLVERS:
        raise ConfigError(f"unknown solver {name!r}; registered solvers: {', '.join(names)}")
    return _SOLVERS[name]


def make_solver(name: str, params: dict[str, Any] | None = None) -> Any:
    """An instance of solver ``name`` built with ``params``."""
    cls = solver_class(name)
    try:
        solver = cls(**(params or {}))
    except TypeError as exc:
        raise ConfigError(f"bad parameters for solver {name!r}: {exc}") from exc
    if not getattr(solver, "name", None):
        solver.name = name
    return solver


def make_partitioner(name: str, params: dict[str, Any] | None = None) -> Any:
    names = partitioner_names()
    if name not in _PARTITIONERS:
        raise ConfigError(f"unknown partitioner {name!r}; registered: {', '.join(names)}")
    try:
        return _PARTITIONERS[name](**(params or {}))
    except TypeError as exc:
        raise ConfigError(f"bad parameters for partitioner {name!r}: {exc}") from exc


# -- built-ins ---------------------------------------------------------------------------------
_builtins_done = False


def _builtins() -> None:
    """Register the solvers and partitioners shipped with hiremate (lazily: imports are slow)."""
    global _builtins_done
    if _builtins_done:
        return
    _builtins_done = True
    from hiremate.partition import PARTITIONERS
    from hiremate.solvers.fastsa.solver import FASTSA_SOLVERS
    from hiremate.solvers.hilp.flat import HILP_SOLVERS
    from hiremate.solvers.chain.rotor import CHAIN_SOLVERS
    from hiremate.solvers.twremat import TWREMAT_SOLVERS

    for name, cls in PARTITIONERS.items():
        _PARTITIONERS.setdefault(name, cls)
    for name, cls in HILP_SOLVERS.items():
        _SOLVERS.setdefault(name, _with_pairs(cls))
    for table in (TWREMAT_SOLVERS, FASTSA_SOLVERS):
        for name, cls in table.items():
            _SOLVERS.setdefault(name, cls)
    for name, cls in CHAIN_SOLVERS.items():
        _SOLVERS.setdefault(name, _with_menu(cls))
    from hiremate.solvers.chain.join import JOIN_SOLVERS

    for name, cls in JOIN_SOLVERS.items():
        _SOLVERS.setdefault(name, _with_menu(cls))
    from hiremate.solvers.chain.rk_rotor_top import RkRotorTop
    from hiremate.solvers.hilp.top import HilpTop

    _SOLVERS.setdefault("rk-rotor", RkRotorTop)
    _SOLVERS.setdefault("hilp-top", HilpTop)


def _with_pairs(cls: type) -> type:
    """H-ILP menus take ``(peak, save)`` budget pairs."""
    return type(cls.__name__, (cls,), {"menu_pairs": True, "__doc__": cls.__doc__,
                                        "__module__": cls.__module__})


def _with_menu(cls: type) -> type:
    """Chain and baseline solvers gain a ``menu``: one option per budget they meet (autodiff's
    single store-everything option; Rotor's sequences on a chain-shaped block)."""
    def menu(self, graph, budgets):
        from hiremate.errors import InfeasibleBudgetError
        from hiremate.ir.option import pareto_front
        from hiremate.solvers.menu import option_from_schedule

        options = []
        for b in sorted(set(int(x) for x in budgets)):
            try:
                options.append(option_from_schedule(graph, self.schedule(graph, b), self.name))
            except InfeasibleBudgetError:
                continue
        if not options and hasattr(self, "min_budget"):
            low = self.min_budget(graph)
            options.append(option_from_schedule(graph, self.schedule(graph, low), self.name))
        return pareto_front(options)

    return type(cls.__name__, (cls,), {"menu": menu, "__doc__": cls.__doc__,
                                        "__module__": cls.__module__})
