"""The file :meth:`hiremate.HRockmate.save` writes and :meth:`hiremate.HRockmate.load` reads:
graph, schedule, report, configuration and the budget as given, as one JSON document (no
weights)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hiremate.config import Config
from hiremate.errors import ConfigError, FileAccessError
from hiremate.ir.graph import Graph
from hiremate.ir.schedule import Schedule, schedule_from_list, schedule_to_list
from hiremate.ir.simulator import simulate

#: the layout of the file; another one is refused (solve again)
SAVE_FORMAT = 1


@dataclass
class Saved:
    """What a file holds, checked: the schedule is valid on the graph."""

    graph: Graph
    schedule: Schedule
    report: dict[str, Any]
    config: Config
    budget_arg: Any
    training_modes: list[bool] | None
    loss: dict[str, Any] | None  # None: the model's schedule alone; else {"target": bool}
    model: Any                   # the saved model's structure (hiremate.runtime.structure)


def write(path: str | Path, graph: Graph, schedule: Schedule, report: dict[str, Any],
          config: Config, budget_arg: Any, training_modes: list[bool],
          loss: dict[str, Any] | None, model: Any) -> None:
    payload = {
        "format": SAVE_FORMAT, "graph": graph.to_dict(), "schedule": schedule_to_list(schedule),
        "report": report, "config": config.to_dict(), "budget_arg": budget_arg,
        "training_modes": list(training_modes), "loss": loss, "model": model,
    }
    text = json.dumps(payload, default=float)
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise FileAccessError(f"cannot save the HRockmate to {path}: {exc}; give a path in an "
                              "existing folder that can be written") from exc


def read(path: str | Path, has_loss_fn: bool) -> Saved:
    """The file at ``path``; a :class:`~hiremate.errors.ConfigError` when it cannot be read,
    is of another format, or was saved with a captured loss and ``has_loss_fn`` is False (or
    the other way round)."""
    try:
        payload = json.loads(Path(path).read_text())
    except OSError as exc:
        raise FileAccessError(f"cannot read a saved HRockmate from {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"cannot read a saved HRockmate from {path}: {exc}") from exc
    if payload.get("format") != SAVE_FORMAT:
        raise ConfigError(f"{path} has format {payload.get('format')!r}; this hiremate reads "
                          f"{SAVE_FORMAT}: solve again")
    graph = Graph.from_dict(payload["graph"])
    schedule = schedule_from_list(payload["schedule"])
    simulate(graph, schedule).raise_if_invalid()
    report = dict(payload["report"], solve_time=0.0, loaded_from=str(path))
    loss = payload.get("loss")
    if (loss is None) == has_loss_fn:
        raise ConfigError(
            f"{path} was saved with a captured loss: pass the same loss_fn to load it"
            if loss is not None else
            f"{path} holds the model's schedule alone (no captured loss); load it without "
            "loss_fn")
    modes = payload.get("training_modes")
    # files saved before "budget_arg" existed: their budget in bytes (kept for new shapes)
    return Saved(graph, schedule, report, Config.from_dict(payload["config"]),
                 payload.get("budget_arg", report.get("budget")),
                 modes if isinstance(modes, list) else None, loss, payload.get("model"))
