"""Every level of the hierarchy solved bottom-up (HiRemate, section 3.2, Algorithm 1).

A *unit* is one part of the partition as a block of its parent's graph (a top-level part is a
block of the full graph; a child of a subgraph is a block of that subgraph's own graph, which
has its own loss node standing for the rest of the model). Units whose children are all plain
nodes (and every unit when no ``middle`` composer is configured, which flattens each top-level
part as Rockmate's two levels do) are *leaves*: the ``bottom`` solvers give them menus on their
own graphs. A unit with subgraph children is solved over its children's menus: its graph, its
children as blocks and the backward nodes its children do not own make a
:class:`~hiremate.ir.blocks.TopProblem`, which each ``middle`` composer (the hierarchical H-ILP)
schedules at the unit's menu budgets; every schedule found is an option of the unit for the
level above. The ``middle_flat`` solvers (cheap heuristics such as TW-Remat) also schedule the
unit's whole graph, and the Pareto front of everything found is the unit's menu.

Units are solved by height (leaves first), so a unit's children always have their menus; units
with equal graphs (:func:`~hiremate.ir.graph.graph_key`) are solved once, and each height's
unique units run in parallel (joblib; dask through its backend). Before a problem is solved,
its children's menus are cut to ``total_options`` shared in proportion to their forward nodes
(the paper's N_o, :func:`~hiremate.solvers.menu.select_options`), each child keeping the
options whose peaks are farthest apart. Menus of inner units are cached per unit graph.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from hiremate.composer.menu_cache import decode_menu, encode_menu
from hiremate.composer.menus import _runtime_free, run_tasks, solve_menus, store_all_option
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.blocks import Block, TopProblem, blocks_of
from hiremate.ir.graph import Graph
from hiremate.ir.option import Option, pareto_front

log = logging.getLogger(__name__)


@dataclass
class Unit:
    """One part of the partition as a block of its parent's graph, with its own children."""

    block: Block
    children: list["Unit"] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)   # backward nodes no child owns (local ids)
    height: int = 0                                   # 0: a leaf, solved by bottom solvers

    @property
    def key(self) -> str:
        return self.block.key

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()


def build_units(graph: Graph, hierarchy: Any, recursive: bool) -> tuple[list[Unit], list[int]]:
    """Units of the hierarchy's top level (each with its subtree when ``recursive``) and the
    full graph's tail."""
    top = list(hierarchy.top)
    blocks, tail = blocks_of(graph, [hierarchy.leaves(p) for p in top])
    identity = list(range(len(graph.nodes)))
    units = [_expand(hierarchy, blk, part, identity, recursive) for blk, part in zip(blocks, top)]
    return units, tail


def _expand(hierarchy: Any, blk: Block, part: Any, parent_full: list[int],
            recursive: bool) -> Unit:
    """The unit of ``part`` (a block of its parent's graph, whose compute ids map to the full
    graph's through ``parent_full``), its children expanded in turn."""
    if not recursive or part.is_node:
        return Unit(blk)
    sub = hierarchy.subgraph(part.id)
    if all(c.is_node for c in sub.children):
        return Unit(blk)
    full = [parent_full[n] if n >= 0 else -1 for n in blk.node_map]
    local = {f: i for i, f in enumerate(full) if f >= 0}
    parts = [[local[f] for f in hierarchy.leaves(c)] for c in sub.children]
    child_blocks, tail = blocks_of(blk.graph, parts)
    kids = [_expand(hierarchy, cb, c, full, recursive)
            for cb, c in zip(child_blocks, sub.children)]
    return Unit(blk, kids, tail, 1 + max(k.height for k in kids))


def cut_menus(blocks: list[Block], menus: dict[str, list[Option]], total: int | None,
              per_block: int) -> None:
    """Give each block its class's menu, cut to its share of ``total`` options (in proportion
    to its forward nodes; ``per_block`` each when ``total`` is None), farthest peaks first."""
    from hiremate.solvers.menu import allocate, spread

    if total is None:
        shares = [per_block] * len(blocks)
    else:
        shares = [min(s, per_block) for s in
                  allocate([max(len(b.fwd), 1) for b in blocks], max(total, len(blocks)))]
    for b, k in zip(blocks, shares):
        b.options = spread(menus[b.key], max(k, 1))


#: The part of an inner unit's menu that runs the ``middle_flat`` solvers (the other parts are
#: the composers at one peak of the unit's budget grid each).
FLAT_PART = -1


def inner_parts(graph: Graph, composers: list, flats: list, n_peak: int, n_save: int
                ) -> list[int]:
    """The parts one inner unit's menu is solved in, each a joblib task: one per distinct peak
    of its budget grid (every composer at that peak's saves) and one for the flat solvers,
    so that one unit's MILPs, run one after the other, do not keep one worker busy while the
    others idle."""
    from hiremate.solvers.menu import budget_grid, grid_peaks

    peaks = grid_peaks(budget_grid(graph, n_peak, n_save)) if composers else []
    return list(range(len(peaks))) + [FLAT_PART]


def solve_inner_task(graph: Graph, blocks: list[Block], tail: list[int],
                     composers: list[tuple[str, type, dict]], flats: list[tuple[str, type, dict]],
                     n_peak: int, n_save: int, part: int = FLAT_PART
                     ) -> tuple[list[Option], float, dict[str, str]]:
    """One part (:func:`inner_parts`) of an inner unit's menu: every composer over its
    children's menus at the ``part``-th peak of the unit's budget grid, or (``FLAT_PART``) the
    store-all option and every flat solver on its whole graph at the whole grid. Runs in a
    joblib worker (picklable in and out; solver classes travel with the task). Returns the
    Pareto front, seconds and errors."""
    from hiremate.composer.menus import solve_menu_task
    from hiremate.solvers.menu import budget_grid, grid_peaks, part_of
    from hiremate.solvers.protocols import compose_menu

    start = time.perf_counter()
    errors: dict[str, str] = {}
    if part == FLAT_PART:
        options: list[Option] = [store_all_option(graph)]
        for name, cls, params in flats:
            opts, _, err = solve_menu_task(graph, name, cls, params, n_peak, n_save)
            options.extend(opts)
            if err and err != "not applicable":
                errors[name] = err
        return pareto_front(options), time.perf_counter() - start, errors
    problem = TopProblem(graph, blocks, tail)
    grid = budget_grid(graph, n_peak, n_save)
    budgets, ceiling = part_of(grid, part), grid_peaks(grid)[-1]
    options = []
    for name, cls, params in composers:
        try:
            composer = cls(**params)
            options.extend(compose_menu(composer, problem, budgets, ceiling=ceiling))
        except InfeasibleBudgetError:  # no budget of this peak: the other parts may have some
            continue
        except Exception as exc:  # one composer failing must not stop the others
            errors[name] = f"{type(exc).__name__}: {exc}"
    return pareto_front(options), time.perf_counter() - start, errors


def inner_params(name: str, params: dict) -> dict:
    """A composer's parameters below the top level: no context refinement (there is no
    context yet: the level above has not chosen)."""
    if name == "hilp-top":
        return {**params, "refine_rounds": 0}
    return dict(params)


def solve_levels(units: list[Unit], cfg: Any, cache: Any) -> dict[str, Any]:
    """Menus for every unit, bottom-up by height (see module doc); returns facts per height
    for the report. The top-level units' ``block.options`` are filled (cut to their share)."""
    from hiremate.registry import make_solver, solver_class

    every = [u for top in units for u in top.walk()]
    menus: dict[str, list[Option]] = {}
    facts: dict[str, Any] = {"levels": []}
    leaves = [u.block for u in every if u.height == 0]
    t0 = time.perf_counter()
    leaf_facts = solve_menus(leaves, cfg, cache)
    for key, f in leaf_facts.items():
        menus[key] = f["front"]
    facts["levels"].append({"height": 0, "units": len(leaves), "unique": len(leaf_facts),
                            "largest": max(len(b.graph.nodes) for b in leaves),
                            "seconds": round(time.perf_counter() - t0, 3)})
    for name in cfg.middle + cfg.middle_flat:  # bad parameters fail here, with a ConfigError
        make_solver(name, cfg.solver_params.get(name, {}))
    composers = [(n, solver_class(n), inner_params(n, cfg.solver_params.get(n, {})))
                 for n in cfg.middle]
    flats = [(n, solver_class(n), cfg.solver_params.get(n, {})) for n in cfg.middle_flat]
    config_key = _runtime_free(cfg)
    height = 1
    while True:
        level = [u for u in every if u.height == height]
        if not level:
            break
        t0 = time.perf_counter()
        unique: dict[str, Unit] = {}
        for u in level:
            unique.setdefault(u.key, u)
        todo, keys, ckeys = [], [], {}
        for key, u in unique.items():
            ckey = {"kind": "level-menu", "graph": key,
                    "children": [c.key for c in u.children], "config": config_key}
            hit = cache.get(ckey, decode=decode_menu)
            if hit is not None:
                menus[key] = hit[0]
                continue
            cut_menus([c.block for c in u.children], menus, cfg.total_options, cfg.n_options)
            ckeys[key] = ckey
            for part in inner_parts(u.block.graph, composers, flats, cfg.menu_peaks,
                                    cfg.menu_saves):
                todo.append((u.block.graph, [c.block for c in u.children], u.tail, composers,
                             flats, cfg.menu_peaks, cfg.menu_saves, part))
                keys.append(key)
        outs = run_tasks(cfg, solve_inner_task, todo, f"level {height + 1}: menus")
        found: dict[str, tuple[list[Option], dict[str, str]]] = {}
        for key, (opts, _, errors) in zip(keys, outs):
            found.setdefault(key, ([], {}))[0].extend(opts)
            found[key][1].update(errors)
        for key, (opts, errors) in found.items():
            for name, err in errors.items():
                log.warning("%s failed on a subgraph of %d nodes: %s", name,
                            len(unique[key].block.graph.nodes), err)
            menus[key] = pareto_front(opts)
            if not errors:
                cache.put(ckeys[key], encode_menu(menus[key], ""))
        facts["levels"].append({
            "height": height, "units": len(level), "unique": len(unique),
            "solved": len(ckeys), "largest": max(len(u.children) for u in level),
            "menu_sizes": sorted(len(menus[k]) for k in unique),
            "seconds": round(time.perf_counter() - t0, 3)})
        height += 1
    cut_menus([u.block for u in units], menus, cfg.total_options, cfg.n_options)
    facts["menus"] = menus
    facts["leaf"] = leaf_facts
    return facts
