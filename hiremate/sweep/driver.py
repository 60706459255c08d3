"""Sweeps: models x budgets x methods, measured with one harness, resumable, tabled and plotted.

``run_sweep("configs/sweeps/smoke.yaml", out_dir="sweep-out")`` runs every cell of the sweep
file that ``out_dir/results.json`` does not hold yet, then writes ``results.json``,
``results.csv``, ``results.md`` and one ``<model>.png`` per model. ``replot(out_dir)`` redraws
the table and plots from ``results.json`` alone. The command line is ``hiremate sweep`` and
``hiremate plot``; docs/sweeps.md says how to write a sweep file.

The pieces, one concept per module: :mod:`hiremate.sweep.spec` (the file),
:mod:`hiremate.sweep.methods` (eager, checkpoint, checkpoint_sequential, torch.compile, hiremate
presets), :mod:`hiremate.sweep.runner` (cells and where they run), :mod:`hiremate.sweep.presolve`
(one graph per model, every budget solved before any is measured), :mod:`hiremate.sweep.results`
(the store, CSV, markdown) and :mod:`hiremate.sweep.plot` (figures).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hiremate.errors import ConfigError
from hiremate.sweep.plot import plot_all
from hiremate.sweep.presolve import (Presolved, find_floors, is_hiremate_cell, presolve,
                                     sweep_overrides)
from hiremate.sweep.results import ResultStore
from hiremate.sweep.runner import Cell, execute, grid, run_cell
from hiremate.sweep.spec import BACKENDS, SweepSpec, load_spec, spec_from_dict

log = logging.getLogger(__name__)

__all__ = ["SweepOutcome", "replot", "run_sweep"]


@dataclass
class SweepOutcome:
    """What :func:`run_sweep` did: the store, the cells it ran and skipped, the files."""

    store: ResultStore
    ran: list[str]
    skipped: list[str]
    files: dict[str, Path]


class _CellWork:
    """``run_cell`` with the spec, the eager references and the presolve's graphs and outcomes
    bound (picklable for workers)."""

    def __init__(self, spec: SweepSpec, references: dict[str, dict[str, Any]],
                 presolved: Presolved | None = None):
        self.spec = spec
        self.references = references
        self.presolved = presolved or Presolved()

    def __call__(self, cell: Cell) -> dict[str, Any]:
        reference = None if cell.method == "eager" else self.references.get(cell.model.label)
        if not is_hiremate_cell(cell):
            return run_cell(cell, self.spec, reference)
        return run_cell(cell, self.spec, reference, self.presolved.cells.get(cell.key),
                        self.presolved.graphs.get(cell.model.label))


def _finished(store: ResultStore, cell: Cell, retry_errors: bool) -> bool:
    rec = store.cells.get(cell.key)
    return rec is not None and not (retry_errors and rec.get("status") == "error")


def run_sweep(spec: SweepSpec | str | Path, out_dir: str | Path | None = None, *,
              backend: str | None = None, scheduler: str | None = None,
              n_jobs: int | None = None, progress: bool | str = "auto", retry_errors: bool = False,
              plots: bool = True) -> SweepOutcome:
    """Run the cells of ``spec`` that ``out_dir`` has not finished; see the module docstring.

    ``backend``/``n_jobs`` override the file's; ``scheduler`` is a dask scheduler address
    (backend ``dask``; without it a local cluster is started). Cells that ended in ``error``
    are run again only with ``retry_errors``. ``progress``: bars always (True), never
    (False), or only when stderr is a terminal ("auto").
    """
    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    backend = backend or spec.backend
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if scheduler and backend != "dask":
        raise ConfigError("a scheduler address needs backend 'dask'")
    n_jobs = spec.n_jobs if n_jobs is None else n_jobs
    out = Path(out_dir) if out_dir is not None else Path("sweep-results") / spec.name
    store = ResultStore.load(out)
    store.spec = spec.to_dict()
    # the solver cache (menus and the schedule pool) goes under OUT unless the file names one
    spec = dataclasses.replace(spec, hiremate_overrides=sweep_overrides(spec, out))
    eager_cells, other_cells = grid(spec)
    ran: list[str] = []
    skipped: list[str] = []

    from tqdm.auto import tqdm

    from hiremate.quiet import show_progress

    todo = [c for c in eager_cells + other_cells if not _finished(store, c, retry_errors)]
    skipped = [c.key for c in eager_cells + other_cells if c not in todo]
    bar = tqdm(total=len(todo), desc=f"sweep {spec.name}", unit="cell", disable=not show_progress(progress))
    try:
        for phase in (eager_cells, other_cells):
            cells = [c for c in phase if c in todo]
            references = {c.model.label: store.cells.get(c.key) for c in eager_cells}
            references = {k: v for k, v in references.items() if v}
            if phase is other_cells:
                references = find_floors(spec, cells, references, out)
            presolved = (presolve(spec, cells, references, out, progress)
                         if phase is other_cells and spec.presolve else None)
            work = _CellWork(spec, references, presolved)
            for rec in execute(cells, work, n_jobs=n_jobs, backend=backend, scheduler=scheduler):
                store.add(rec)
                store.save()
                ran.append(rec["key"])
                bar.set_postfix_str(f"{rec['key']}: {rec['status']}", refresh=False)
                bar.update(1)
    finally:
        bar.close()
        store.save()
    files = _render(store, spec, plots)
    log.info("sweep %s: %d cells run, %d already done; results in %s", spec.name, len(ran),
             len(skipped), out)
    return SweepOutcome(store=store, ran=ran, skipped=skipped, files=files)


def _render(store: ResultStore, spec: SweepSpec, plots: bool) -> dict[str, Path]:
    eager_cells, other_cells = grid(spec)
    keys = {c.key for c in eager_cells + other_cells}
    view = ResultStore(store.out_dir, store.spec)
    view.cells = {k: v for k, v in store.cells.items() if k in keys}
    files = view.write_all()
    store.save()  # the full store (cells of earlier grids included) stays in results.json
    if plots:
        for i, path in enumerate(plot_all(view.records(), store.out_dir)):
            files[f"plot{i}"] = path
    return files


def replot(results_dir: str | Path) -> dict[str, Path]:
    """Redraw results.csv, results.md and the plots of ``results_dir`` from results.json."""
    store = ResultStore.load(results_dir)
    if not store.path.is_file():
        raise ConfigError(f"{results_dir} holds no results.json; run `hiremate sweep` first")
    if not store.spec:
        raise ConfigError(f"{store.path} holds no sweep spec")
    return _render(store, spec_from_dict(store.spec), plots=True)
