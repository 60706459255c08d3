"""New input sizes taking over a schedule solved for others (``transfer_schedules``): a model
called with lengths that change from batch to batch runs without a solve per length, within
its budget, with eager PyTorch's outputs and gradients."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from hiremate import HRockmate, build_graph, solving
from hiremate.ir.budget import autodiff_peak
from hiremate.config import load_config
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.graph import same_structure
from hiremate.ir.simulator import simulate, step_peak
from hiremate.solving import solve_graph
from hiremate.testing.synthetic import graph_from_dag, random_dag
from test_model_untouched import CONV, ConvNet
from test_model_untouched import one_thread  # noqa: F401 (an autouse fixture)
from test_new_inputs import compare_with_eager


class Tokens(nn.Module):
    """Embeddings, a causal self-attention block with dropout, and a head: the shapes of its
    activations follow the sequence length, some as its square."""

    def __init__(self, vocab: int = 50, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.attn = nn.MultiheadAttention(width, 2, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        n = ids.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=ids.device), 1)
        x = x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        return self.head(x + self.mlp(x))


#: Rockmate's chain of blocks, TW-Remat's menus and rk-Rotor (no MILP, so no clock decides:
#: the same schedules on a loaded machine, as the counts of solves below need)
SOLVE = {**CONV, "bottom": ["twremat"], "cost_model": "flops", "calibrate": 0}


@pytest.fixture
def solves(monkeypatch):
    """How many times the API solved a graph."""
    calls = []
    real = solving.solve_graph

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(solving, "solve_graph", counting)
    return calls


def ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 50, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_captures_of_other_lengths_have_one_structure():
    torch.manual_seed(0)
    model = Tokens().double()
    a, b = (build_graph(model, ids(2, n, 0), cost_model="flops") for n in (12, 9))
    assert same_structure(a, b) and same_structure(b, a)
    assert [d.shape for d in a.data] != [d.shape for d in b.data]
    other = build_graph(ConvNet(depth=2).double(), torch.randn(2, 3, 8, 8, dtype=torch.float64),
                        cost_model="flops")
    assert not same_structure(a, other)


def test_shorter_sequences_take_the_samples_schedule_without_a_solve(solves):
    torch.manual_seed(0)
    model = Tokens().double()
    eager = copy.deepcopy(model)
    h = HRockmate(model, ids(4, 16, 0), 0.7, **SOLVE)
    assert len(solves) == 1
    for seed, length in enumerate((15, 14, 15)):
        compare_with_eager(h, model, eager, ids(4, length, seed), seed)
    assert h.recaptures == 2 and len(solves) == 1  # captured for each length, solved for none
    for variant in h.variants():
        report = variant["report"]
        assert report["solver"].startswith("transferred:")
        assert report["transferred_from"] == [[4, 16]]
        # a fraction gives shorter inputs the sample's bytes, and the step fits them
        assert report["budget"] == h.report()["budget"]
        assert report["predicted_peak"] <= report["budget"]
        assert report["relative_time"] <= h.report()["relative_time"] * 1.03
        assert report["relative_time_bound"] <= report["relative_time"]


def test_a_longer_batch_solves_when_the_schedule_does_not_fit(solves):
    torch.manual_seed(0)
    model = ConvNet().double()
    eager = copy.deepcopy(model)
    x4 = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    budget = int(0.9 * autodiff_peak(build_graph(model, x4, cost_model="flops")))
    h = HRockmate(model, x4, budget, **SOLVE)
    # bytes stay bytes: the sample's schedule on a batch of 5 needs more than them
    compare_with_eager(h, model, eager, torch.randn(5, 3, 8, 8, dtype=torch.float64), 1)
    (variant,) = h.variants()
    assert len(solves) == 2 and "transferred_from" not in variant["report"]
    assert variant["report"]["predicted_peak"] <= budget


def test_inputs_that_fit_without_recomputation_run_autodiffs_schedule(solves):
    torch.manual_seed(0)
    model = ConvNet().double()
    eager = copy.deepcopy(model)
    h = HRockmate(model, torch.randn(8, 3, 8, 8, dtype=torch.float64), 0.5, **SOLVE)
    compare_with_eager(h, model, eager, torch.randn(2, 3, 8, 8, dtype=torch.float64), 1)
    (variant,) = h.variants()
    assert len(solves) == 1 and variant["report"]["solver"] == "autodiff"
    assert variant["report"]["relative_time"] == 1.0


def test_transfer_off_solves_every_new_length(solves):
    torch.manual_seed(0)
    model = Tokens().double()
    h = HRockmate(model, ids(4, 16, 0), 0.7, transfer_schedules=False, **SOLVE)
    h(ids(4, 13, 1)).sum().backward()
    (variant,) = h.variants()
    assert len(solves) == 2 and "transferred_from" not in variant["report"]
    assert variant["report"]["budget"] == h.report()["budget"]  # the sample's bytes, at least


#: the flat solvers on the whole graph, for random DAGs
FLAT = load_config("hiremate", progress=False, cache=False, n_jobs=1, flat=["twremat", "fastsa"],
                   bottom=[], top=[], hierarchical_above=1e9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(2, 14), scale=st.sampled_from([0.5, 1.5, 3.0]),
       fraction=st.floats(0.5, 0.95))
def test_schedules_move_between_graphs_of_one_structure(seed, n, scale, fraction):
    """On random DAGs with their sizes scaled: one structure; a schedule of one is valid on the
    other; what the transfer returns fits the whole step's budget and is never slower than
    the schedule it took over."""
    ops = random_dag(random.Random(seed), n)
    first = graph_from_dag(ops, [100])
    other = graph_from_dag([dataclasses.replace(op, size=max(1, int(op.size * scale)))
                            for op in ops], [max(1, int(100 * scale))])
    assert same_structure(first, other)
    try:
        solved = solve_graph(first, fraction, FLAT)
    except InfeasibleBudgetError as exc:  # below what the solvers meet: at that budget
        solved = solve_graph(first, exc.min_budget, FLAT)
    assert simulate(other, solved.schedule).valid
    budget = step_peak(other, solved.schedule, 0)
    sources = [(first, solved.schedule, solved.report)]
    moved = solving.transfer_schedule(other, budget, 0, sources, load_config(FLAT))
    assert moved is not None and moved.sim.valid
    assert step_peak(other, moved.schedule, 0) <= budget
    assert moved.sim.time <= simulate(other, solved.schedule).time
    changed = graph_from_dag([dataclasses.replace(ops[0], inputs=[-1], saves_inputs=not
                                                  ops[0].saves_inputs), *ops[1:]], [100])
    same_nodes = changed.to_dict()["nodes"] == first.to_dict()["nodes"]
    assert same_structure(first, changed) == same_nodes
