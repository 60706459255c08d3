"""Packed sequences (:mod:`hiremate.graphbuilder.packed`): ``pack_padded_sequence`` into an LSTM,
GRU or RNN and ``pad_packed_sequence`` out of it are captured, scheduled with recomputation and
trained exactly as eager. Before, every such model failed to capture: the packed ops read their
batch sizes' values, which fake tensors do not hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import hiremate
from test_capture_value_sized import assert_reuses_then_recaptures, assert_trains_as_eager

#: TW-Remat on the whole graph alone (the ``twremat`` preset): these tests check the capture and
#: the executor under recomputation, not how good the schedule is
FAST = {"n_jobs": 1, "cache": False, "progress": False, "calibrate": 0}
BUDGET = 0.8


class Tagger(nn.Module):
    """Frames -> packed RNN -> a label per frame, as a sequence tagger is written."""

    def __init__(self, rnn: str = "lstm", batch_first: bool = True, enforce_sorted: bool = False,
                 **rnn_options):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        make = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[rnn]
        self.rnn = make(16, 12, batch_first=batch_first, **rnn_options)
        width = rnn_options.get("proj_size") or 12
        self.head = nn.Linear(width * (2 if rnn_options.get("bidirectional") else 1), 4)
        self.batch_first, self.enforce_sorted = batch_first, enforce_sorted

    def forward(self, frames, lengths):
        h = self.embed(frames)
        if not self.batch_first:
            h = h.transpose(0, 1)
        packed = pack_padded_sequence(h, lengths, batch_first=self.batch_first,
                                      enforce_sorted=self.enforce_sorted)
        out, last = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=self.batch_first,
                                     total_length=frames.shape[1])
        last = last[0] if isinstance(last, tuple) else last
        return self.head(out).square().sum() + last.sum()


def sample(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(len(lengths), 10, 8, generator=gen, dtype=torch.float64), torch.tensor(
        lengths)


def build(model, args) -> hiremate.HRockmate:
    """At :data:`BUDGET`, or at the lowest budget TW-Remat meets where that is higher (the
    ReLU RNN's graph at these sizes)."""
    try:
        return hiremate.HRockmate(model, args, BUDGET, "twremat", **FAST)
    except hiremate.InfeasibleBudgetError as exc:
        return hiremate.HRockmate(model, args, exc.min_budget, "twremat", **FAST)


@pytest.mark.parametrize("options", [
    {"rnn": "lstm"},
    {"rnn": "gru", "bidirectional": True},
    {"rnn": "rnn", "nonlinearity": "relu"},
    {"rnn": "lstm", "num_layers": 2, "bidirectional": True, "proj_size": 6},
    {"rnn": "gru", "batch_first": False, "enforce_sorted": True},
], ids=["lstm", "gru-bidirectional", "rnn-relu", "lstm-2-layers-bi-proj", "gru-time-first"])
def test_a_packed_rnn_trains_as_eager_with_recomputation(options):
    torch.manual_seed(0)
    model = Tagger(**options).double()
    lengths = [10, 7, 4] if options.get("enforce_sorted") else [4, 10, 7]
    args = sample(lengths)
    wrapped = build(model, args)
    assert wrapped.report()["relative_time"] > 1  # something is recomputed
    assert_trains_as_eager(wrapped, model, args)


def test_other_lengths_are_captured_again_and_a_permutation_is_not():
    """The sorted lengths shape the program: the same lengths in another order run on it,
    other lengths are captured again; each trains as eager."""
    torch.manual_seed(0)
    model = Tagger().double()
    wrapped = build(model, sample([4, 10, 7]))
    assert_reuses_then_recaptures(wrapped, model, sample([10, 7, 4], seed=1),
                                  sample([9, 3, 6], seed=2))


class PacksByHand(nn.Module):
    """Builds its ``PackedSequence`` from tensors it is given, not by packing."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 12)

    def forward(self, data, batch_sizes):
        out, _ = self.rnn(nn.utils.rnn.PackedSequence(data, batch_sizes))
        return out.data.sum()


def test_a_packed_sequence_built_by_hand_is_refused_by_name():
    data, batch_sizes = torch.randn(6, 8, dtype=torch.float64), torch.tensor([3, 2, 1])
    with pytest.raises(hiremate.GraphCaptureError) as info:
        hiremate.build_graph(PacksByHand().double(), (data, batch_sizes), cost_model="flops")
    assert "batch sizes the capture did not make" in info.value.attempts["make_fx"]


def test_unsorted_lengths_with_enforce_sorted_are_refused_as_eager_refuses_them():
    model = Tagger(enforce_sorted=True).double()
    with pytest.raises(RuntimeError):  # eager's own refusal
        model(*sample([4, 10, 7]))
    with pytest.raises(hiremate.GraphCaptureError) as info:
        hiremate.build_graph(model, sample([4, 10, 7]), cost_model="flops")
    assert "sorted in decreasing order" in info.value.attempts["make_fx"]
