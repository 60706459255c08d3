"""The models table: run the capture acceptance check (``tests/capture_check.py``) on every
case of ``tests/capture_zoo.py`` (or the ones named) and write ``docs/models.md``.

    python bench/capture_models.py                       # every case, default preset
    python bench/capture_models.py gpt2 bert_mlm         # these rows only; the others are kept
    python bench/capture_models.py --render              # the page again from docs/models.json

Each case runs in its own process (``--timeout`` seconds, default 900) with a fresh menu cache,
so solving times are those of a first build. The raw figures go to ``docs/models.json``; the
page is rendered from it, so a partial run updates its rows and keeps the rest (each row says
when it was made).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _one(name: str, budget: float, config: str) -> dict:
    """Run one case in this process; the Outcome as a dict."""
    import logging

    logging.disable(logging.WARNING)
    import capture_check
    import capture_zoo

    case = capture_zoo.get(name)
    with tempfile.TemporaryDirectory() as cache:
        out = capture_check.check_case(case, budget, catch=True, config=config,
                                       cache_dir=cache, progress=False)
    row = dataclasses.asdict(out)
    row["failures"] = out.failures()
    return row


def _run(name: str, budget: float, config: str, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--budget", str(budget), "--config", config]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"name": name, "status": "error", "stage": "timeout",
                "error": f"no result within {timeout:.0f} s", "failures": ["timeout"]}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"name": name, "status": "error", "stage": "process",
                "error": f"exit {proc.returncode}: {err[-1] if err else ''}"[:300],
                "failures": ["process died"], "wall": wall}
    row = json.loads(lines[-1])
    row["wall"] = wall
    return row


def _f(x, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _short(text: str, limit: int = 220) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _result(row: dict) -> str:
    status = row["status"]
    if status == "ok":
        return "ok" if not row.get("failures") else "**fails checks**"
    if status == "expected-error":
        return f"expected error: {_short(row['error'])}"
    if status == "skipped":
        return f"skipped: {row['error']}"
    return f"**{row.get('stage', '')}**: {_short(row['error'])}"


def render(rows: dict[str, dict], order: list[str], meta: dict) -> str:
    head = [
        "# Models users bring: capture, solve, run",
        "",
        "Each model (tiny sizes, float64, random weights, default configuration and call "
        "arguments; builders in `tests/capture_zoo.py`) is captured and solved at 0.5 of its "
        "autodiff peak with the default preset (on `InfeasibleBudgetError`, again at its "
        "`min_budget`), then checked against eager PyTorch by `tests/capture_check.py`, as "
        "`tests/test_capture_models.py` does.",
        "",
        f"Made by `{meta.get('command')}` on {meta.get('date')} (commit {meta.get('commit')}), "
        f"torch {meta.get('torch')}, transformers {meta.get('transformers')}, "
        f"{meta.get('machine')}. A row from an earlier run says so in its last column.",
        "",
        "Columns: *nodes*: compute nodes of the CD-graph; *capture*: `hiremate.build_graph` "
        "(capture and cost measurement), s; *solve*: solving, s (with the "
        "calibration re-solves); *budget*: the budget used, as a fraction of the autodiff peak; "
        "*pred.* and *meas.*: predicted and measured peak / budget (pass: meas. <= 1.05); "
        "*grad err*: largest relative error (max |a-b| / max |b|, per tensor) of the loss and "
        "parameter gradients against eager's (pass: <= 1e-10); *None*: `.grad is None` on the "
        "same parameters as eager; *state*: the build left `state_dict()`, the other buffers, "
        "training and requires_grad flags and the torch RNG as they were (bit for bit).",
        "",
        "| model | result | nodes | capture | solve | budget | pred. | meas. | grad err | None "
        "| state | failed checks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    body = []
    for name in order:
        row = rows.get(name)
        if row is None:
            continue
        budget, ad = row.get("budget"), row.get("autodiff_peak")
        frac = budget / ad if budget and ad else None
        pred = row["predicted_peak"] / budget if budget and row.get("predicted_peak") else None
        meas = (row["measured_peak"] / budget if budget and row.get("measured_peak") is not None
                else None)
        ran = row["status"] == "ok"
        none_ok = "" if not ran or row.get("loss_error") is None else (
            "yes" if not row.get("none_mismatch") else f"no ({len(row['none_mismatch'])})")
        state = "" if row.get("state_changed") is None or row["status"] == "skipped" else (
            "yes" if not row["state_changed"] else f"no ({len(row['state_changed'])} entries)")
        notes = "; ".join(f for f in row.get("failures", []) if ran)
        if row.get("retried_at") is not None:
            notes = f"infeasible at 0.5, built at min_budget; {notes}".rstrip("; ")
        if row.get("date") and row["date"] != meta.get("date"):
            notes = f"{notes} (run {row['date']}, {row.get('commit', 'earlier commit')})".strip()
        star = "*" if row.get("default_run") else ""
        body.append(
            f"| `{name}`{star} ({row.get('what', '')}) | {_result(row).replace('|', '/')} "
            f"| {row.get('nodes') or ''} | {_f(row.get('capture_time'), '.1f')} "
            f"| {_f(row.get('solve_time'), '.1f')} | {_f(frac, '.2f')} | {_f(pred, '.2f')} "
            f"| {_f(meas, '.2f')} | {_f(row.get('grad_error'), '.1e')} | {none_ok} | {state} "
            f"| {notes.replace('|', '/')} |")
    return "\n".join(head + body) + "\n"


def _load(raw_path: Path) -> tuple[dict, dict]:
    """(meta of the last run, rows by name) from the raw file (also its first, rows-only form)."""
    if not raw_path.exists():
        return {}, {}
    raw = json.loads(raw_path.read_text())
    if "rows" in raw:
        return raw.get("meta", {}), raw["rows"]
    return {}, raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--config", default="hiremate")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=str(ROOT / "docs" / "models.md"))
    ap.add_argument("--render", action="store_true",
                    help="only write the page again from the raw file (no run)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args.budget, args.config), default=str))
        return 0

    import capture_zoo
    import torch

    try:
        import transformers
        tf_version = transformers.__version__
    except ImportError:
        tf_version = "not installed"
    order = [c.name for c in capture_zoo.CASES]
    out = Path(args.out)
    raw_path = out.with_suffix(".json")
    meta, rows = _load(raw_path)
    for name, row in rows.items():
        if name in order:
            row["what"] = capture_zoo.get(name).what
            row["default_run"] = not capture_zoo.get(name).slow
    if args.render:
        out.write_text(render(rows, order, meta))
        return 0
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    cmd = "python bench/capture_models.py" + (" " + " ".join(args.cases) if args.cases else "")
    meta = {"command": cmd, "date": date, "commit": commit, "torch": torch.__version__,
            "transformers": tf_version,
            "machine": f"CPU, {os.cpu_count()} cores shared with other jobs"}
    for name in args.cases or order:
        case = capture_zoo.get(name)
        row = _run(name, args.budget, args.config, args.timeout)
        row.update(what=case.what, default_run=not case.slow, date=date, commit=commit)
        rows[name] = row
        print(f"{name}: {row['status']} {row.get('error', '')[:150]} "
              f"{'; '.join(row.get('failures', []))[:200]} ({row.get('wall', 0):.0f} s)",
              flush=True)
        raw_path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str)
                            + "\n")
        out.write_text(render(rows, order, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
