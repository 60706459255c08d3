"""The user's loss captured into the graph, against the loss left outside the module.

For each model and budget (a fraction of eager's measured step: forward, loss, backward), three
ways to build the wrapper, calibration off:

- ``captured``: ``HRockmate(model, sample, budget, loss_fn=lm_loss, target=labels)``, the loss
  scheduled with the model (the call returns the loss);
- ``measured``: ``loss_fn=..., capture_loss=False``, the loss outside, its memory measured at
  build and reserved;
- ``estimate``: no ``loss_fn``, two output-sized tensors reserved.

Each row: whether a schedule was found, its predicted time over autodiff's, and the measured
step peak over the budget (the step the training loop runs: for ``captured`` the module's call,
else the model's call and the loss after it). Run::

    python bench/loss_capture.py                 # HF GPT2 (6 layers, width 256, 2 x 256 tokens)
    python bench/loss_capture.py --model mlp     # a 1,024-class MLP classifier, in seconds
    python bench/loss_capture.py --model llama-8k --loss zoo  # the decision table's Llama
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.nn.functional as F
from torch import nn

import hiremate
from hiremate import HRockmate


def lm_loss(out, labels):
    """Next-token cross-entropy over a causal LM's logits, written as a user writes it."""
    return F.cross_entropy(out.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def build(name: str):
    """(model, model inputs as (args, kwargs), target, loss (output, target) -> scalar)."""
    if name in ("gpt2", "gpt2-8k", "llama-8k"):
        from hiremate.zoo import sized

        # the -8k settings are the decision table's (configs/sweeps/decide.yaml)
        sizes = {} if name == "gpt2" else dict(layers=6 if name == "gpt2-8k" else 4,
                                                 width=256, seq=256, batch=2, vocab=8192)
        model, sample = getattr(sized, name.split("-")[0])(**sizes)
        ids = sample["input_ids"]
        return model, ((), {"input_ids": ids}), ids.roll(-1, dims=1), lm_loss
    if name == "mlp":
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Linear(16, 128), nn.GELU()]
        for _ in range(4):
            layers += [nn.Linear(128, 128), nn.GELU()]
        layers.append(nn.Linear(128, 1024))
        x = torch.randn(256, 16)
        return nn.Sequential(*layers), ((x,), {}), torch.randint(0, 1024, (256,)), \
            F.cross_entropy
    raise SystemExit(f"unknown model {name!r}: gpt2, gpt2-8k, llama-8k or mlp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.7, 0.5, 0.4, 0.3])
    parser.add_argument("--modes", nargs="+", default=["captured", "measured", "estimate"])
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed steps of eager and of each module (the fastest counts)")
    parser.add_argument("--loss", choices=["user", "zoo"], default="user",
                        help="user: the model's own loss (cross-entropy); zoo: "
                        "hiremate.zoo.output_loss, the decision table's (no target)")
    opts = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    model, (args, kwargs), target, loss = build(opts.model)
    if opts.loss == "zoo":
        from hiremate.zoo import output_loss

        target = None

        def loss(out, *_):
            return output_loss(out)
    sample = kwargs if kwargs else args

    def outside_loss(out):
        return loss(out, target)

    torch.manual_seed(0)
    eager = hiremate.measure(model, *args, loss_fn=outside_loss, repeats=opts.repeats,
                             warmup=1, **kwargs)
    print(f"{opts.model}, {opts.loss} loss: eager step {min(eager.times) * 1e3:.0f} ms, peak "
          f"{eager.peak / 2**20:.1f} MiB")
    print("| fraction | mode | budget (MiB) | predicted / autodiff time | measured / budget | "
          "measured time / eager | solve (s) |")
    print("|---|---|---|---|---|---|---|")
    for fraction in opts.fractions:
        budget = int(fraction * eager.peak)
        for mode in opts.modes:
            kw = {"captured": (dict(loss_fn=loss, target=target) if target is not None
                               else dict(loss_fn=output_loss)),
                  "measured": dict(loss_fn=outside_loss, capture_loss=False),
                  "estimate": {}}[mode]
            start = time.perf_counter()
            try:
                module = HRockmate(model, sample, budget, calibrate=0, **kw)
            except hiremate.InfeasibleBudgetError as exc:
                need = f"{exc.min_budget / 2**20:.1f} MiB" if exc.min_budget else "?"
                print(f"| {fraction} | {mode} | {budget / 2**20:.1f} | infeasible (sure to fit: "
                      f"{need}) | | | {time.perf_counter() - start:.0f} |")
                continue
            solve = time.perf_counter() - start
            rep = module.report()
            torch.manual_seed(0)
            if mode == "captured":
                call = kwargs if target is None else {**kwargs, "target": target}
                step = hiremate.measure(module, *args, repeats=opts.repeats, warmup=1, **call)
            else:
                step = hiremate.measure(module, *args, loss_fn=outside_loss,
                                        repeats=opts.repeats, warmup=1, **kwargs)
            print(f"| {fraction} | {mode} | {budget / 2**20:.1f} | "
                  f"{rep['predicted_time'] / rep['autodiff_time']:.3f} | "
                  f"{step.peak / budget:.3f} | {min(step.times) / min(eager.times):.2f} | "
                  f"{solve:.0f} |", flush=True)


if __name__ == "__main__":
    main()
