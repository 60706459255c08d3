"""Plots of a sweep: measured time overhead against measured peak memory, one per model.

Each method is one line through its measured cells, sorted by peak; a method measured once per
model (eager, checkpoint) is one marker. Cells whose measured peak broke their budget (beyond
the sweep's tolerance) are drawn hollow. The Agg backend is used, so plots work with no display.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from hiremate.sweep.results import by_model

log = logging.getLogger(__name__)

_MARKERS = "os^Dv<>pPX*h"


def _unit(max_bytes: float) -> tuple[str, float]:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= scale:
            return unit, float(scale)
    return "B", 1.0


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"


def plot_model(model: str, records: list[dict[str, Any]], path: Path) -> Path:
    """One PNG: x = measured peak, y = measured time overhead over eager (%)."""
    import matplotlib.pyplot as plt

    fig = model_figure(model, records)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def model_figure(model: str, records: list[dict[str, Any]]) -> Any:
    """The matplotlib figure of :func:`plot_model` (left open for the caller)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r["status"] == "ok" and r.get("measured_peak") is not None]
    unit, scale = _unit(max((r["measured_peak"] for r in ok), default=1))
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    methods: list[str] = []
    for r in ok:
        if r["method"] not in methods:
            methods.append(r["method"])
    for i, method in enumerate(methods):
        pts = sorted((r for r in ok if r["method"] == method), key=lambda r: r["measured_peak"])
        xs = [r["measured_peak"] / scale for r in pts]
        ys = [(r["time_rel"] - 1.0) * 100.0 for r in pts]
        marker = _MARKERS[i % len(_MARKERS)]
        (line,) = ax.plot(xs, ys, marker=marker, linestyle="-" if len(pts) > 1 else "none",
                          label=method)
        over = [(x, y) for x, y, r in zip(xs, ys, pts) if r.get("feasible") is False]
        if over:
            ax.scatter([x for x, _ in over], [y for _, y in over], s=90, facecolors="white",
                       edgecolors=line.get_color(), marker=marker, zorder=3)
    eager = next((r for r in ok if r["method"] == "eager"), None)
    if eager is not None:
        ax.axvline(eager["measured_peak"] / scale, color="grey", linestyle=":", linewidth=1)
    ax.axhline(0.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(f"measured peak activation memory ({unit})")
    ax.set_ylabel("measured time overhead over eager (%)")
    ax.set_title(f"{model}: time overhead vs peak memory")
    ax.grid(True, alpha=0.3)
    if methods:
        handles, labels = ax.get_legend_handles_labels()
        if any(r.get("feasible") is False for r in ok):
            handles.append(ax.scatter([], [], s=60, facecolors="white", edgecolors="black"))
            labels.append("hollow: over budget")
        ax.legend(handles, labels, title="method", fontsize="small")
    fig.tight_layout()
    return fig


def plot_all(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per model in ``out_dir``: ``<model>.png``."""
    return [plot_model(model, recs, Path(out_dir) / f"{safe_name(model)}.png")
            for model, recs in by_model(records).items()]
