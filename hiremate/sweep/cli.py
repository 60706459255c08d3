"""The ``sweep``, ``solve`` and ``plot`` subcommands of the ``hiremate`` command line.

Kept apart from :mod:`hiremate.cli` so that the main parser only has to call
:func:`add_commands`; each command returns an exit status and lets :class:`HiremateError`
through to ``main``, which prints it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from hiremate.sweep.spec import BACKENDS
from hiremate.units import fmt_bytes


def _budget(text: str) -> int | float | str:
    """A budget as typed: ``0.5`` (fraction), ``2MiB`` (size) or ``1000000`` (bytes)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def cmd_sweep(args: argparse.Namespace) -> int:
    from hiremate.sweep.driver import run_sweep

    outcome = run_sweep(args.file, args.out, backend=args.backend, scheduler=args.scheduler,
                        n_jobs=args.n_jobs, progress=False if args.no_progress else "auto",
                        retry_errors=args.retry_errors)
    statuses: dict[str, int] = {}
    for rec in outcome.store.cells.values():
        if rec["key"] in outcome.ran:
            statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "nothing to run"
    print(f"sweep: {len(outcome.ran)} cells run ({summary}), {len(outcome.skipped)} already done")
    for name, path in outcome.files.items():
        print(f"  {name:6s} {path}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from hiremate.sweep.driver import replot

    for name, path in replot(args.results_dir).items():
        print(f"  {name:6s} {path}")
    return 0


def _report_line(key: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and "peak" in key:
        value = f"{fmt_bytes(value)} ({value} bytes)"
    elif isinstance(value, float):
        value = f"{value:.6g}"
    elif isinstance(value, (dict, list)):
        value = json.dumps(value, default=str)
        if len(value) > 200:
            value = value[:200] + "..."
    return f"  {key:24s} {value}"


def cmd_solve(args: argparse.Namespace) -> int:
    from hiremate import zoo
    from hiremate.api import HRockmate

    model, sample = zoo.get(args.name, layers=args.layers, width=args.width, batch=args.batch)
    module = HRockmate(model, sample, _budget(args.budget), config=args.config)
    print(f"{args.name} solved with config {args.config!r}, budget {args.budget}")
    for key, value in module.report().items():
        print(_report_line(key, value))
    if args.out:
        module.save(args.out)
        print(f"saved to {args.out} (load with HRockmate.load(model, path))")
    return 0


def add_commands(sub: Any) -> None:
    """Add ``sweep``, ``solve`` and ``plot`` to the ``hiremate`` parser's subparsers."""
    sweep = sub.add_parser("sweep", help="run a sweep file: models x budgets x methods")
    sweep.add_argument("file", help="sweep YAML (e.g. configs/sweeps/smoke.yaml)")
    sweep.add_argument("--out", help="output folder (default: sweep-results/<name>)")
    sweep.add_argument("--backend", choices=BACKENDS, help="joblib backend (default: the file's)")
    sweep.add_argument("--scheduler", help="dask scheduler address (with --backend dask)")
    sweep.add_argument("--n-jobs", type=int, help="parallel cells (timings get noisy above 1)")
    sweep.add_argument("--retry-errors", action="store_true", help="run failed cells again")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.set_defaults(func=cmd_sweep)

    solve = sub.add_parser("solve", help="solve a zoo model for a budget and save the module")
    solve.add_argument("name", help="zoo model name (see hiremate.zoo.names())")
    solve.add_argument("--budget", required=True,
                       help="bytes, a size ('2MiB') or a fraction of the autodiff peak (0.5)")
    solve.add_argument("--config", default="hiremate", help="preset name or YAML path")
    solve.add_argument("--layers", type=int)
    solve.add_argument("--width", type=int)
    solve.add_argument("--batch", type=int)
    solve.add_argument("--out", metavar="FILE", help="save graph+schedule (JSON) here")
    solve.set_defaults(func=cmd_solve)

    plot = sub.add_parser("plot", help="redraw a sweep's table and plots from results.json")
    plot.add_argument("results_dir", help="a sweep's output folder")
    plot.set_defaults(func=cmd_plot)
