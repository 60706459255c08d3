"""Group the ops of a joint ATen graph into the compute nodes of a CD-graph.

Rules (docs/design.md, "Capture"; the graph builder of "Rockmate: an Efficient, Fast,
Automatic and Generic Tool for Re-materialization in PyTorch", appendix A):

- every op that allocates storage starts a forward node (forward phase) or joins the backward
  node of the forward node it differentiates (backward phase, paired by ``seq_nr``);
- views, and in-place writes into a value nobody else has read yet, join the node that owns the
  storage (they allocate nothing); views of parameters, buffers, inputs and tangents are copied
  into each node that reads them;
- ``*_like`` factories on contiguous tensors read only a shape: they become plain factories,
  and the tensor becomes a soft dependency (ordering only);
- a backward op joins its group's current node only when everything it reads comes from that
  node or an earlier one; otherwise it opens a new node, so the grouped graph stays acyclic
  and its node order is an execution order;
- a backward op tagged with a forward op whose backward it cannot be part of (it reads a
  gradient that flows from a forward node that is not downstream of that op) runs in a node of
  its own, without a partner: autograd tags the sums it inserts where a value has several
  readers with the sequence number of the first backward op it ran (:class:`GradientOrigins`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from hiremate.errors import GraphCaptureError
from hiremate.ir.graph import DataKind, NodeKind, Op
from hiremate.graphbuilder.capture import JointCapture, writable_placeholders
from hiremate.graphbuilder.functionalise import WRITE_COPY
from hiremate.graphbuilder.opinfo import LIKE_FACTORIES, op_kind, schema_name


@dataclass
class Group:
    """A future compute node: its ops (fx nodes, in execution order) and what it reads."""

    kind: NodeKind
    index: int
    ops: list[torch.fx.Node] = field(default_factory=list)
    key: Any = None
    soft: set[str] = field(default_factory=set)      # owners read for their shape only
    mutates: set[str] = field(default_factory=set)    # buffers written
    rewrites: dict[str, Op] = field(default_factory=dict)  # fx node name -> replacement op
    partner: "Group | None" = None                   # forward group a backward group differentiates


@dataclass
class Grouping:
    """Result of :func:`group_joint`: groups plus the storage and role of every value."""

    fwd: list[Group]
    bwd: list[Group]
    owner: dict[str, str]               # value name -> name of the value owning its storage
    producer: dict[str, Group]          # owner name -> group that allocates it
    inline: dict[str, torch.fx.Node]    # views of sources, copied into readers
    rename: dict[str, str]              # value name -> name to read it by
    source_kind: dict[str, DataKind]    # placeholder name -> kind
    source_label: dict[str, str]        # placeholder name -> parameter/buffer name or input path
    tangents: list[str]
    outputs: list[str | ConstantOutput]  # flat model outputs: value names or constants
    grads: list[str | None]             # per parameter needing grad, then per input needing grad
    n_fwd_ops: int = 0


@dataclass(frozen=True)
class ConstantOutput:
    """A flat model output that the program does not compute (an int, a string, None), kept by
    value and apart from the value names, which are strings as well."""

    value: Any


def group_joint(cap: JointCapture) -> Grouping:
    graph = cap.gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    n_p, n_f, n_b = len(cap.param_names), len(cap.frozen_names), len(cap.buffer_names)
    n_in = len(cap.input_paths)
    source_kind: dict[str, DataKind] = {}
    source_label: dict[str, str] = {}
    labels = (
        [(DataKind.PARAM, n) for n in cap.param_names]
        + [(DataKind.PARAM, n) for n in cap.frozen_names]
        + [(DataKind.BUFFER, n) for n in cap.buffer_names]
        + [(DataKind.INPUT, p) for p in cap.input_paths]
        + [(DataKind.TANGENT, f"tangent{i}") for i in range(len(cap.tangent_for_output))]
    )
    if len(labels) != len(placeholders):
        raise GraphCaptureError(
            f"traced graph has {len(placeholders)} inputs, expected {len(labels)}: "
            "the model's arguments could not be matched to the traced graph"
        )
    for ph, (kind, label) in zip(placeholders, labels):
        source_kind[ph.name] = kind
        source_label[ph.name] = label
    writable = writable_placeholders([ph.name for ph in placeholders], n_p + n_f + n_b,
                                     cap.input_requires_grad)
    tangents = [ph.name for ph in placeholders[n_p + n_f + n_b + n_in:]]

    owner: dict[str, str] = {ph.name: ph.name for ph in placeholders}
    producer: dict[str, Group] = {}
    inline: dict[str, torch.fx.Node] = {}
    rename: dict[str, str] = {}
    readers: dict[str, set[int]] = {}          # owner -> ids of groups that read it
    fwd: list[Group] = []
    bwd: list[Group] = []
    group_of_node: dict[str, Group] = {}
    fwd_group_of_seq: dict[int, Group] = {}
    bwd_current: dict[Any, Group] = {}
    write_groups: dict[str, Group] = {}  # a writer with clones to write into: their node
    origins = GradientOrigins(fwd, producer, readers)
    phase = NodeKind.FWD
    n_fwd_ops = 0

    def is_source(o: str) -> bool:
        return o in source_kind

    def read_owners(node: torch.fx.Node) -> list[str]:
        found: list[str] = []
        for a in node.all_input_nodes:
            name = rename.get(a.name, a.name)
            if a.name in inline:
                found.extend(read_owners(inline[a.name]))
            elif name in owner:
                found.append(owner[name])
        return found

    def group_rank(g: Group) -> tuple[int, int]:
        return (0 if g.kind is NodeKind.FWD else 1, g.index)

    def new_group(kind: NodeKind, key: Any = None) -> Group:
        groups = fwd if kind is NodeKind.FWD else bwd
        g = Group(kind, len(groups), key=key)
        groups.append(g)
        return g

    def add(g: Group, node: torch.fx.Node) -> None:
        g.ops.append(node)
        group_of_node[node.name] = g
        for o in read_owners(node):
            readers.setdefault(o, set()).add(id(g))

    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if target is operator.getitem:
            base = node.args[0]
            if base.name in inline:  # an item of a split of a source: inlined like the split
                inline[node.name] = node
                owner[node.name] = owner[inline_root(base.name, inline, rename)]
                if phase is NodeKind.FWD and node.name == cap.last_forward:
                    phase = NodeKind.BWD
                continue
            g = group_of_node[base.name]
            kind = op_kind(base.target)
            owner[node.name] = owner[base.args[0].name] if kind.returns_views else node.name
            if owner[node.name] == node.name:
                producer[node.name] = g
            add(g, node)
            if phase is NodeKind.FWD and node.name == cap.last_forward:
                phase = NodeKind.BWD
            continue
        if phase is NodeKind.FWD:
            n_fwd_ops += 1
        kind = op_kind(target)
        seq = node.meta.get("seq_nr")
        val = node.meta.get("val")
        viewed = node.args[kind.view_of or 0] if node.args else None
        if ((kind.view_of is not None or kind.returns_views) and not (
                isinstance(viewed, torch.fx.Node) and viewed.op == "get_attr")):
            # a view, or a list of views (split): joins the node owning the storage (a view of
            # a constant of the program, which no node owns, is an op of its own below, the
            # constant recorded by value in it: VideoMAE slices its position table)
            base = viewed
            base_name = rename.get(base.name, base.name)
            o = owner.get(base_name, base_name)
            if base.name in inline:
                o = owner[inline_root(base.name, inline, rename)]
            owner[node.name] = o
            if kind.inplace:
                _inplace(node, o, kind, group_of_node, producer, readers, source_kind,
                         source_label, phase, fwd, bwd, new_group, add, read_owners, group_rank,
                         inline, rename, writable)
            elif is_source(o):
                inline[node.name] = node
            else:
                add(producer[o], node)
        elif schema_name(target) in LIKE_FACTORIES and _contiguous(node.args[0]):
            g = _open_group(node, phase, seq, fwd_group_of_seq, bwd_current, new_group,
                            lambda n: [], group_rank, producer, origins)
            src = node.args[0]
            o = owner.get(rename.get(src.name, src.name))
            if src.name in inline:
                o = owner[inline_root(src.name, inline, rename)]
            if o is not None and not is_source(o):
                g.soft.add(o)
            g.rewrites[node.name] = _factory_op(node)
            owner[node.name] = node.name
            producer[node.name] = g
            g.ops.append(node)
            group_of_node[node.name] = g
        else:
            # a write's clones (functionalise.clone_hidden_writes) and the writer: one node
            writer = node.meta.get(WRITE_COPY, node.name)
            g = write_groups.get(writer) or _open_group(
                node, phase, seq, fwd_group_of_seq, bwd_current, new_group, read_owners,
                group_rank, producer, origins)
            if WRITE_COPY in node.meta:
                write_groups[writer] = g
            for i in kind.writes:
                arg = node.args[i] if i < len(node.args) else None
                if isinstance(arg, torch.fx.Node):
                    o = owner.get(rename.get(arg.name, arg.name))
                    if o is not None and o in writable:
                        g.mutates.add(source_label[o])
                    elif o is not None and not is_source(o) and producer.get(o) is not g:
                        raise GraphCaptureError(
                            f"op {node.name} ({schema_name(target)}) writes into "
                            f"{arg.name}, which another node produced; hiremate cannot yet "
                            "recompute such writes: make the write out of place"
                        )
            if isinstance(val, torch.Tensor):
                owner[node.name] = node.name
                producer[node.name] = g
            add(g, node)
            if phase is NodeKind.FWD and seq is not None and seq not in fwd_group_of_seq:
                fwd_group_of_seq[seq] = g
        if phase is NodeKind.FWD and node.name == cap.last_forward:
            phase = NodeKind.BWD

    out_node = next(n for n in graph.nodes if n.op == "output")
    results = list(out_node.args[0])
    flat_outs, grads = results[:cap.n_outputs], results[cap.n_outputs:]
    outputs = [rename.get(o.name, o.name) if isinstance(o, torch.fx.Node) else ConstantOutput(o)
               for o in flat_outs]
    grad_names = [rename.get(g.name, g.name) if isinstance(g, torch.fx.Node) else None
                  for g in grads]
    return Grouping(fwd, bwd, owner, producer, inline, rename, source_kind, source_label,
                    tangents, outputs, grad_names, n_fwd_ops)


def inline_root(name: str, inline: dict[str, torch.fx.Node], rename: dict[str, str]) -> str:
    """The source placeholder that an inlined view chain starts from."""
    node = inline[name]
    while True:
        base = node.args[op_kind(node.target).view_of or 0]
        base_name = rename.get(base.name, base.name)
        if base_name in inline:
            node = inline[base_name]
        else:
            return base_name


def _open_group(node, phase, seq, fwd_group_of_seq, bwd_current, new_group, read_owners,
                group_rank, producer, origins: "GradientOrigins") -> Group:
    if phase is NodeKind.FWD:
        return new_group(NodeKind.FWD)
    reads = read_owners(node)
    key = seq if seq is not None and seq in fwd_group_of_seq else ("solo", node.name)
    if key == seq and not origins.downstream_of(fwd_group_of_seq[seq], reads):
        key = ("solo", node.name)
    current = bwd_current.get(key)
    if current is not None:
        limit = group_rank(current)
        if all(group_rank(producer[o]) <= limit for o in reads if o in producer):
            origins.note(current, reads)
            return current
    g = new_group(NodeKind.BWD, key)
    g.partner = fwd_group_of_seq.get(seq) if key == seq else None
    bwd_current[key] = g
    origins.note(g, reads)
    return g


class GradientOrigins:
    """Where each backward group's gradients flow from, to check autograd's pairing.

    The origin of a backward group paired with forward group ``F`` is ``F`` (it makes the
    gradients of ``F``'s inputs); an unpaired group's origins are those of the gradients it
    reads (a sum of partial gradients flows from every reader of the value). The backward of
    ``F`` reads only gradients that flow from ``F`` or from forward groups downstream of it, so
    an op tagged with ``F`` that reads another is not part of ``F``'s backward: autograd tags
    the sums it inserts for values with several readers with the sequence number of the first
    backward op it ran (in a ResNet, its classifier's). Paired with ``F``, such a sum would sit
    in ``F``'s backward while reading gradients that ``F``'s backward makes possible only later
    in a partition's order: blocks' backward parts would depend on each other in a cycle."""

    def __init__(self, fwd: list[Group], producer: dict[str, Group],
                 readers: dict[str, set[int]]):
        self._fwd, self._producer, self._readers = fwd, producer, readers
        self._downstream: list[int] | None = None   # per forward group: bit set of itself
        self._origins: dict[int, int] = {}          # id(backward group) -> bit set of groups

    def _reach(self) -> list[int]:
        """Per forward group, the forward groups that read its values, transitively (and
        itself), as bit sets over group indices. Computed once the forward phase is over."""
        if self._downstream is None:
            index = {id(g): g.index for g in self._fwd}
            succ: list[set[int]] = [set() for _ in self._fwd]
            for o, g in self._producer.items():
                if g.kind is NodeKind.FWD:
                    succ[g.index].update(index[r] for r in self._readers.get(o, ())
                                         if r in index and index[r] != g.index)
            down = [1 << i for i in range(len(self._fwd))]
            # readers are made after what they read, so later indices come first
            for i in sorted(range(len(self._fwd)), reverse=True):
                for j in succ[i]:
                    down[i] |= down[j]
            self._downstream = down
        return self._downstream

    def _flowing(self, reads: list[str]) -> int:
        bits = 0
        for o in reads:
            g = self._producer.get(o)
            if g is not None and g.kind is NodeKind.BWD:
                bits |= self._origins.get(id(g), 0)
        return bits

    def downstream_of(self, fwd_group: Group, reads: list[str]) -> bool:
        """Whether every gradient among ``reads`` flows from ``fwd_group`` or below it."""
        bits = self._flowing(reads)
        return not bits or not bits & ~self._reach()[fwd_group.index]

    def note(self, group: Group, reads: list[str]) -> None:
        """Record an op joining ``group`` (a backward group) that reads ``reads``."""
        if group.partner is not None:
            self._origins[id(group)] = 1 << group.partner.index
        else:
            self._origins[id(group)] = self._origins.get(id(group), 0) | self._flowing(reads)


_WRITE_HINTS = {
    DataKind.INPUT: (" (a key path of (args, kwargs): [0][0] is the first positional argument) "
                     "in place, and that input needs a gradient (eager refuses such a write "
                     "into a leaf too): make the model write into a copy (x = x / 255 rather "
                     "than x /= 255, or x = x.clone() first)"),
}


def _inplace(node, o, kind, group_of_node, producer, readers, source_kind, source_label,
             phase, fwd, bwd, new_group, add, read_owners, group_rank, inline, rename,
             writable) -> None:
    """An in-place write: into a buffer or an input that needs no gradient (recorded as a
    mutation), or into an activation."""
    if o in source_kind:
        if o not in writable:
            raise GraphCaptureError(
                f"op {node.name} ({schema_name(node.target)}) writes into the "
                f"{source_kind[o].value} {source_label[o]!r}{_WRITE_HINTS.get(source_kind[o], '')}")
        g = _writer_home(node, producer, read_owners, phase)
        if g is None:
            g = new_group(phase)
        g.mutates.add(source_label[o])
        add(g, node)
        rename[node.name] = o
        return
    home = producer[o]
    others = readers.get(o, set()) - {id(home)}
    late = [r for r in read_owners(node)
            if r in producer and group_rank(producer[r]) > group_rank(home)]
    if others or late:
        raise GraphCaptureError(
            f"op {node.name} ({schema_name(node.target)}) writes in place into a value that "
            "other operations read before the write, or that depends on later values; hiremate "
            "cannot recompute it safely: use the out-of-place form of this operation"
        )
    add(home, node)


def _writer_home(node: torch.fx.Node, producer: dict[str, Group], owner_of, phase: NodeKind
                 ) -> Group | None:
    """The group that computes the value a buffer write stores, when the write can run right
    after it: functionalisation turns ``buffer.add_(1)`` into ``new = buffer + 1`` and a
    ``copy_(buffer, new)``; the pair is one effect (a node with no output, run once per call),
    as the in-place op was. That holds when the value's group is of this phase and every other
    reader of the buffer runs before the value is computed."""
    if node.target is not torch.ops.aten.copy_.default or len(node.args) < 2:
        return None
    buffer, value = node.args[0], node.args[1]
    if not isinstance(value, torch.fx.Node) or not isinstance(buffer, torch.fx.Node):
        return None
    home = next((producer[o] for o in owner_of(node) if o in producer), None)
    if home is None or home.kind is not phase:
        return None
    position = {n: i for i, n in enumerate(node.graph.nodes)}
    if any(position[u] > position[value] for u in buffer.users if u is not node):
        return None
    return home


def _contiguous(arg: Any) -> bool:
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_contiguous()


def _factory_op(node: torch.fx.Node) -> Op:
    """``zeros_like(x, ...)`` -> ``zeros(shape, ...)``: the same tensor without reading x."""
    from hiremate.graphbuilder.encode import encode_arg

    val = node.meta["val"]
    kind = LIKE_FACTORIES[schema_name(node.target)]
    shape = [int(s) for s in val.shape]
    kwargs = {"dtype": val.dtype, "layout": val.layout, "device": val.device}
    if kind == "empty":
        target, args = "aten.empty.memory_format", (shape,)
    elif kind == "full":
        target, args = "aten.full.default", (shape, node.args[1])
    else:
        target, args = f"aten.{kind}.default", (shape,)
    gen = node.kwargs.get("generator")
    if gen is not None:
        kwargs["generator"] = gen
    return Op(
        target=target,
        args=tuple(encode_arg(a) for a in args),
        kwargs=tuple((k, encode_arg(v)) for k, v in kwargs.items()),
        out=node.name,
        random=kind in ("rand", "randn"),
    )
