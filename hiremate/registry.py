"""Solver and partitioner registries: built-in algorithms, decorators, and plugins.

A solver is a class; ``register_solver("name")`` records it. What a solver must offer depends on
the level where a configuration places it (``hiremate.config``):

- ``flat``: :class:`hiremate.solvers.protocols.FlatSolver` (``applicable``, ``schedule``);
- ``bottom``: :class:`hiremate.solvers.protocols.MenuSolver` (``applicable``, ``menu``), or a
  flat solver, whose menu is then one schedule per budget;
- ``top``: :class:`hiremate.solvers.protocols.Composer` (``applicable``, ``compose``).

Plugins register through the entry-point groups ``hiremate.solvers`` and
``hiremate.partitioners`` (the entry point's name is the registered name, its object the class),
read once, the first time a name is looked up. Registering checks that the class plays at least
one role; built-in solvers are registered here, as they are. This is the one registry: the
partition package only lists its built-in classes.
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
        _check_roles(name, c)
        _SOLVERS[name] = c
        if not getattr(c, "name", None):
            c.name = name
        return c
    return deco(cls) if cls is not None else deco


def register_partitioner(name: str, cls: type | None = None) -> Callable[[type], type] | type:
    """Register a partitioner class (``partition(graph) -> Hierarchy``) under ``name``."""
    def deco(c: type) -> type:
        if not callable(getattr(c, "partition", None)):
            raise ConfigError(f"partitioner {name!r} ({c!r}) has no partition(graph) method; "
                              "see hiremate.partition.Partitioner")
        _PARTITIONERS[name] = c
        return c
    return deco(cls) if cls is not None else deco


def _check_roles(name: str, cls: type) -> None:
    from hiremate.solvers.protocols import roles

    if not isinstance(cls, type) or not roles(cls):
        raise ConfigError(
            f"solver {name!r} ({cls!r}) plays no role: a solver class needs applicable() and "
            "schedule() (flat), menu() (bottom) or compose() (top); see "
            "hiremate.solvers.protocols")


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
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a wrong name, or a value of the wrong kind
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
    from hiremate.solvers.chain.join import JOIN_SOLVERS
    from hiremate.solvers.chain.rk_rotor_top import RkRotorTop
    from hiremate.solvers.chain.rotor import CHAIN_SOLVERS
    from hiremate.solvers.fastsa.solver import FASTSA_SOLVERS
    from hiremate.solvers.hilp.flat import HILP_SOLVERS
    from hiremate.solvers.hilp.top import HilpTop
    from hiremate.solvers.hilp.window import HilpWindowSearch
    from hiremate.solvers.twremat import TWREMAT_SOLVERS

    for name, cls in PARTITIONERS.items():
        _PARTITIONERS.setdefault(name, cls)
    composers = {"rk-rotor": RkRotorTop, "hilp-top": HilpTop}
    searches = {"hilp-window": HilpWindowSearch}
    for table in (HILP_SOLVERS, searches, TWREMAT_SOLVERS, FASTSA_SOLVERS, CHAIN_SOLVERS,
                  JOIN_SOLVERS, composers):
        for name, cls in table.items():
            _SOLVERS.setdefault(name, cls)
