"""Packed sequences (``pack_padded_sequence`` into an LSTM, GRU or RNN, ``pad_packed_sequence``
out of it) in forms the capture can trace.

Why: a packed sequence holds its time steps' batch sizes as a tensor whose *values* decide every
size: ``aten._pack_padded_sequence`` makes ``sum(lengths)`` rows, the packed RNN ops read the
batch sizes inside C++ at each step, and ``nn.LSTM`` itself reads ``batch_sizes[0]`` as a size.
On fake tensors none of that can run. The lengths come from the inputs (a tensor that needs no
gradient, or a list), so the capture asks for their values (guarded, as a branch on an input's
value is: a batch with other lengths is captured again) and runs each op on constant sizes:

- packing gathers the rows of the (sorted) padded batch at constant positions, and its batch
  sizes are a real tensor marked as this module's, whose reads the recorder answers with their
  values (:func:`read_batch_sizes`);
- the packed RNN runs step by step, each step on the rows still running, with torch's cell
  arithmetic (LSTM, GRU, tanh and ReLU RNNs; layers, both directions, projections, dropout
  between layers); each sequence's last hidden state is kept at the step where it ends;
- unpacking scatters the rows back into a padded batch at constant positions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from hiremate.errors import GraphCaptureError

_MARK = "_hiremate_batch_sizes"


def _batch_sizes(lengths: list[int]) -> list[int]:
    return [sum(1 for n in lengths if n > t) for t in range(max(lengths, default=0))]


def _constant(values: list[int]) -> torch.Tensor:
    """The batch sizes as a real CPU tensor, made outside the tracing modes and marked."""
    with _disable_current_modes():
        tensor = torch.tensor(values, dtype=torch.int64)
    setattr(tensor, _MARK, tuple(values))
    return tensor


def _values(batch_sizes: Any) -> list[int]:
    values = getattr(batch_sizes, _MARK, None)
    if values is None:
        raise GraphCaptureError(
            "a packed sequence reached an RNN with batch sizes the capture did not make (a "
            "PackedSequence built by hand, or packed outside the wrapped model): pack it with "
            "torch.nn.utils.rnn.pack_padded_sequence inside the model")
    return list(values)


def read_batch_sizes(func: Any, args: tuple) -> tuple[bool, Any]:
    """``(True, value)`` when ``func`` reads a marked batch-sizes tensor (``batch_sizes[0]``,
    ``batch_sizes.size(0)``): the read, on the real tensor, outside the tracing modes; else
    ``(False, None)``."""
    if not args or not isinstance(args[0], torch.Tensor) or not hasattr(args[0], _MARK):
        return False, None
    with _disable_current_modes():
        value = func(*args)
    # one batch size as a number, as the RNN modules use it (a size): a real 0-dim tensor
    # would enter the trace as a constant of its own
    return True, int(value) if isinstance(value, torch.Tensor) and value.dim() == 0 else value


def selected_positions(running: torch.Tensor, count: int) -> torch.Tensor:
    """The flat positions of the ``count`` cells where ``running`` holds, in order (for a
    ``(time, batch)`` mask, ``t * batch + b`` in time order): where a stable sort puts them
    first, so no constant index enters the program, whatever the number of cells."""
    return torch.argsort(torch.logical_not(running).reshape(-1).to(torch.uint8),
                         stable=True)[:count]


def pack_padded_traced(value_of: Callable[[torch.Tensor], Any], input: torch.Tensor,
                       lengths: Any, batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._pack_padded_sequence``: the rows of each time step that is still running, in
    time order; the lengths' values guarded."""
    traced = isinstance(lengths, torch.Tensor)
    values = [int(n) for n in (value_of(lengths) if traced else lengths)]
    if any(a < b for a, b in zip(values, values[1:])) or (values and values[-1] <= 0):
        raise GraphCaptureError(
            f"pack_padded_sequence: lengths {values} must be positive and sorted in decreasing "
            "order, or passed with enforce_sorted=False")
    sizes = _batch_sizes(values)
    steps = (input.transpose(0, 1) if batch_first else input)[:len(sizes)]
    # a constant is made in the shape it is read in: the graph builder records a constant by
    # value in the op that reads it, and a view of one has no op of its own to hold it
    ends = lengths.to(input.device)[None, :] if traced else torch.tensor(
        [values], device=input.device)
    running = torch.arange(len(sizes), device=input.device)[:, None] < ends
    flat = steps.reshape(len(sizes) * steps.shape[1], *steps.shape[2:])
    return flat.index_select(0, selected_positions(running, sum(sizes))), _constant(sizes)


def pad_packed_traced(value_of: Callable[[torch.Tensor], Any], data: torch.Tensor,
                      batch_sizes: torch.Tensor, batch_first: bool, padding_value: float,
                      total_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._pad_packed_sequence``: the rows back at their time step and batch position,
    ``padding_value`` elsewhere; the lengths as a constant."""
    sizes = _values(batch_sizes)
    batch = sizes[0] if sizes else 0
    steps = max(int(total_length), len(sizes))
    per_step = torch.tensor([[size] for size in sizes + [0] * (steps - len(sizes))],
                            device=data.device)
    running = torch.arange(batch, device=data.device)[None, :] < per_step
    out = data.new_full((steps * batch, *data.shape[1:]), padding_value)
    out = out.index_copy(0, selected_positions(running, sum(sizes)), data)
    out = out.reshape(steps, batch, *data.shape[1:])
    lengths = [sum(1 for size in sizes if size > b) for b in range(batch)]
    with _disable_current_modes():
        lengths_tensor = torch.tensor(lengths, dtype=torch.int64)
    return (out.transpose(0, 1) if batch_first else out), lengths_tensor


#: a cell's weights: input, hidden, their biases (None without), the LSTM projection (or None)
Weights = list[Any]
State = tuple[torch.Tensor, ...]


def _lstm_cell(x: torch.Tensor, state: State, w: Weights) -> State:
    h, c = state
    gates = F.linear(x, w[0], w[2]) + F.linear(h, w[1], w[3])
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return (h if w[4] is None else F.linear(h, w[4])), c


def _gru_cell(x: torch.Tensor, state: State, w: Weights) -> State:
    (h,) = state
    gi, gh = F.linear(x, w[0], w[2]).chunk(3, 1), F.linear(h, w[1], w[3]).chunk(3, 1)
    reset = torch.sigmoid(gi[0] + gh[0])
    update = torch.sigmoid(gi[1] + gh[1])
    new = torch.tanh(gi[2] + reset * gh[2])
    return ((h - new) * update + new,)


def _simple_cell(activation: Callable[[torch.Tensor], torch.Tensor]
                 ) -> Callable[[torch.Tensor, State, Weights], State]:
    def cell(x: torch.Tensor, state: State, w: Weights) -> State:
        return (activation(F.linear(x, w[0], w[2]) + F.linear(state[0], w[1], w[3])),)
    return cell


def _direction(data: torch.Tensor, sizes: list[int], state: list[torch.Tensor], w: Weights,
               cell: Callable[[torch.Tensor, State, Weights], State], reverse: bool
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One direction of one layer over packed ``data``: its output rows and final state."""
    starts = [sum(sizes[:t]) for t in range(len(sizes))]
    order = range(len(sizes) - 1, -1, -1) if reverse else range(len(sizes))
    outputs: list[Any] = [None] * len(sizes)
    final: list[list[torch.Tensor]] = [[] for _ in state]
    running = sizes[-1] if reverse else sizes[0]
    current = [s[:running] for s in state]
    for t in order:
        size = sizes[t]
        if reverse and size > running:  # sequences starting here take their initial state
            current = [torch.cat([c, s[running:size]]) for c, s in zip(current, state)]
        elif not reverse and size < running:  # sequences ending before here are done
            for done, c in zip(final, current):
                done.insert(0, c[size:])
            current = [c[:size] for c in current]
        running = size
        current = list(cell(data[starts[t]:starts[t] + size], tuple(current), w))
        outputs[t] = current[0]
    ends = current if reverse else [torch.cat([c, *done]) for c, done in zip(current, final)]
    return torch.cat(outputs), ends


def packed_rnn_traced(kind: str) -> Callable[..., Any]:
    """``torch.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` in their packed form (the batch
    sizes second), step by step; the unpacked form runs as it is."""
    cell = {"lstm": _lstm_cell, "gru": _gru_cell, "rnn_tanh": _simple_cell(torch.tanh),
            "rnn_relu": _simple_cell(torch.relu)}[kind]

    def run(value_of: Callable[[torch.Tensor], Any], *args: Any) -> Any:
        packed = len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].dim() == 1 \
            and not args[1].is_floating_point()  # the batch sizes, where the unpacked has hx
        if not packed:  # the op as it is
            return getattr(torch, kind)(*args)
        data, batch_sizes, hx, params, biases, layers, dropout, train, bidirectional = args
        sizes = _values(batch_sizes)
        states = list(hx) if kind == "lstm" else [hx]
        directions = 2 if bidirectional else 1
        per = len(params) // (layers * directions)
        finals: list[list[torch.Tensor]] = [[] for _ in states]
        layer_input = data
        for layer in range(layers):
            outs = []
            for d in range(directions):
                k = layer * directions + d
                p = list(params[k * per:(k + 1) * per])
                w = [p[0], p[1], p[2] if biases else None, p[3] if biases else None,
                     p[-1] if kind == "lstm" and per in (3, 5) else None]
                out, ends = _direction(layer_input, sizes, [s[k] for s in states], w, cell,
                                       reverse=d == 1)
                outs.append(out)
                for f, e in zip(finals, ends):
                    f.append(e)
            layer_input = outs[0] if directions == 1 else torch.cat(outs, 1)
            if dropout and train and layer < layers - 1:
                layer_input = F.dropout(layer_input, dropout, training=True)
        ends = [torch.stack(f) for f in finals]
        return (layer_input, *ends)

    return run


#: the packed-sequence functions the capture runs in a traced form
PACKED_FORMS = {torch._pack_padded_sequence: pack_padded_traced,
                torch._pad_packed_sequence: pad_packed_traced,
                torch.lstm: packed_rnn_traced("lstm"), torch.gru: packed_rnn_traced("gru"),
                torch.rnn_tanh: packed_rnn_traced("rnn_tanh"),
                torch.rnn_relu: packed_rnn_traced("rnn_relu")}
