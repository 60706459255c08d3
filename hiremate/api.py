"""``HRockmate``: a model that trains within an activation-memory budget, in one call.

``HRockmate(model, sample, budget, config="hiremate", **overrides)`` captures the model's
CD-graph, solves it (:func:`hiremate.hierarchical.solve`: flat solvers on small graphs, menus of
blocks and rk-Rotor on large ones, the fastest schedule the simulator accepts within the budget)
and runs the schedule with the executor (``hiremate.executor.RematModule``). The result is an
``nn.Module`` to call instead of the model. ``save``/``load`` keep the graph and the schedule, so
a later run skips capture and solving.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from hiremate.budget import resolve_budget
from hiremate.config import Config, load_config
from hiremate.errors import ConfigError, HiremateError
from hiremate.graph import Graph
from hiremate.schedule import Schedule, schedule_from_list, schedule_to_list
from hiremate.simulator import simulate

log = logging.getLogger(__name__)

SAVE_FORMAT = 1


def solve_graph(graph: Graph, budget: int | float | str, config: Any = "hiremate",
                **overrides: Any):
    """Solve an already captured graph: a :class:`~hiremate.hierarchical.SolveResult`."""
    from hiremate.hierarchical import solve
    from hiremate.menu_cache import MenuCache

    cfg = load_config(config, **overrides)
    nbytes = resolve_budget(budget, graph)
    cache = MenuCache(cfg.cache_dir, enabled=cfg.cache)
    result = solve(graph, nbytes, cfg, cache)
    result.report["cache_hits"] = cache.hits
    result.report["cache_misses"] = cache.misses
    return result


class HRockmate(torch.nn.Module):
    """``model`` rescheduled to fit ``budget`` (bytes, ``"512MiB"``, or a fraction of the
    autodiff peak); call it like the model. See the module docstring."""

    def __init__(self, model: torch.nn.Module, sample: Any, budget: int | float | str,
                 config: str | Path | dict | Config | None = "hiremate", **overrides: Any):
        super().__init__()
        from hiremate import build_graph

        cfg = load_config(config, **overrides)
        if budget is None:
            raise ConfigError("HRockmate needs a budget: bytes, '512MiB', or a fraction (0.5)")
        graph = build_graph(model, sample)
        target = resolve_budget(budget, graph)
        result = solve_graph(graph, target, cfg)
        solve_time = result.report["solve_time"]
        self._setup(model, graph, result.schedule, result.report, cfg, sample)
        if self.executor is not None and cfg.calibrate:
            self._calibrate(model, graph, sample, target, cfg, solve_time)

    def _calibrate(self, model, graph: Graph, sample: Any, budget: int, cfg: Config,
                   solve_time: float, tolerance: float = 0.02) -> None:
        """Measure the executor once; while its peak is above the budget (by more than
        ``tolerance``: the cost model missed some memory, e.g. temporaries or allocator
        rounding), solve again with the budget lowered by the excess (or, when that is out of
        the solvers' reach, at the lowest budget they are known to meet), at most
        ``cfg.calibrate`` times. The schedule kept is the fastest (predicted) one whose measured peak fits, else
        the one that measured lowest. The report keeps the user's budget."""
        from hiremate.errors import InfeasibleBudgetError
        from hiremate.measurement import measure

        args, kwargs = _split(sample)
        start = time.perf_counter()
        limit = budget * (1 + tolerance)
        target = budget
        tried = [(self.schedule, self._report,
                  measure(self.executor, *args, repeats=1, warmup=0, **kwargs).peak)]
        for _ in range(cfg.calibrate):
            measured = tried[-1][2]
            if measured <= limit:
                break
            target = target - (measured - budget)
            try:
                result = solve_graph(graph, target, cfg)
            except InfeasibleBudgetError as exc:
                # the lowered budget is out of reach; the lowest budget the solvers are known
                # to meet still lowers the peak, when it is below the last one tried
                low = exc.min_budget
                if low is None or low >= tried[-1][1]["budget"]:
                    break
                target = int(low)
                try:
                    result = solve_graph(graph, target, cfg)
                except InfeasibleBudgetError:
                    break
            solve_time += result.report["solve_time"]
            if any(result.schedule == t[0] for t in tried):
                break
            self._setup(model, graph, result.schedule, result.report, cfg, sample)
            tried.append((self.schedule, self._report,
                          measure(self.executor, *args, repeats=1, warmup=0, **kwargs).peak))
        fits = [t for t in tried if t[2] <= limit]
        best = (min(fits, key=lambda t: t[1]["predicted_time"]) if fits
                else min(tried, key=lambda t: t[2]))
        if best[0] != self.schedule:
            self._setup(model, graph, best[0], best[1], cfg, sample)
        self._report.update(
            budget=budget, solve_time=solve_time, measured_peak=best[2],
            calibration=[(t[1]["budget"], t[1]["predicted_peak"], t[2]) for t in tried],
            calibration_time=time.perf_counter() - start)

    @classmethod
    def from_graph(cls, model: torch.nn.Module, graph: Graph, budget: int | float | str,
                   config: str | Path | dict | Config | None = "hiremate", sample: Any = None,
                   **overrides: Any) -> "HRockmate":
        """Like the constructor, on a graph already captured from ``model`` (no capture)."""
        cfg = load_config(config, **overrides)
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        target = resolve_budget(budget, graph)
        result = solve_graph(graph, target, cfg)
        self._setup(model, graph, result.schedule, result.report, cfg, sample)
        if self.executor is not None and cfg.calibrate and sample is not None:
            self._calibrate(model, graph, sample, target, cfg, result.report["solve_time"])
        return self

    # -- construction ---------------------------------------------------------------------------
    def _setup(self, model, graph: Graph, schedule: Schedule, report: dict, cfg: Config,
               sample: Any = None) -> None:
        self.graph = graph
        self.schedule = tuple(schedule)
        self._report = dict(report)
        self.config = cfg
        self.executor = self._make_executor(model, graph, self.schedule, sample)
        if self.executor is None:
            object.__setattr__(self, "_model", model)

    @staticmethod
    def _make_executor(model, graph: Graph, schedule: Schedule, sample: Any = None):
        try:
            from hiremate.executor import RematModule
        except ImportError as exc:
            log.warning("hiremate.executor is not available (%s): the schedule is solved but "
                        "cannot run", exc)
            return None
        return RematModule(model, graph, schedule, sample=sample)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.executor is None:
            raise HiremateError("hiremate.executor is not installed in this build: the schedule "
                                "was solved (see .report()) but cannot be run")
        return self.executor(*args, **kwargs)

    # -- facts ------------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Predicted figures, autodiff's, solving time, hierarchy facts and winning solvers."""
        return dict(self._report)

    # -- persistence ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Graph, schedule, report and configuration as one JSON file (no weights)."""
        payload = {
            "format": SAVE_FORMAT, "graph": self.graph.to_dict(),
            "schedule": schedule_to_list(self.schedule), "report": self._report,
            "config": self.config.to_dict(),
        }
        Path(path).write_text(json.dumps(payload, default=float))

    @classmethod
    def load(cls, model: torch.nn.Module, path: str | Path) -> "HRockmate":
        """Rebuild from :meth:`save`'s file on ``model`` (same architecture): no capture, no
        solving; the schedule is checked with the simulator."""
        try:
            payload = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read a saved HRockmate from {path}: {exc}") from exc
        if payload.get("format") != SAVE_FORMAT:
            raise ConfigError(f"{path} has format {payload.get('format')!r}; this hiremate reads "
                              f"{SAVE_FORMAT}: solve again")
        graph = Graph.from_dict(payload["graph"])
        schedule = schedule_from_list(payload["schedule"])
        simulate(graph, schedule).raise_if_invalid()
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        report = dict(payload["report"], solve_time=0.0, loaded_from=str(path))
        self._setup(model, graph, schedule, report, Config.from_dict(payload["config"]))
        return self


def _split(sample: Any) -> tuple[tuple, dict]:
    if isinstance(sample, dict):
        return (), dict(sample)
    if isinstance(sample, (tuple, list)):
        return tuple(sample), {}
    return (sample,), {}
