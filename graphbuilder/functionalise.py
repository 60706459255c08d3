"""Functionalise a traced joint graph: in-place writes become out-of-place ops.

Models write in place all the time (``x += shortcut``, ``ReLU(inplace=True)``, the ``add_`` and
``sigmoid_`` inside aten's LSTM cells, the ``copy_`` of T5 and Whisper). A CD-graph cannot hold
such a write: recomputing the value it overwrote, or the write itself, would read or produce the
wrong version. The traced joint graph is already a correct program (autograd ran on the real
in-place program while tracing, with its version counters), so rewriting that program without
mutations keeps every value and gradient: torch's functionalisation re-traces it, replacing each
in-place op by its out-of-place form and each write through a view by a ``*_scatter`` into the
base, and keeps the views (the grouping joins them to the node owning their storage).

What functionalisation cannot remove are writes into the graph's inputs: it emits them as
``copy_(input, new_value)`` at the very end, after the backward. A write into a buffer (a
BatchNorm's ``num_batches_tracked += 1``) is a forward effect that the executor replays once per
call, so it is moved back into the forward, right after the last op that needs it in place.
A write into a parameter (``nn.Embedding``'s ``max_norm``) or into a model input that needs no
gradient (``x /= 255``) is moved the same way: eager writes into the tensor at every call, and
so does the executor. A write into an input that needs a gradient stays what it was: the
grouping rejects it with a message naming the op (eager refuses it too).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from hiremate.errors import GraphCaptureError
from hiremate.graphbuilder.opinfo import op_kind
from hiremate.graphbuilder.traceable import ReplayInterpreter

log = logging.getLogger(__name__)

#: key in ``node.meta["custom"]`` naming the op of the traced graph a re-traced op comes from
#: (``custom`` is one of the fields that fx copies onto the nodes a re-trace creates)
_SOURCE = "hiremate_source"
#: key in ``node.meta`` naming the writer that a clone made by :func:`clone_hidden_writes` is
#: for; the grouping puts a writer and its clones in one node
WRITE_COPY = "hiremate_write_copy"


def needs_functionalising(gm: torch.fx.GraphModule) -> bool:
    """Whether any op of ``gm`` writes into one of its arguments (by its schema)."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
            if target._schema.is_mutable:
                return True
    return False


def functionalise(gm: torch.fx.GraphModule, last_forward: str,
                  buffer_placeholders: set[str]) -> tuple[torch.fx.GraphModule, str]:
    """The same program without in-place writes, and the name of its last forward op.

    ``buffer_placeholders`` are the placeholder names of ``gm`` that hold parameters, buffers or
    inputs that need no gradient: writes into them move into the forward. Returns ``gm``
    unchanged when nothing writes in place.
    """
    if not needs_functionalising(gm):
        clone_hidden_writes(gm)
        return gm, last_forward
    _fills_in_memory_order(gm)
    forward_names: set[str] = set()
    in_forward = True
    for node in gm.graph.nodes:
        custom = dict(node.meta.get("custom") or {})
        custom[_SOURCE] = node.name
        node.meta["custom"] = custom
        if in_forward and node.op != "placeholder":
            forward_names.add(node.name)
        in_forward = in_forward and node.name != last_forward
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [n.meta["val"] for n in placeholders]
    interpreter = ReplayInterpreter(gm)

    def run(*flat: torch.Tensor):
        return interpreter.run(*flat, enable_io_processing=False)

    with torch.fx.traceback.preserve_node_meta():
        new = make_fx(torch.func.functionalize(run, remove="mutations"), tracing_mode="fake",
                      _allow_non_fake_inputs=True)(*values)
    _restore_pairing(gm, new)
    new_placeholders = [n for n in new.graph.nodes if n.op == "placeholder"]
    buffers = {new_placeholders[i].name for i, ph in enumerate(placeholders)
               if ph.name in buffer_placeholders}
    forward = [n for n in new.graph.nodes
               if (n.meta.get("custom") or {}).get(_SOURCE) in forward_names]
    if not forward:
        raise GraphCaptureError("functionalising the traced graph lost its forward ops; "
                                "please report this model")
    new_last = _move_buffer_writes(new, forward[-1], buffers)
    clone_hidden_writes(new)
    new.graph.lint()
    new.recompile()
    n_before = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    n_after = sum(1 for n in new.graph.nodes if n.op == "call_function")
    log.info("functionalised the traced graph: %d ops -> %d ops", n_before, n_after)
    return new, new_last.name


def clone_hidden_writes(gm: torch.fx.GraphModule) -> None:
    """Give each write that functionalisation leaves into a value of the program a clone of its
    own to write into, which the value's later readers read instead.

    Why: ``native_batch_norm`` writes its running statistics in place without its schema
    saying so, so functionalisation keeps the write. BatchNorm passes the buffers, a write the
    executor replays once per call; ``instance_norm`` passes repeats of them, values that
    another node of the graph makes, and a node that overwrites another's value cannot be
    recomputed (a rerun would read the overwritten version). With the clone in the writer's
    node, the value read before the write and the one read after are two values."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    changed = False
    for writer in list(gm.graph.nodes):
        if writer.op != "call_function" or not isinstance(writer.target, torch._ops.OpOverload):
            continue
        for index in op_kind(writer.target).writes:
            value = writer.args[index] if index < len(writer.args) else None
            if not isinstance(value, torch.fx.Node) or _storage_root(value).op != "call_function":
                continue  # a buffer (or a view of one): a write the executor replays per call
            copy = _inserted(gm, writer, torch.ops.aten.clone.default, (value,),
                             val=value.meta["val"].clone())
            copy.meta[WRITE_COPY] = writer.name
            for reader in list(value.users):
                later = reader is not copy and order.get(reader, -1) > order[writer]
                if reader is writer or later:
                    reader.replace_input_with(value, copy)
            changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _inserted(gm: torch.fx.GraphModule, before: torch.fx.Node, target: Any, args: tuple,
              kwargs: dict | None = None, val: Any = None) -> torch.fx.Node:
    """A new op of ``gm`` just before ``before``, carrying ``before``'s metadata (its sequence
    number pairs it with the same backward; its stack names the same line) and ``val``."""
    with gm.graph.inserting_before(before):
        node = gm.graph.call_function(target, args, kwargs or {})
    node.meta = {k: v for k, v in before.meta.items() if k != "val"}
    if val is not None:
        node.meta["val"] = val
    return node


def _storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node that holds ``node``'s storage: ``node`` up its chain of views."""
    while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        base = op_kind(node.target).view_of
        if base is None or base >= len(node.args) or not isinstance(node.args[base],
                                                                      torch.fx.Node):
            break
        node = node.args[base]
    return node


def copy_before_views(gm: torch.fx.GraphModule, names: list[str]) -> None:
    """Make each ``view`` op of ``gm`` named in ``names`` copy first, as eager's ``reshape``
    does for an input it cannot view: ``clone`` to contiguous, then ``_unsafe_view`` (the pair
    that a trace records for such a reshape). Why: the trace took those views on fake tensors
    laid out otherwise than the real kernels lay them out
    (:class:`~hiremate.graphbuilder.costs.memory.ViewsNeedCopies`)."""
    wanted = set(names)
    for view in list(gm.graph.nodes):
        if view.name not in wanted:
            continue
        source, shape = view.args[0], view.args[1]
        dense = torch.contiguous_format
        copy = _inserted(gm, view, torch.ops.aten.clone.default, (source,),
                         {"memory_format": dense},
                         val=source.meta["val"].clone(memory_format=dense))
        flat = _inserted(gm, view, torch.ops.aten._unsafe_view.default, (copy, shape),
                         val=view.meta["val"])
        view.replace_all_uses_with(flat)
        gm.graph.erase_node(view)
    gm.graph.lint()
    gm.recompile()
    log.info("capture: %d views copy first, as eager's reshape does for their inputs: %s",
             len(wanted), ", ".join(sorted(wanted)))


def _fills_in_memory_order(gm: torch.fx.GraphModule) -> None:
    """Put every in-place random fill of a permuted tensor onto the tensor's view whose
    dimensions are in memory order.

    Why: an in-place fill (``bernoulli_`` in dropout, ``uniform_``, ``normal_``) draws its
    numbers in the memory order of the tensor it fills, while its out-of-place form, which
    functionalisation substitutes, draws them into a fresh contiguous tensor. On a transposed
    tensor (dropout after a batch-first attention's transpose) the same numbers would land on
    other elements, and the wrapper's dropout masks would differ from eager's. On the view in
    memory order (contiguous) both forms put each number on the same element."""
    for node in list(gm.graph.nodes):
        target = node.target
        if (node.op != "call_function" or not isinstance(target, torch._ops.OpOverload)
                or not target._schema.is_mutable
                or torch.Tag.nondeterministic_seeded not in target.tags):
            continue
        filled = node.args[0] if node.args else None
        value = filled.meta.get("val") if isinstance(filled, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.is_contiguous():
            continue
        order = sorted(range(value.dim()), key=lambda d: -value.stride(d))  # stable for ties
        if not _dense(value.shape, value.stride(), order):
            continue  # overlapping or with gaps: no order of its dimensions is one block
        view = _inserted(gm, node, torch.ops.aten.permute.default, (filled, order))
        node.replace_all_uses_with(filled)  # an in-place op returns the tensor it filled
        node.args = (view, *node.args[1:])
        log.debug("random fill %s moved onto its memory-order view", node.name)


def _dense(shape, stride, order: list[int]) -> bool:
    """Whether the dimensions in ``order`` are a row-major layout of one block of memory."""
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != expected:
            return False
        expected *= shape[d]
    return True


#: meta fields that pair backward ops with forward ops; a re-trace runs no autograd and stamps
#: its own (meaningless) sequence numbers, so they are copied back from the source op
_PAIRING = ("seq_nr", "partitioner_tag")


def _restore_pairing(old: torch.fx.GraphModule, new: torch.fx.GraphModule) -> None:
    source = {n.name: n for n in old.graph.nodes}
    for node in new.graph.nodes:
        origin = source.get((node.meta.get("custom") or {}).get(_SOURCE))
        for key in _PAIRING:
            if origin is not None and key in origin.meta:
                node.meta[key] = origin.meta[key]
            else:
                node.meta.pop(key, None)


def _move_buffer_writes(gm: torch.fx.GraphModule, last_forward: torch.fx.Node,
                        buffers: set[str]) -> torch.fx.Node:
    """Move each ``copy_(buffer, value)`` that functionalisation put at the end of the graph to
    just after the later of ``value``'s producer and the buffer's last other reader, which must
    both be forward ops; return the (possibly new) last forward op."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    boundary = order[last_forward]
    writes = [n for n in gm.graph.nodes
              if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
              and isinstance(n.args[0], torch.fx.Node) and n.args[0].name in buffers]
    last = last_forward
    for write in writes:
        buffer, value = write.args[0], write.args[1]
        anchors = [u for u in buffer.users if u is not write]
        if isinstance(value, torch.fx.Node):
            anchors.append(value)
        anchor = max(anchors, key=lambda n: order[n], default=buffer)
        if order[anchor] > boundary:
            raise GraphCaptureError(
                f"the model writes the buffer behind {buffer.name} in place during the backward "
                f"pass ({anchor.name}); hiremate replays buffer writes once per forward: move "
                "that write into the forward (or out of the model)"
            )
        anchor.append(write)
        if anchor is last:
            last = write
    return last
