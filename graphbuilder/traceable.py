"""Ops whose output sizes follow from a few input values, run in forms the capture can trace.

Why: the capture traces on fake tensors, and a fake tensor refuses every op tagged
``dynamic_output_shape``, or gives its output a size no schedule can plan for, since torch
cannot know the sizes without the values. Two such ops are common in training code whose sizes
in fact depend on one number each, computed from inputs that need no gradient:

- the CTC loss (``F.ctc_loss``, ``nn.CTCLoss``, Wav2Vec2's loss with labels): ``aten._ctc_loss``
  makes a ``(batch,)`` loss and a ``(batch, time, 2 * L + 1)`` table of forward variables,
  where ``L`` is the largest of ``target_lengths`` (:func:`ctc_loss_traced`);
- ``masked_select`` with a mask made from the inputs (Hugging Face's CTC loss flattens its
  padded labels with ``labels.masked_select(labels >= 0)``): its size is the number of
  selected elements (:func:`masked_select_traced`).

Each runs in a form of its own, chosen by :class:`hiremate.graphbuilder.guards.BranchRecorder`:
only that number is asked for, as a branch on an input's value is (computed from the sample and
guarded: a later call where it differs is captured again; one where the values differ
otherwise runs on the same program). Lengths given as lists are constants of the program, as
they are of the user's. The fake kernels that give the CTC ops their sizes are registered on a
library fragment of this module's own, removed when the capture ends: the user's process is
left as it was, and a fake kernel the user registered for the same op is kept.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx

from hiremate.errors import GraphCaptureError
from hiremate.graphbuilder.packed import PACKED_FORMS, selected_positions

log = logging.getLogger(__name__)

#: ``L`` of the ``aten._ctc_loss.Tensor`` call being traced (set by :func:`ctc_loss_traced`)
_LONGEST_TARGET: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "hiremate_longest_ctc_target", default=None)


def _ctc_outputs(log_probs: torch.Tensor, longest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_probs`` is ``(time, batch, classes)`` here: ``ctc_loss`` adds the batch dimension
    of an unbatched call before it calls ``_ctc_loss``."""
    time, batch = log_probs.shape[0], log_probs.shape[1]
    return (log_probs.new_empty((batch,)),
            log_probs.new_empty((batch, time, 2 * longest + 1)))


def _ctc_loss_fake(log_probs: torch.Tensor, targets: torch.Tensor,
                   input_lengths: Sequence[int], target_lengths: Sequence[int],
                   blank: int = 0, zero_infinity: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    return _ctc_outputs(log_probs, max((int(n) for n in target_lengths), default=0))


def _ctc_loss_tensor_fake(log_probs: torch.Tensor, targets: torch.Tensor,
                          input_lengths: torch.Tensor, target_lengths: torch.Tensor,
                          blank: int = 0, zero_infinity: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    longest = _LONGEST_TARGET.get()
    if longest is None:
        raise torch._subclasses.fake_tensor.DynamicOutputShapeException(
            torch.ops.aten._ctc_loss.Tensor)
    return _ctc_outputs(log_probs, longest)


def _ctc_loss_backward_fake(grad: torch.Tensor, log_probs: torch.Tensor, *rest: Any,
                            **kwargs: Any) -> torch.Tensor:
    """Both overloads: the gradient of ``log_probs`` (the list overload has a kernel of its
    own in torch; the tensor one has none)."""
    return torch.empty_like(log_probs)


#: op name -> its fake kernel
KERNELS = {"aten::_ctc_loss": _ctc_loss_fake, "aten::_ctc_loss.Tensor": _ctc_loss_tensor_fake,
           "aten::_ctc_loss_backward.Tensor": _ctc_loss_backward_fake}


@contextlib.contextmanager
def fixed_shape_kernels() -> Iterator[None]:
    """Within it, the ops of :data:`KERNELS` trace on fake tensors."""
    lib = torch.library.Library("aten", "FRAGMENT")
    try:
        for name, kernel in KERNELS.items():
            try:
                torch.library.register_fake(name, kernel, lib=lib)
            except RuntimeError as exc:  # one registered already (by the user): theirs serves
                log.debug("kept the fake kernel already registered for %s (%s)", name, exc)
        yield
    finally:
        lib._destroy()


class ReplayInterpreter(torch.fx.Interpreter):
    """Runs a graph traced with these kernels again (the functionalisation pass retraces it):
    each ``aten._ctc_loss.Tensor`` gets its longest target back from the sizes it was traced
    with, which the tensors it is replayed on do not hold."""

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function" or n.target is not torch.ops.aten._ctc_loss.Tensor:
            return super().run_node(n)
        token = _LONGEST_TARGET.set((int(n.meta["val"][1].shape[-1]) - 1) // 2)
        try:
            return super().run_node(n)
        finally:
            _LONGEST_TARGET.reset(token)


_CTC_PARAMETERS = ("log_probs", "targets", "input_lengths", "target_lengths", "blank",
                   "reduction", "zero_infinity")


def ctc_loss_traced(value_of: Callable[[torch.Tensor], Any], *args: Any, **kwargs: Any
                    ) -> torch.Tensor:
    """``F.ctc_loss`` or ``torch.ctc_loss`` as the capture can trace it (see the module doc):
    ``value_of`` gives a traced tensor's value, guarded. The loss per sequence comes from
    ATen's op, its reduction from here. Why the reduction here: ATen's ``mean`` builds a tensor
    from the target lengths' values inside C++, which a fake tensor cannot hold; the arithmetic
    is ATen's (each loss over its target length, at least 1, then the mean)."""
    bound = dict(zip(_CTC_PARAMETERS, args)) | kwargs
    log_probs, targets = bound["log_probs"], bound["targets"]
    inputs, lengths = bound["input_lengths"], bound["target_lengths"]
    blank, zero_infinity = int(bound.get("blank", 0)), bool(bound.get("zero_infinity", False))
    reduction = bound.get("reduction", "mean")
    if isinstance(reduction, str):  # a name torch does not know: torch's own error
        reduction = torch.nn._reduction.get_enum(reduction)
    if reduction not in (0, 1, 2):  # likewise, from the op itself
        return torch.ctc_loss(log_probs, targets, inputs, lengths, blank, reduction,
                              zero_infinity)
    if isinstance(lengths, torch.Tensor):
        longest = int(value_of(lengths.max())) if lengths.numel() else 0
        token = _LONGEST_TARGET.set(longest)
        try:
            per_sequence = torch.ctc_loss(log_probs, targets, inputs, lengths, blank, 0,
                                          zero_infinity)
        finally:
            _LONGEST_TARGET.reset(token)
        divisors = lengths.to(per_sequence.dtype)
    else:
        per_sequence = torch.ctc_loss(log_probs, targets, inputs, lengths, blank, 0,
                                      zero_infinity)
        divisors = torch.tensor(list(lengths), dtype=per_sequence.dtype)
    if reduction == 2:
        return per_sequence.sum()
    if reduction == 1:
        return (per_sequence / divisors.to(per_sequence.device).clamp_min(1)).mean()
    return per_sequence


def masked_select_traced(value_of: Callable[[torch.Tensor], Any], input: torch.Tensor,
                         mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """``input.masked_select(mask)`` with a size the tracer knows: the elements where the
    (broadcast) mask holds, in their order, gathered at
    :func:`~hiremate.graphbuilder.packed.selected_positions`, as many as the mask selects (the
    guarded number). Where the mask depends on
    anything but inputs that need no gradient (an activation, a random draw), that number
    cannot be guarded: the op runs as it is, and the capture refuses its value-dependent size
    (:func:`~hiremate.graphbuilder.guards.check_static_sizes`)."""
    if kwargs:  # out=: a tensor the caller made, of a size it chose
        return torch.masked_select(input, mask, **kwargs)
    values, where = torch.broadcast_tensors(input, mask)
    where = where.reshape(-1)
    try:
        count = int(value_of(where.sum()))
    except GraphCaptureError:
        return torch.masked_select(input, mask)
    return values.reshape(-1).index_select(0, selected_positions(where, count))


#: the functions the capture runs in a form it can trace (these and the packed-sequence ones of
#: :mod:`hiremate.graphbuilder.packed`), each called with a function that gives a traced
#: tensor's value (guarded) before the call's own arguments
TRACEABLE_FORMS = {torch.nn.functional.ctc_loss: ctc_loss_traced,
                   torch.ctc_loss: ctc_loss_traced,
                   torch.masked_select: masked_select_traced,
                   torch.Tensor.masked_select: masked_select_traced,
                   **PACKED_FORMS}
