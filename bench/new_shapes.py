"""Sequence lengths that change from batch to batch: what each new length costs, with and
without ``transfer_schedules``.

A Hugging Face causal LM (GPT2 from a config: default arguments, dropout on) is wrapped at a
budget on a sample of ``--sample-len`` tokens, then called with labels at each of ``--lengths``
(as a data collator that pads each batch to its longest sequence gives). For each mode
(``transfer``: the default; ``solve``: ``transfer_schedules=False``, a solve per new length)
and each length: the seconds of the first call and backward (capture, and the solve or the
transfer), which solver gave the schedule, the predicted time over autodiff's and the lower
bound on it, and the measured step (the fastest of ``--repeats``): its peak over the budget
and its time over eager PyTorch's, eager measured in the same run. Run::

    python bench/new_shapes.py                          # GPT2 6 x 256, 4 x 128 tokens, 0.5
    python bench/new_shapes.py --lengths 100 150 --modes transfer --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import torch

from hiremate import HRockmate
from hiremate.runtime.measurement import measure


def gpt2(layers: int, width: int, vocab: int):
    """GPT2LMHeadModel from a config with the library's defaults but its sizes."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=vocab,
                        n_positions=1024, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def batch(size: int, length: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (size, length), generator=gen)
    return {"input_ids": ids, "labels": ids}


def run_mode(model, args, transfer: bool) -> list[dict]:
    start = time.perf_counter()
    wrapped = HRockmate(model, batch(args.batch, args.sample_len, args.vocab, 0), args.budget,
                        cache=False, calibrate=0, transfer_schedules=transfer,
                        cost_model=args.cost, max_shapes=len(args.lengths))
    rows = [{"length": args.sample_len, "first_step_s": time.perf_counter() - start,
             **_facts(wrapped.report())}]
    for i, length in enumerate(args.lengths, start=1):
        inputs = batch(args.batch, length, args.vocab, i)
        start = time.perf_counter()
        wrapped(**inputs).loss.backward()
        seconds = time.perf_counter() - start
        variant = next(v for v in wrapped.variants()
                       if v["inputs"][0][1] == (args.batch, length))
        rows.append({"length": length, "first_step_s": seconds, **_facts(variant["report"])})
    for row in rows:
        inputs = batch(args.batch, row["length"], args.vocab, 99)
        eager = measure(model, repeats=args.repeats, **inputs)
        ours = measure(wrapped, repeats=args.repeats, **inputs)
        row.update(peak_over_budget=ours.peak / row["budget"], peak_over_eager=ours.peak /
                   eager.peak, time_over_eager=ours.time / eager.time)
    return rows


#: the columns that :func:`measured_columns` fills, for a table's header
MEASURED_HEADER = "pred. rel. time  bound   peak/budget  peak/eager  time/eager"


def measured_columns(row: dict) -> str:
    """A row's predicted time (over autodiff's) and its bound, and its measured step: peak over
    the budget and over eager's, time over eager's (``MEASURED_HEADER`` names them)."""
    return (f"{row['relative_time']:15.4f}  {row['relative_time_bound'] or 0:6.4f} "
            f"{row['peak_over_budget']:12.3f} {row['peak_over_eager']:11.3f} "
            f"{row['time_over_eager']:11.3f}")


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """The GPT2 sizes, budget, cost model and output file the GPT2 benchmarks share."""
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--cost", default="auto")
    parser.add_argument("--json", help="write the rows here")


def write_json(path: str | None, args: argparse.Namespace, key: str, rows) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"args": vars(args), key: rows}, f, indent=1)


def _facts(report: dict) -> dict:
    return {key: report.get(key) for key in ("solver", "budget", "relative_time",
                                             "relative_time_bound", "relative_peak")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser)
    parser.add_argument("--sample-len", type=int, default=128)
    parser.add_argument("--lengths", type=int, nargs="+", default=[117, 100, 64, 150, 200])
    parser.add_argument("--modes", nargs="+", default=["transfer", "solve"],
                        choices=["transfer", "solve"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    model = gpt2(args.layers, args.width, args.vocab)
    results = {}
    print(f"mode      length  first step (s)  solver                      {MEASURED_HEADER}")
    for mode in args.modes:
        results[mode] = run_mode(model, args, transfer=mode == "transfer")
        for r in results[mode]:
            print(f"{mode:9} {r['length']:6} {r['first_step_s']:15.2f}  {r['solver']:27} "
                  + measured_columns(r))
    write_json(args.json, args, "results", results)


if __name__ == "__main__":
    main()
