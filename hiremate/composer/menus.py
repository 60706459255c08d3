"""Menus: every applicable bottom solver gives each unique block a list of options, solved in
parallel (joblib, or dask through its backend) and cached; the merged menu keeps the Pareto
front, cut to ``n_options`` spread over the peaks. The store-everything option is always on the
menu, so every block has one.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hiremate.composer.menu_cache import decode_menu, encode_menu
from hiremate.ir.blocks import Block
from hiremate.ir.graph import Graph, graph_key
from hiremate.ir.option import Option, pareto_front
from hiremate.ir.simulator import autodiff_schedule
from hiremate.solvers.protocols import menu_of, menu_pairs

log = logging.getLogger(__name__)


def menu_budgets(solver: Any, graph: Graph, n_peak: int, n_save: int) -> list:
    from hiremate.solvers.menu import budget_grid, grid_peaks

    grid = budget_grid(graph, n_peak, n_save)
    if menu_pairs(solver):
        return grid
    return grid_peaks(grid)


def menu_parts(solver: Any, graph: Graph, n_peak: int, n_save: int) -> list[int | None]:
    """The parts a (block, solver) menu is solved in, each a joblib task: one per distinct
    peak of the block's budget grid for a solver that takes ``(peak, save)`` pairs (one MILP
    per budget, independent of the others), else the whole menu at once (``None``), so that
    one block's MILPs do not keep one worker busy while the others idle."""
    from hiremate.solvers.menu import budget_grid, grid_peaks

    if not menu_pairs(solver):
        return [None]
    return list(range(len(grid_peaks(budget_grid(graph, n_peak, n_save)))))


def merge_parts(outs: list[tuple[list[Option], float, str]]) -> tuple[list[Option], float, str]:
    """One menu from its parts' (options, seconds, error): a part whose budgets were all
    infeasible is no error when another part found options."""
    options = [o for opts, _, _ in outs for o in opts]
    errors = [err for _, _, err in outs if err]
    if options:
        errors = [e for e in errors if not e.startswith("InfeasibleBudgetError")]
    return pareto_front(options), sum(secs for _, secs, _ in outs), errors[0] if errors else ""


def solve_menu_task(graph: Graph, name: str, cls: type, params: dict, n_peak: int,
                    n_save: int, part: int | None = None) -> tuple[list[Option], float, str]:
    """One (block, solver) menu, or its ``part``-th part (:func:`menu_parts`): options,
    seconds, and an error text ('' when fine). Runs in a joblib worker, so it takes and
    returns picklable values; the solver's class travels with the task (a worker process does
    not see classes registered at run time)."""
    start = time.perf_counter()
    try:
        solver = cls(**params)
        if not getattr(solver, "name", None):
            solver.name = name
        if not solver.applicable(graph):
            return [], time.perf_counter() - start, "not applicable"
        budgets = menu_budgets(solver, graph, n_peak, n_save)
        if part is not None:
            from hiremate.solvers.menu import part_of

            budgets = part_of(budgets, part)
        options = menu_of(solver, graph, budgets)
        options = [o if o.solver == name else _with_solver(o, name) for o in options]
        return options, time.perf_counter() - start, ""
    except Exception as exc:  # one solver failing on one block must not stop the others
        return [], time.perf_counter() - start, f"{type(exc).__name__}: {exc}"


def _with_solver(o: Option, name: str) -> Option:
    from dataclasses import replace

    return replace(o, solver=name)


def store_all_option(graph: Graph) -> Option:
    """The block's store-everything option (always on the menu, so every block has one)."""
    from hiremate.solvers.menu import option_from_schedule

    return option_from_schedule(graph, autodiff_schedule(graph), "autodiff")


def select_menu(options: list[Option], n_options: int) -> list[Option]:
    from hiremate.solvers.menu import spread

    return spread(pareto_front(options), n_options)



def _runtime_free(cfg: Any) -> dict:
    """The part of a configuration that decides the result (not how it is computed)."""
    d = cfg.to_dict()
    for k in ("name", "description", "n_jobs", "backend", "cache", "cache_dir", "progress",
              "calibrate", "on_new_inputs", "max_shapes", "transfer_schedules",
              "output_gradients"):
        d.pop(k, None)
    return d


def _progress(cfg: Any, iterable, desc: str, total: int | None = None):
    """``iterable`` with a progress bar when ``cfg.progress`` asks for one: ``True``, or
    ``"auto"`` with stderr a terminal (:func:`hiremate.quiet.show_progress`)."""
    from tqdm.auto import tqdm

    from hiremate.quiet import show_progress

    return tqdm(iterable, desc=desc, total=total, disable=not show_progress(cfg.progress),
                leave=False)


def run_tasks(cfg: Any, fn: Any, args: list[tuple], desc: str) -> list[Any]:
    """``fn(*a)`` for every ``a`` of ``args``, in order: in this process when ``cfg.n_jobs`` is
    1 or there is one task, else in parallel through joblib (``cfg.backend``: loky, threading,
    or an external backend such as dask's). The order of the results never depends on which
    worker finished first."""
    from joblib import Parallel, delayed, parallel_config

    if not args:
        return []
    if cfg.n_jobs == 1 or len(args) == 1:
        return [fn(*a) for a in _progress(cfg, args, desc)]
    # parallel_config also knows the external backends (dask: a distributed Client)
    with parallel_config(backend=cfg.backend, n_jobs=cfg.n_jobs):
        par = Parallel(return_as="generator")
        return list(_progress(cfg, par(delayed(fn)(*a) for a in args), desc, total=len(args)))


def solve_menus(blocks: list[Block], cfg: Any, cache: Any) -> dict[str, Any]:
    """Menus of the unique blocks with every applicable bottom solver (parallel, cached); fills
    ``block.options`` and returns per-class facts for the report."""
    unique: dict[str, Block] = {}
    for b in blocks:
        unique.setdefault(b.key, b)
    tasks, results = [], {}
    for key, blk in unique.items():
        for name in cfg.bottom:
            ckey = {"kind": "menu", "graph": graph_key(blk.graph), **cfg.solver_key(name)}
            hit = cache.get(ckey, decode=decode_menu)
            if hit is not None:
                results[(key, name)] = (hit[0], 0.0, hit[1], True)
            else:
                tasks.append((key, name, ckey))
    if tasks:
        from hiremate.registry import make_solver, solver_class

        made = {n: make_solver(n, cfg.solver_params.get(n, {}))  # bad parameters fail here
                for n in cfg.bottom}
        args, owners = [], []
        for k, n, _ in tasks:
            for part in menu_parts(made[n], unique[k].graph, cfg.menu_peaks, cfg.menu_saves):
                args.append((unique[k].graph, n, solver_class(n), cfg.solver_params.get(n, {}),
                             cfg.menu_peaks, cfg.menu_saves, part))
                owners.append((k, n))
        outs = run_tasks(cfg, solve_menu_task, args, "bottom level: menus")
        parts: dict[tuple[str, str], list] = {}
        for owner, out in zip(owners, outs):
            parts.setdefault(owner, []).append(out)
        for key, name, ckey in tasks:
            opts, secs, err = merge_parts(parts[(key, name)])
            results[(key, name)] = (opts, secs, err, False)
            if err in ("", "not applicable"):
                cache.put(ckey, encode_menu(opts, err))
    facts: dict[str, Any] = {}
    for key, blk in unique.items():
        merged: list[Option] = [store_all_option(blk.graph)]
        per_solver = {}
        for name in cfg.bottom:
            opts, secs, err, hit = results[(key, name)]
            merged.extend(opts)
            per_solver[name] = {"options": len(opts), "seconds": round(secs, 3),
                                "cached": hit, **({"error": err} if err else {})}
            if err and err != "not applicable":
                log.warning("solver %s failed on a block of %d nodes: %s", name,
                            len(blk.graph.nodes), err)
        front = pareto_front(merged)
        chosen = select_menu(front, cfg.n_options)
        facts[key] = {"nodes": len(blk.graph.nodes), "solvers": per_solver,
                      "menu": len(chosen), "options": chosen, "front": front}
    for b in blocks:
        b.options = facts[b.key]["options"]
    return facts
