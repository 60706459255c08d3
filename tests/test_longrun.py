"""Long runs: training the zoo's GPT-2 with Adam through HRockmate for many iterations gives the
same parameters as eager training in float64, and the measured peak of the last iteration equals
that of the second (nothing accumulates across iterations: saved tensors, RNG states, buffers).

CI runs 5 iterations; ``pytest -m slow`` runs 100 (HIREMATE_LONGRUN_ITERS overrides both).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

import hiremate
from hiremate import zoo
from hiremate.api import HRockmate

#: TW-Remat menus only: the run, not the solver, is under test here (and H-ILP needs seconds).
#: Calibration stays on: the loss and the output's gradient live outside the scheduled graph
#: (about 100 KB here), so a schedule whose peak sits at the forward/backward boundary measures
#: that much above its prediction until calibration lowers the budget it solves for.
FAST = {"progress": False, "n_jobs": 1, "cache": False, "calibrate": 2,
        "flat": ["twremat"], "bottom": ["twremat"]}


def train(iterations: int) -> None:
    torch.manual_seed(0)
    model, sample = zoo.get("gpt2", layers=2, width=32, dtype=torch.float64)
    eager = copy.deepcopy(model)
    # the loss trained with keeps two tensors the size of the logits: 0.5 is out of reach
    remat = HRockmate(model, sample, 0.7, loss_fn=zoo.output_loss, capture_loss=False, **FAST)
    assert remat.report()["predicted_peak"] <= remat.report()["budget"]
    args, kwargs = zoo.split_sample(sample)
    opt_remat = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt_eager = torch.optim.Adam(eager.parameters(), lr=1e-3)
    peaks: dict[int, int] = {}
    for it in range(1, iterations + 1):
        for net, fn, opt in ((eager, eager, opt_eager), (model, remat, opt_remat)):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(it)  # same dropout masks, if any
            zoo.output_loss(fn(*args, **kwargs)).backward()
            opt.step()
        if it in (2, iterations):
            opt_remat.zero_grad(set_to_none=True)
            peaks[it] = hiremate.measure(remat, *args, repeats=1, warmup=0, **kwargs).peak
            opt_remat.zero_grad(set_to_none=True)
    mine = dict(model.named_parameters())
    for name, p in eager.named_parameters():
        torch.testing.assert_close(mine[name], p, rtol=1e-12, atol=1e-12, msg=name)
    assert any(not torch.equal(p, q) for p, q in zip(eager.parameters(),
                                                     zoo.get("gpt2", layers=2, width=32,
                                                             dtype=torch.float64)[0].parameters()))
    assert peaks[iterations] == peaks[2], peaks
    assert peaks[2] <= remat.report()["budget"] * 1.05


def test_gpt2_adam_short_run():
    train(int(os.environ.get("HIREMATE_LONGRUN_ITERS", "5")))


@pytest.mark.slow
def test_gpt2_adam_100_iterations():
    train(int(os.environ.get("HIREMATE_LONGRUN_ITERS", "100")))
