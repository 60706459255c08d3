"""Solve times of the Hugging Face models that issue 18 bounds: the capture issue's small
models at 0.5 (at most 60 s each) and GPT2 with 6 layers of width 256 on 4 x 128 tokens at 0.5
and 0.3 (at most 30 s). Whole step, default preset, menu cache off, no calibration.

    python bench/hf_solve_time.py                      # every row, FLOP costs, n_jobs 2
    python bench/hf_solve_time.py gpt2 gpt2-6x256      # these rows
    python bench/hf_solve_time.py --cost roofline --n-jobs 1

Each row: compute nodes, budget fraction, solve time (the whole step's, every solve of the
walk), solves, predicted relative time, winner; or the error a user would read.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

SMALL = ("opt", "bert_mlm", "gpt_neox", "llama", "gpt2")
LARGE = "gpt2-6x256"


def _model(name: str):
    if name == LARGE:
        from hiremate.zoo.sized import gpt2

        return gpt2(layers=6, width=256, seq=128, batch=4)
    import capture_zoo

    model, sample, _ = capture_zoo.get(name).build()
    return model, sample


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=[*SMALL, LARGE])
    parser.add_argument("--cost", default="flops")
    parser.add_argument("--n-jobs", type=int, default=2)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    import hiremate
    from hiremate.api import solve_graph
    from hiremate.errors import HiremateError

    print("| model | compute nodes | budget | solve (s) | solves | pred. rel. time | winner |")
    print("|---|---|---|---|---|---|---|")
    for name in args.names:
        model, sample = _model(name)
        graph = hiremate.build_graph(model, sample, cost_model=args.cost)
        for fraction in ((0.5, 0.3) if name == LARGE else (0.5,)):
            start = time.perf_counter()
            try:
                report = solve_graph(graph, fraction, "hiremate", cache=False, calibrate=0,
                                     n_jobs=args.n_jobs, progress=False).report
            except HiremateError as exc:
                print(f"| {name} | {len(graph.nodes)} | {fraction} | "
                      f"{time.perf_counter() - start:.1f} | | {type(exc).__name__}: "
                      f"{str(exc)[:120]} | |", flush=True)
                continue
            print(f"| {name} | {len(graph.nodes)} | {fraction} | {report['solve_time']:.1f} | "
                  f"{report['whole_step_solves']} | {report['relative_time']:.3f} | "
                  f"{report['solver']} |", flush=True)


if __name__ == "__main__":
    main()
