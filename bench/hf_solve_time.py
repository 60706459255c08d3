"""Solve times of the Hugging Face models that issue 18 bounds: the capture issue's small
models at 0.5 (at most 60 s each) and GPT2 with 6 layers of width 256 on 4 x 128 tokens at 0.5
and 0.3 (at most 30 s). Whole step, default preset, menu cache off, no calibration.

    python bench/hf_solve_time.py                      # every row, FLOP costs, n_jobs 2
    python bench/hf_solve_time.py gpt2 gpt2-6x256      # these rows
    python bench/hf_solve_time.py --cost roofline --n-jobs 1
    python bench/hf_solve_time.py --wrap llama t5     # the user's path, in float64

Each row: compute nodes, budget fraction, solve time (the whole step's, every solve of the
walk), solves, predicted relative time, winner; or the error a user would read. With
``--wrap``: ``HRockmate(model, sample, 0.5, cache=False, n_jobs=...)`` on the model and sample
in float64 with the default costs, as a user builds it (calibration on), and the wrapper's
wall time and its measured and predicted peaks beside the solve's figures.
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
    parser.add_argument("--wrap", action="store_true",
                        help="the user's path: HRockmate on the float64 model")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    if args.wrap:
        _wrap_rows(args.names, args.n_jobs)
        return
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


def _wrap_rows(names: list[str], n_jobs: int) -> None:
    """One row per model of the user's path (module docstring)."""
    import torch

    import hiremate
    from hiremate.errors import HiremateError

    def double(x):
        return x.double() if torch.is_tensor(x) and x.is_floating_point() else x

    print("| model | compute nodes | wrap (s) | solve (s) | pred. rel. time | winner | "
          "measured / predicted peak |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        model, sample = _model(name)
        model = model.double()
        sample = ({k: double(v) for k, v in sample.items()} if isinstance(sample, dict)
                  else double(sample))
        start = time.perf_counter()
        try:
            remat = hiremate.HRockmate(model, sample, 0.5, cache=False, n_jobs=n_jobs,
                                       progress=False)
        except HiremateError as exc:
            print(f"| {name} | | {time.perf_counter() - start:.1f} to the error | | "
                  f"{type(exc).__name__}: {str(exc)[:120]} | | |", flush=True)
            continue
        wrap = time.perf_counter() - start
        rep = remat.report()
        print(f"| {name} | {rep['compute_nodes']} | {wrap:.1f} | {rep['solve_time']:.1f} | "
              f"{rep['relative_time']:.4f} | {rep['solver']} | "
              f"{rep.get('measured_peak')} / {rep['predicted_peak']} |", flush=True)


if __name__ == "__main__":
    main()
