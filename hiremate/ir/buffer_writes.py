"""Buffers that a forward reads and writes: the value before the write, kept for later reads.

A forward may update a buffer and use it (a running mean moved towards the batch's, then
subtracted from it), or write into a parameter (``nn.Embedding``'s ``max_norm``) or an input
that needs no gradient (``x /= 255``), both handled here as buffers. The graph reads the
buffer's source as its value at the call's start and the executor writes the buffer in place
during the forward, once per call. A node that reads the source after that write, a
recomputation or a first run that the schedule puts after the writer, must still see the value
from before it: so the executor copies the buffer just before the write, those reads take the
copy, and the copy is freed after the last of them. The simulator counts the copy over the same
steps (:func:`hiremate.ir.simulator.step_peak`); both take the steps from
:func:`snapshot_spans`.

Only reads of the value count: not the write itself (a recomputed write goes into a clone), nor
the running statistics that a batch-norm backward in training mode is passed and ignores.
"""

from __future__ import annotations

from dataclasses import dataclass

from hiremate.ir.graph import ComputeNode, DataKind, Graph, Op, Ref
from hiremate.ir.schedule import Compute, Schedule

#: ops passed a buffer whose value they do not read: argument positions, and the position of
#: the flag that must be true for that (training mode)
_IGNORED_ARGS: dict[str, tuple[tuple[int, ...], int]] = {
    "aten.native_batch_norm_backward.default": ((3, 4), 7),
}


@dataclass(frozen=True)
class WrittenBuffer:
    """A buffer source written by ``writer``'s op number ``write_op``, whose value the nodes
    ``readers`` read when they first run and ``rerun_readers`` when they run again (a rerun
    runs only the ops that its outputs and random draws need: :func:`rerun_ops`); the writer's
    own first run needs the copy only when it reads the value after its write."""

    source: int  # the data id of the buffer's (or input's) source
    name: str
    writer: int
    write_op: int
    readers: frozenset[int]
    rerun_readers: frozenset[int]
    size: int
    reads_after_write: bool = False


def ignored_positions(op: Op) -> set[int]:
    """Argument positions of ``op`` whose value it does not read: those it writes, and the
    running statistics a batch-norm backward in training mode ignores."""
    skip = set(op.mutated_args)
    ignored, flag = _IGNORED_ARGS.get(op.target, ((), -1))
    if ignored and len(op.args) > flag and op.args[flag] is True:
        skip.update(ignored)
    return skip


def value_reads(op: Op, names: set[str]) -> set[str]:
    """Which of ``names`` ``op`` reads the value of (directly or inside a list or keyword)."""
    return names.intersection(op.refs(skip=ignored_positions(op)))


def rerun_ops(node: ComputeNode, needed: set[str]) -> list[int]:
    """Indices of the ops a rerun of ``node`` runs to make the values ``needed``: those and
    what they read inside the node, and every random op (the generator must move as in the
    first run). A write into a buffer is not run again: the first run made it, and a rerun
    would write into a copy that nothing reads."""
    needed = set(needed)
    chosen = []
    for i in range(len(node.ops) - 1, -1, -1):
        op = node.ops[i]
        if op.out in needed or op.random:
            chosen.append(i)
            needed.update(op.refs())
    return chosen[::-1]


def node_output_names(graph: Graph, node: ComputeNode) -> set[str]:
    """Names under which ``node``'s ops bind its output data (owners and views)."""
    made = {op.out for op in node.ops}
    return {n for d in node.outputs for n in (graph.data[d].name, *graph.data[d].aliases)
            if n in made}


def written_buffers(graph: Graph) -> list[WrittenBuffer]:
    """Every buffer source (or parameter, or input that needs no gradient) that a node writes
    and some node reads the value of, and that some schedule needs a copy of."""
    buffers = [d for d in graph.data if d.producer is None
               and d.kind in (DataKind.BUFFER, DataKind.INPUT, DataKind.PARAM)]
    names = {d.name for d in buffers}
    writers: dict[str, tuple[int, int]] = {}
    readers: dict[str, set[int]] = {}
    rerun_readers: dict[str, set[int]] = {}
    after: set[str] = set()  # read by their writer after its write
    for node in graph.nodes:
        reads = [value_reads(op, names) for op in node.ops]
        if not any(reads) and not any(op.mutated_args for op in node.ops):
            continue
        for k, op in enumerate(node.ops):
            for name in reads[k]:
                readers.setdefault(name, set()).add(node.id)
                if writers.get(name, (None,))[0] == node.id:
                    after.add(name)
            for i in op.mutated_args:
                a = op.args[i] if i < len(op.args) else None
                if isinstance(a, Ref) and a.name in names:
                    writers.setdefault(a.name, (node.id, k))
        for k in rerun_ops(node, node_output_names(graph, node)):
            for name in reads[k]:
                rerun_readers.setdefault(name, set()).add(node.id)
    found = [WrittenBuffer(d.id, d.name, *writers[d.name], frozenset(readers[d.name]),
                           frozenset(rerun_readers.get(d.name, ())), d.size, d.name in after)
             for d in buffers if d.name in writers and d.name in readers]
    # read only by its writer's first run, before the write (BatchNorm's batch count): no
    # schedule needs a copy
    return [b for b in found
            if b.readers - {b.writer} or b.rerun_readers or b.reads_after_write]


def snapshot_reserve(graph: Graph) -> int:
    """The most the copies take at once: every written buffer's, which room for the step
    always covers (a schedule that overflows by its copies is solved again below)."""
    return sum(b.size for b in written_buffers(graph))


def snapshot_spans(graph: Graph, schedule: Schedule) -> list[tuple[WrittenBuffer, int, int]]:
    """``(buffer, first step, last step)`` for each buffer whose pre-write value a step at or
    after its writer's first run reads: the copy exists during those steps, both included."""
    written = written_buffers(graph)
    if not written:
        return []
    runs: dict[int, list[int]] = {}  # node -> the steps that compute it
    for i, step in enumerate(schedule):
        if isinstance(step, Compute):
            runs.setdefault(step.node, []).append(i)
    spans = []
    for buf in written:
        if buf.writer not in runs:
            continue
        start = runs[buf.writer][0]
        end = start if buf.reads_after_write else None
        for node in buf.readers | buf.rerun_readers:
            steps = runs.get(node, [])
            later = [i for k, i in enumerate(steps) if i > start and node in (
                buf.rerun_readers if k else buf.readers)]
            if later and (end is None or later[-1] > end):
                end = later[-1]
        if end is not None:
            spans.append((buf, start, end))
    return spans


__all__ = ["WrittenBuffer", "ignored_positions", "node_output_names", "rerun_ops",
           "snapshot_reserve", "snapshot_spans", "value_reads", "written_buffers"]
