"""A Hugging Face causal LM given labels returns its loss and its logits, and is trained from
the loss: what capturing it with a tangent for the loss alone (``output_gradients: auto``, the
default) gives against a tangent for every output (``all``, before it existed).

GPT2 from a config (default arguments, dropout on) is wrapped at ``--budget`` (a fraction of
the graph's autodiff peak) with each setting, and ``auto`` also at the bytes ``all`` was given
(the same memory). For each: the graph's autodiff peak over eager's measured peak, the budget,
the solve's seconds and predicted time over autodiff's, and the measured step (``out.loss.
backward()``): its peak over the budget and over eager's, and its time over eager's, the
fastest of ``--rounds`` rounds that alternate the two. ``--zoo`` instead solves the capture
issue's Hugging Face models (``tests/capture_zoo.py``) given labels with FLOP costs (predicted
figures only). Run::

    python bench/loss_beside_logits.py --json out.json
    python bench/loss_beside_logits.py --zoo llama gpt2 bert_mlm t5 whisper
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from hiremate import HRockmate
from hiremate.runtime.measurement import measure
from new_shapes import (
    MEASURED_HEADER, batch, gpt2, measured_columns, model_arguments, write_json,
)


def paired(model, wrapped, inputs: dict, rounds: int) -> tuple:
    """(eager, wrapped) measurements: the fastest of ``rounds`` alternated runs of each."""
    best: list = [None, None]
    for _ in range(rounds):
        for i, fn in enumerate((model, wrapped)):
            m = measure(fn, repeats=1, **inputs)
            if best[i] is None or m.time < best[i].time:
                best[i] = m
    return best[0], best[1]


def zoo(names: list[str]) -> None:
    """Per model: autodiff peak and predicted time over autodiff's at 0.5 with ``all`` and
    ``auto``, and with ``auto`` at the bytes ``all`` was given."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import capture_zoo

    def wrap(name: str, budget, setting: str) -> dict:
        model, sample, _ = capture_zoo.get(name).build()
        sample = dict(sample)
        if "labels" not in sample:  # the tokens the decoder (or the model) reads
            sample["labels"] = sample.get("decoder_input_ids", sample.get("input_ids")).clone()
        return HRockmate(model, sample, budget, cache=False, calibrate=0, cost_model="flops",
                         output_gradients=setting, n_jobs=2).report()

    print("model      autodiff peak, all / auto   pred. rel. time, all / auto / auto at all's")
    for name in names:
        every, auto = wrap(name, 0.5, "all"), wrap(name, 0.5, "auto")
        same = wrap(name, int(every["budget"]), "auto")
        print(f"{name:10} {every['autodiff_peak']:13,} / {auto['autodiff_peak']:<11,} "
              f"{every['relative_time']:.4f} / {auto['relative_time']:.4f} / "
              f"{same['relative_time']:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--zoo", nargs="+", metavar="CASE",
                        help="capture-zoo models instead (tests/capture_zoo.py names)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    if args.zoo:
        zoo(args.zoo)
        return
    model = gpt2(args.layers, args.width, args.vocab)
    sample = batch(args.batch, args.length, args.vocab, 0)
    inputs = batch(args.batch, args.length, args.vocab, 1)
    common = {"cache": False, "calibrate": 0, "cost_model": args.cost}
    rows = []
    every_budget = None
    for name, setting, budget in (("all", "all", args.budget), ("auto", "auto", args.budget),
                                  ("auto, all's bytes", "auto", None)):
        start = time.perf_counter()
        wrapped = HRockmate(model, sample, every_budget if budget is None else budget,
                            output_gradients=setting, **common)
        seconds = time.perf_counter() - start
        report = wrapped.report()
        if setting == "all":
            every_budget = int(report["budget"])
        eager, ours = paired(model, wrapped, inputs, args.rounds)
        rows.append({
            "setting": name, "budget_mib": report["budget"] / 2**20,
            "autodiff_over_eager_peak": report["autodiff_peak"] / eager.peak,
            "build_s": seconds, "solver": report["solver"],
            "relative_time": report["relative_time"],
            "relative_time_bound": report.get("relative_time_bound"),
            "peak_over_budget": ours.peak / report["budget"],
            "peak_over_eager": ours.peak / eager.peak, "time_over_eager": ours.time / eager.time,
        })
    print("setting            budget (MiB)  autodiff/eager peak  build (s)  solver"
          f"                 {MEASURED_HEADER}")
    for r in rows:
        print(f"{r['setting']:18} {r['budget_mib']:12.2f} {r['autodiff_over_eager_peak']:20.3f} "
              f"{r['build_s']:10.1f}  {r['solver']:22} " + measured_columns(r))
    write_json(args.json, args, "rows", rows)


if __name__ == "__main__":
    main()
