"""Running a sweep's cells: which cells, in which order, where, and what each records.

Cells run in two phases: first ``eager`` on every model (its measured peak turns fractional
budgets into bytes and its time is the reference of every relative time), then every other
cell. Each cell builds a fresh model (methods such as ``checkpoint`` change it in place), runs
its method, and returns a flat record (:data:`hiremate.sweep.results.COLUMNS`); a failure is a
record too, never an exception, so that one bad cell does not stop a sweep.

Parallelism: joblib over cells, ``loky`` by default, or ``dask`` (a ``dask.distributed``
cluster at ``scheduler``, or a local one). Timings of cells that share a machine disturb each
other, so the default is one cell at a time (``n_jobs: 1``); use more only for memory figures
or for solving times on a cluster of separate machines.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from hiremate.errors import ConfigError, InfeasibleBudgetError
from hiremate.ir.graph import Graph
from hiremate.sweep.spec import NO_BUDGET, UNBUDGETED, Budget, ModelEntry, SweepSpec
from hiremate.sweep.results import cell_key

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 600


@dataclass(frozen=True)
class Cell:
    """One measurement to make: a model, a budget (``None`` for unbudgeted peers), a method."""

    model: ModelEntry
    budget: Budget | None
    method: str

    @property
    def key(self) -> str:
        return cell_key(self.model.label, self.budget.label if self.budget else NO_BUDGET,
                        self.method)


def grid(spec: SweepSpec) -> tuple[list[Cell], list[Cell]]:
    """``(eager cells, other cells)`` of the spec, in the spec's order."""
    eager = [Cell(m, None, "eager") for m in spec.models]
    rest: list[Cell] = []
    for m in spec.models:
        for method in spec.methods:
            if method == "eager":
                continue
            if method in UNBUDGETED:
                rest.append(Cell(m, None, method))
            else:
                rest.extend(Cell(m, b, method) for b in spec.budgets)
    return eager, rest


def resolve_device(spec: SweepSpec) -> torch.device:
    if spec.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec.device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"sweep device {spec.device!r} is not a torch device ({exc})") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"sweep device {spec.device!r} asked for, but CUDA is not available; "
                          "use device: auto or cpu")
    return dev


def _to_device(sample: Any, device: torch.device) -> Any:
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, sample)


def _message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + "..."


def run_cell(cell: Cell, spec: SweepSpec, reference: dict[str, Any] | None,
             presolved: dict[str, Any] | None = None,
             graph: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one cell and return its record (failures included); ``reference`` is the model's
    eager record (``None`` for the eager cell itself). For hiremate cells, ``presolved`` is the
    presolve's outcome and ``graph`` the model's shared graph (:mod:`hiremate.sweep.presolve`)."""
    from hiremate.sweep.methods import NotApplicable, run_method

    start = time.perf_counter()
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    hiremate_kind = cell.method not in ("eager", "checkpoint", "checkpoint_sequential", "compile")
    rec: dict[str, Any] = {
        "key": cell.key, "model": cell.model.label,
        "budget": cell.budget.label if cell.budget else NO_BUDGET, "method": cell.method,
        "kind": "hiremate" if hiremate_kind else "peer", "status": "error", "feasible": None,
        "budget_bytes": None, "budget_fraction": None, "message": "", "extra": {},
    }
    if reference is not None:
        rec["eager_peak"] = reference.get("measured_peak")
        rec["eager_time"] = reference.get("measured_time")
    try:
        budget = fraction = None
        if cell.budget is not None:
            if reference is None or reference.get("status") != "ok":
                raise RuntimeError("the eager reference of this model failed, so its budgets "
                                   "cannot be resolved (see its eager cell)")
            budget, fraction = cell.budget.resolve(int(reference["measured_peak"]),
                                                   reference.get("floor_bytes"))
            rec["budget_bytes"], rec["budget_fraction"] = budget, fraction
        if presolved and presolved.get("status") == "infeasible":
            raise InfeasibleBudgetError(presolved.get("message", "infeasible (presolve)"),
                                        presolved.get("min_budget"))
        device = resolve_device(spec)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model, sample = cell.model.build(spec.torch_dtype())
            model, sample = model.to(device), _to_device(sample, device)
            twin = None
            if cell.method != "eager" and spec.paired_timing:
                torch.manual_seed(0)
                twin = cell.model.build(spec.torch_dtype())[0].to(device)
            shared = Graph.from_dict(graph) if graph is not None else None
            result = run_method(cell.method, model, sample, spec, budget, fraction, twin,
                                graph=shared)
    except NotApplicable as exc:
        rec.update(status="not_applicable", message=str(exc))
    except InfeasibleBudgetError as exc:
        rec.update(status="infeasible", feasible=False, message=_message(exc))
        if exc.min_budget is not None:
            rec["extra"] = {"min_budget": int(exc.min_budget)}
    except Exception as exc:  # any failure is a record, so that the sweep goes on
        log.warning("sweep cell %s failed: %s", cell.key, _message(exc))
        rec.update(status="error", message=_message(exc))
    else:
        m = result.measurement
        rec.update(
            status="ok", measured_peak=int(m.peak), measured_time=float(m.time),
            device=m.device, measure_method=m.method, solve_time=result.solve_time,
            setup_time=result.setup_time, predicted_peak=result.predicted_peak,
            predicted_time=result.predicted_time, extra=dict(result.extra),
        )
        if presolved and result.solve_time is not None:
            rec["solve_time"] = result.solve_time + presolved["solve_time"]
            rec["extra"]["presolve_time"] = presolved["solve_time"]
        if reference is None:
            rec["eager_peak"], rec["eager_time"] = rec["measured_peak"], rec["measured_time"]
        if rec.get("eager_peak"):
            rec["peak_rel"] = rec["measured_peak"] / rec["eager_peak"]
        if rec.get("eager_time"):
            rec["time_rel"] = rec["measured_time"] / rec["eager_time"]
        if "time_rel_paired" in rec["extra"]:
            # eager timed in alternation in this cell: the load-robust figure
            rec["time_rel_unpaired"] = rec.get("time_rel")
            rec["time_rel"] = rec["extra"]["time_rel_paired"]
        if budget is not None:
            rec["feasible"] = bool(m.peak <= budget * (1.0 + spec.tolerance))
    if cell.budget is not None and cell.budget.floor and reference is not None:
        # where the floor search left its bracket: the floor lies above the highest budget
        # it found infeasible (None: none was) and at most at this cell's budget; no in-order
        # schedule goes below floor_bound_bytes, none that makes each gradient once below
        # floor_once_bytes
        for key in ("floor_infeasible_bytes", "floor_bound_bytes", "floor_once_bytes",
                    "floor_solves"):
            if key in reference:
                rec["extra"][key] = reference[key]
    rec["cell_time"] = time.perf_counter() - start
    return rec


# --------------------------------------------------------------------------------------------
# executing cells: in process, with joblib, or on dask


def dask_available() -> bool:
    return (importlib.util.find_spec("dask") is not None
            and importlib.util.find_spec("distributed") is not None)


@contextlib.contextmanager
def dask_client(scheduler: str | None, n_workers: int) -> Iterator[Any]:
    """A ``dask.distributed`` client: to ``scheduler`` if given, else on a local cluster."""
    if not dask_available():
        raise ConfigError("the dask backend needs dask.distributed, which is not installed: "
                          "pip install dask distributed (or use backend loky)")
    from distributed import Client, LocalCluster

    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def execute(cells: list[Cell], work: Callable[[Cell], dict[str, Any]], *, n_jobs: int,
            backend: str, scheduler: str | None = None) -> Iterator[dict[str, Any]]:
    """Records of ``work(cell)`` for every cell, in completion order."""
    if not cells:
        return
    if backend == "sequential" or (backend == "loky" and n_jobs == 1):
        for cell in cells:
            yield work(cell)
        return
    import joblib

    def run(items: Iterable[Cell]) -> Iterator[dict[str, Any]]:
        parallel = joblib.Parallel(n_jobs=n_jobs, return_as="generator_unordered")
        yield from parallel(joblib.delayed(work)(c) for c in items)

    if backend == "dask":
        workers = n_jobs if n_jobs > 0 else max(1, (joblib.cpu_count() or 1))
        with dask_client(scheduler, workers), joblib.parallel_config(backend="dask"):
            yield from run(cells)
        return
    with joblib.parallel_config(backend=backend):
        yield from run(cells)
