"""Results of a sweep: the store that makes a sweep resumable, and its CSV, JSON and markdown.

``results.json`` in the output folder holds the spec and one record per finished cell, keyed by
``model|budget|method``; it is rewritten (atomically) after every cell, so a sweep that is
stopped loses at most the cells in flight, and a second run skips every cell already there.
Records are flat dicts (:data:`COLUMNS`), so that the CSV and the table are plain views of them.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable

from hiremate.errors import ConfigError
from hiremate.units import fmt_bytes

log = logging.getLogger(__name__)

FORMAT = 1
RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"

#: Statuses of a cell. ``ok``: measured; ``infeasible``: the method said no schedule fits;
#: ``not_applicable``: the method cannot run on the model; ``error``: anything else failed.
STATUSES = ("ok", "infeasible", "not_applicable", "error")

COLUMNS = (
    "key", "model", "budget", "method", "kind", "status", "feasible", "budget_bytes",
    "budget_fraction", "eager_peak", "eager_time", "measured_peak", "measured_time",
    "peak_rel", "time_rel", "predicted_peak", "predicted_time", "solve_time", "setup_time",
    "device", "measure_method", "cell_time", "message", "extra",
)


def cell_key(model: str, budget: str, method: str) -> str:
    return f"{model}|{budget}|{method}"


class ResultStore:
    """The records of one output folder; see the module docstring."""

    def __init__(self, out_dir: str | Path, spec: dict[str, Any] | None = None):
        self.out_dir = Path(out_dir)
        self.spec = spec
        self.cells: dict[str, dict[str, Any]] = {}

    @property
    def path(self) -> Path:
        return self.out_dir / RESULTS_JSON

    @classmethod
    def load(cls, out_dir: str | Path) -> "ResultStore":
        """The store of ``out_dir``; empty when it has no results.json yet."""
        store = cls(out_dir)
        if store.path.is_file():
            try:
                payload = json.loads(store.path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ConfigError(f"cannot read {store.path}: {exc}; move it away to start the "
                                  "sweep afresh") from exc
            if payload.get("format") != FORMAT:
                raise ConfigError(f"{store.path} has format {payload.get('format')!r}, this "
                                  f"hiremate writes {FORMAT}; move it away to start afresh")
            store.spec = payload.get("spec")
            store.cells = dict(payload.get("cells", {}))
        return store

    def add(self, record: dict[str, Any]) -> None:
        self.cells[record["key"]] = record

    def save(self) -> None:
        """Write results.json atomically (a stopped sweep never leaves half a file)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "spec": self.spec, "cells": self.cells},
                                  indent=1, default=_jsonable))
        os.replace(tmp, self.path)

    def records(self) -> list[dict[str, Any]]:
        return sorted(self.cells.values(), key=_order_key(self.spec))

    def write_all(self) -> dict[str, Path]:
        """results.json, results.csv and results.md; returns their paths."""
        self.save()
        records = self.records()
        csv_path = self.out_dir / RESULTS_CSV
        write_csv(records, csv_path)
        md_path = self.out_dir / RESULTS_MD
        md_path.write_text(markdown_report(records, title=(self.spec or {}).get("name")))
        return {"json": self.path, "csv": csv_path, "md": md_path}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _order_key(spec: dict[str, Any] | None):
    methods = list((spec or {}).get("methods") or [])
    budgets = [b["label"] for b in (spec or {}).get("budgets") or []]
    models = [m["label"] for m in (spec or {}).get("models") or []]

    def index(seq: list[str], value: str) -> int:
        return seq.index(value) if value in seq else len(seq)

    def key(r: dict[str, Any]) -> tuple:
        return (index(models, r["model"]), r["model"], index(methods, r["method"]), r["method"],
                r["budget"] != "-", index(budgets, r["budget"]), r["budget"])

    return key


def write_csv(records: Iterable[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for r in records:
            row = dict(r)
            row["extra"] = json.dumps(r.get("extra") or {}, sort_keys=True, default=str)
            writer.writerow(row)


# --------------------------------------------------------------------------------------------
# markdown


def _fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "ratio":
        return f"{value:.2f}"
    if kind == "s":
        return f"{value:.2f}"
    if kind == "ms":
        return f"{value * 1e3:.2f}"
    if kind == "bool":
        return "yes" if value else "no"
    return str(value)


TABLE = (
    ("method", "method", "str"), ("budget", "budget", "str"),
    ("budget bytes", "budget_bytes", "bytes"), ("status", "status", "str"),
    ("predicted peak", "predicted_peak", "bytes"), ("measured peak", "measured_peak", "bytes"),
    ("peak / eager", "peak_rel", "ratio"), ("time / eager", "time_rel", "ratio"),
    ("time (ms)", "measured_time", "ms"), ("solve (s)", "solve_time", "s"),
    ("fits", "feasible", "bool"),
)


def markdown_table(records: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(t for t, _, _ in TABLE) + " |"
    rule = "|" + "|".join("---" for _ in TABLE) + "|"
    rows = ["| " + " | ".join(_fmt(r.get(k), kind) for _, k, kind in TABLE) + " |"
            for r in records]
    return "\n".join([head, rule, *rows])


def by_model(records: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r["model"], []).append(r)
    return out


def best_time_within(records: list[dict[str, Any]], method: str, peak: int) -> dict | None:
    """The fastest measured cell of ``method`` whose measured peak is at most ``peak``, by its
    time relative to eager (paired within its cell when the sweep pairs timings: absolute
    times of different cells were measured under different loads)."""
    fits = [r for r in records if r["method"] == method and r["status"] == "ok"
            and r.get("measured_peak") is not None and r["measured_peak"] <= peak]
    return min(fits, key=lambda r: (r.get("time_rel", r["measured_time"]), r["measured_time"]),
               default=None)


def lowest_peak(records: list[dict[str, Any]], method: str) -> dict | None:
    ok = [r for r in records if r["method"] == method and r["status"] == "ok"]
    return min(ok, key=lambda r: r["measured_peak"], default=None)


def equal_peak_rows(records: list[dict[str, Any]], method: str, against: str) -> list[dict]:
    """For each measured cell of ``method``: ``against``'s fastest cell at no higher measured
    peak (the fair comparison: same memory, who is faster?), ``None`` where it has none."""
    rows = []
    for r in records:
        if r["method"] != method or r["status"] != "ok":
            continue
        other = best_time_within(records, against, r["measured_peak"])
        rows.append({"model": r["model"], "budget": r["budget"], "peak": r["measured_peak"],
                     "time_rel": r["time_rel"], "other": other})
    return rows


def comparison_markdown(records: list[dict[str, Any]], hiremate_methods: list[str],
                        against: str = "compile") -> str:
    """Per model: each hiremate preset against ``against`` at equal measured peak, and the
    lowest measured peak each method reached."""
    lines: list[str] = []
    for model, recs in by_model(records).items():
        present = [m for m in hiremate_methods if any(r["method"] == m for r in recs)]
        if not present or not any(r["method"] == against for r in recs):
            continue
        lines += [f"### {model}: hiremate vs {against} at equal measured peak", "",
                  f"| method | budget | measured peak | time / eager | {against} time / eager "
                  f"at <= that peak | faster |", "|---|---|---|---|---|---|"]
        for m in present:
            for row in equal_peak_rows(recs, m, against):
                other = row["other"]
                other_t = "none reaches it" if other is None else f"{other['time_rel']:.2f}"
                faster = ("n/a" if other is None
                          else "yes" if row["time_rel"] <= other["time_rel"] else "no")
                lines.append(f"| {m} | {row['budget']} | {fmt_bytes(row['peak'])} | "
                             f"{row['time_rel']:.2f} | {other_t} | {faster} |")
        lines += ["", "Lowest measured peak reached:", ""]
        for m in [*present, against]:
            low = lowest_peak(recs, m)
            if low is not None:
                lines.append(f"- {m}: {fmt_bytes(low['measured_peak'])} "
                             f"({low['peak_rel']:.2f} of eager, time {low['time_rel']:.2f} of "
                             f"eager, budget {low['budget']})")
        lines.append("")
    return "\n".join(lines)


def markdown_report(records: list[dict[str, Any]], title: str | None = None) -> str:
    """One table per model, then the equal-peak comparison where it applies."""
    lines = [f"# Sweep {title or ''}".rstrip(), ""]
    for model, recs in by_model(records).items():
        eager = next((r for r in recs if r["method"] == "eager" and r["status"] == "ok"), None)
        header = f"## {model}"
        if eager is not None:
            header += (f" (eager: peak {fmt_bytes(eager['measured_peak'])}, "
                       f"{eager['measured_time'] * 1e3:.2f} ms)")
        lines += [header, "", markdown_table(recs), ""]
        bad = [r for r in recs if r["status"] in ("error", "not_applicable") and r.get("message")]
        for r in bad:
            lines.append(f"- {r['method']} {r['budget']}: {r['status']}: {r['message']}")
        if bad:
            lines.append("")
    hiremate = sorted({r["method"] for r in records if r.get("kind") == "hiremate"})
    comparison = comparison_markdown(records, hiremate)
    if comparison:
        lines += ["## At equal measured peak", "", comparison]
    return "\n".join(lines).rstrip() + "\n"
