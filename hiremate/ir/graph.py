"""The CD-graph: compute nodes and data nodes, shared by every stage of hiremate.

A compute node is a group of ATen operations that runs as a unit (a forward operation with the
views that share its storage, the backward operations that differentiate it, or the loss node
that separates the two phases). A data node is one piece of storage: a tensor value or a
gradient, with its size in bytes. Nodes are numbered in a topological order that follows the
original execution order, so ``graph.nodes[i]`` may only read data produced by nodes ``< i``.

The graph is immutable once built and serialises to JSON deterministically (``save``/``load``).
"""

from __future__ import annotations

import hashlib

import json
import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

from hiremate.errors import InvalidGraphError

FORMAT_VERSION = 1


class NodeKind(str, Enum):
    """Phase of a compute node."""

    FWD = "fwd"
    LOSS = "loss"
    BWD = "bwd"


class DataKind(str, Enum):
    """Role of a data node; it decides whether the node counts towards the activation budget."""

    PARAM = "param"            # a parameter: allocated before the call, never freed
    BUFFER = "buffer"          # a registered buffer (running statistics, masks...)
    INPUT = "input"            # a user input: held by the caller
    ACTIVATION = "activation"  # a forward value (including the model's outputs)
    TANGENT = "tangent"        # gradient of a model output, handed in by autograd
    GRAD = "grad"              # an intermediate gradient
    PARAM_GRAD = "param_grad"  # gradient of a parameter: required at the end, not budgeted
    INPUT_GRAD = "input_grad"  # gradient of a user input: required at the end, budgeted


#: Data kinds that exist before the forward starts and are never freed by a schedule.
SOURCE_KINDS = frozenset({DataKind.PARAM, DataKind.BUFFER, DataKind.INPUT})
#: Data kinds whose bytes count towards the activation budget.
COUNTED_KINDS = frozenset(
    {DataKind.ACTIVATION, DataKind.TANGENT, DataKind.GRAD, DataKind.INPUT_GRAD}
)
#: Data kinds that must be alive when the schedule ends.
FINAL_KINDS = frozenset({DataKind.PARAM_GRAD, DataKind.INPUT_GRAD})


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to a value by name inside an :class:`Op`'s arguments."""

    name: str


@dataclass(frozen=True, slots=True)
class Op:
    """One ATen call: ``out = target(*args, **kwargs)``; the executor generates code from it.

    ``target`` is the qualified name of an ATen overload (``"aten.mm.default"``) or
    ``"getitem"``; arguments hold constants and :class:`Ref` s to earlier values.
    """

    target: str
    args: tuple
    kwargs: tuple[tuple[str, Any], ...]
    out: str
    #: index of the buffer-mutating arguments: on recomputation they must not be written twice
    mutated_args: tuple[int, ...] = ()
    random: bool = False

    def refs(self, skip: Any = ()) -> list[str]:
        """Names of the values this op reads, in argument order; ``skip``: positional
        arguments left out (by index)."""
        found: list[str] = []
        _collect_refs(tuple(a for i, a in enumerate(self.args) if i not in skip), found)
        _collect_refs(tuple(v for _, v in self.kwargs), found)
        return found


def _collect_refs(value: Any, found: list[str]) -> None:
    if isinstance(value, Ref):
        found.append(value.name)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect_refs(item, found)


@dataclass(frozen=True, slots=True)
class DataNode:
    """One storage: its producer, its size and the value names (base and views) that alias it."""

    id: int
    name: str
    kind: DataKind
    shape: tuple[int, ...]
    dtype: str
    size: int
    producer: int | None = None
    aliases: tuple[str, ...] = ()

    @property
    def counted(self) -> bool:
        return self.kind in COUNTED_KINDS


@dataclass(frozen=True, slots=True)
class ComputeNode:
    """A unit of computation with its measured cost.

    ``inputs`` are memory dependencies (the data must be alive); ``soft_inputs`` only fix the
    order (shape-only uses) and keep nothing alive. ``partner`` links a forward node with the
    backward node that differentiates it. ``signature`` identifies the operations and tensor
    characteristics, so that identical subgraphs can be recognised.
    """

    id: int
    name: str
    kind: NodeKind
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    time: float = 0.0
    overhead: int = 0
    soft_inputs: tuple[int, ...] = ()
    partner: int | None = None
    signature: str = ""
    ops: tuple[Op, ...] = ()
    mutates: tuple[str, ...] = ()
    random: bool = False
    flops: float = 0.0

    @property
    def is_fwd(self) -> bool:
        return self.kind is NodeKind.FWD

    @property
    def is_bwd(self) -> bool:
        return self.kind is NodeKind.BWD

    @property
    def is_loss(self) -> bool:
        return self.kind is NodeKind.LOSS


class Graph:
    """An immutable CD-graph. Build it with :func:`hiremate.build_graph` or by hand (tests).

    ``outputs`` are the data nodes the model returns, in the order of its flattened outputs;
    ``meta`` holds JSON-serialisable facts the executor needs (argument names and order, output
    structure, buffer mutations, device, cost model).
    """

    __slots__ = ("_nodes", "_data", "_outputs", "_meta", "_users", "_soft_users", "_loss")

    def __init__(
        self,
        nodes: Iterable[ComputeNode],
        data: Iterable[DataNode],
        outputs: Iterable[int],
        meta: dict[str, Any] | None = None,
    ):
        self._nodes = tuple(nodes)
        self._data = tuple(data)
        self._outputs = tuple(outputs)
        self._meta = json.loads(json.dumps(meta or {}, sort_keys=True))
        users: list[list[int]] = [[] for _ in self._data]
        soft: list[list[int]] = [[] for _ in self._data]
        for node in self._nodes:
            for d in node.inputs:
                if 0 <= d < len(users) and (not users[d] or users[d][-1] != node.id):
                    users[d].append(node.id)
            for d in node.soft_inputs:
                if 0 <= d < len(soft):
                    soft[d].append(node.id)
        self._users = tuple(tuple(u) for u in users)
        self._soft_users = tuple(tuple(u) for u in soft)
        losses = [n.id for n in self._nodes if n.is_loss]
        self._loss = losses[0] if len(losses) == 1 else None
        self.validate()

    # -- access -----------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[ComputeNode, ...]:
        return self._nodes

    @property
    def data(self) -> tuple[DataNode, ...]:
        return self._data

    @property
    def outputs(self) -> tuple[int, ...]:
        return self._outputs

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._meta))

    @property
    def loss(self) -> int:
        """Id of the loss node."""
        assert self._loss is not None
        return self._loss

    def users(self, data: int) -> tuple[int, ...]:
        """Compute nodes that read ``data`` (memory dependency), in increasing id order."""
        return self._users[data]

    def soft_users(self, data: int) -> tuple[int, ...]:
        """Compute nodes that need only the shape of ``data``."""
        return self._soft_users[data]

    @property
    def fwd_nodes(self) -> tuple[ComputeNode, ...]:
        return tuple(n for n in self._nodes if n.is_fwd)

    @property
    def bwd_nodes(self) -> tuple[ComputeNode, ...]:
        return tuple(n for n in self._nodes if n.is_bwd)

    @property
    def final_data(self) -> tuple[int, ...]:
        """Data that must be alive at the end: parameter and input gradients."""
        return tuple(d.id for d in self._data if d.kind in FINAL_KINDS)

    @property
    def tangent_bytes(self) -> int:
        """Bytes of the output gradients autograd hands in: held from the loss step on, so every
        whole-step figure (floors, reserves, the loss's own memory) adds them."""
        return sum(d.size for d in self._data if d.kind is DataKind.TANGENT)

    def total_time(self) -> float:
        """Sum of the compute times: the time of one store-everything iteration."""
        return math.fsum(n.time for n in self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        counts = {k.value: 0 for k in NodeKind}
        for n in self._nodes:
            counts[n.kind.value] += 1
        return (
            f"Graph({counts['fwd']} fwd + {counts['loss']} loss + {counts['bwd']} bwd compute "
            f"nodes, {len(self._data)} data nodes)"
        )

    # -- invariants ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Check the invariants every stage relies on; raise :class:`InvalidGraphError`."""
        n_data = len(self._data)
        for i, d in enumerate(self._data):
            if d.id != i:
                raise InvalidGraphError(f"data node {d.name!r} has id {d.id}, expected {i}")
            if d.size < 0:
                raise InvalidGraphError(f"data node {d.name!r} has negative size {d.size}")
            if (d.kind in SOURCE_KINDS) != (d.producer is None):
                raise InvalidGraphError(
                    f"data node {d.name!r} of kind {d.kind.value} "
                    f"{'has' if d.producer is not None else 'lacks'} a producer"
                )
        if self._loss is None:
            raise InvalidGraphError("a CD-graph needs exactly one loss node")
        for i, node in enumerate(self._nodes):
            if node.id != i:
                raise InvalidGraphError(f"compute node {node.name!r} has id {node.id}, expected {i}")
            for d in node.inputs + node.soft_inputs + node.outputs:
                if not 0 <= d < n_data:
                    raise InvalidGraphError(f"compute node {node.name!r} refers to data {d}")
            for d in node.inputs + node.soft_inputs:
                producer = self._data[d].producer
                if producer is not None and producer >= i:
                    raise InvalidGraphError(
                        f"compute node {node.name!r} (#{i}) reads {self._data[d].name!r}, "
                        f"produced by #{producer}: ids must follow a topological order"
                    )
            for d in node.outputs:
                if self._data[d].producer != i:
                    raise InvalidGraphError(
                        f"data node {self._data[d].name!r} is an output of {node.name!r} "
                        "but names another producer"
                    )
            if node.is_fwd and i > self._loss:
                raise InvalidGraphError(f"forward node {node.name!r} comes after the loss node")
            if node.is_bwd and i < self._loss:
                raise InvalidGraphError(f"backward node {node.name!r} comes before the loss node")
            if node.time < 0 or node.overhead < 0:
                raise InvalidGraphError(f"compute node {node.name!r} has a negative cost")
        for d in self._outputs:
            if not 0 <= d < n_data:
                raise InvalidGraphError(f"graph output {d} is not a data node")

    # -- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "nodes": [_node_to_dict(n) for n in self._nodes],
            "data": [_data_to_dict(d) for d in self._data],
            "outputs": list(self._outputs),
            "meta": self._meta,
        }

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> "Graph":
        if payload.get("format") != FORMAT_VERSION:
            raise InvalidGraphError(
                f"graph file has format {payload.get('format')!r}, this hiremate reads "
                f"{FORMAT_VERSION}; rebuild the graph with hiremate.build_graph"
            )
        return cls(
            nodes=[_node_from_dict(n) for n in payload["nodes"]],
            data=[_data_from_dict(d) for d in payload["data"]],
            outputs=payload["outputs"],
            meta=payload["meta"],
        )

    def dumps(self) -> str:
        """Deterministic JSON text of the graph."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.dumps())

    @classmethod
    def load(cls, path: str | Path) -> "Graph":
        try:
            payload = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidGraphError(f"cannot read a graph from {path}: {exc}") from exc
        return cls.from_dict(payload)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and self.dumps() == other.dumps()

    def __hash__(self) -> int:
        return hash(self.dumps())


# -- JSON encoding of op arguments ----------------------------------------------------------
def encode_value(value: Any) -> Any:
    """Encode an op argument as JSON: references, dtypes, devices and special floats tagged."""
    if isinstance(value, Ref):
        return {"ref": value.name}
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (tuple, list)):
        return {"list" if isinstance(value, list) else "tuple": [encode_value(v) for v in value]}
    if isinstance(value, dict) and "torch" in value:
        return value
    raise InvalidGraphError(f"cannot serialise an op argument of type {type(value).__name__}")


def decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if "ref" in value:
            return Ref(value["ref"])
        if "float" in value:
            return float(value["float"])
        if "list" in value:
            return [decode_value(v) for v in value["list"]]
        if "tuple" in value:
            return tuple(decode_value(v) for v in value["tuple"])
        return value  # {"torch": kind, "value": ...}: decoded by the executor
    return value


def _op_to_dict(op: Op) -> dict[str, Any]:
    return {
        "target": op.target,
        "args": encode_value(tuple(op.args)),
        "kwargs": [[k, encode_value(v)] for k, v in op.kwargs],
        "out": op.out,
        "mutated_args": list(op.mutated_args),
        "random": op.random,
    }


def _op_from_dict(d: dict[str, Any]) -> Op:
    return Op(
        target=d["target"],
        args=decode_value(d["args"]),
        kwargs=tuple((k, decode_value(v)) for k, v in d["kwargs"]),
        out=d["out"],
        mutated_args=tuple(d["mutated_args"]),
        random=d["random"],
    )


#: public names: guards (``graph.meta["guards"]``) store ops in the same form
op_to_dict = _op_to_dict
op_from_dict = _op_from_dict


def _node_to_dict(n: ComputeNode) -> dict[str, Any]:
    return {
        "id": n.id, "name": n.name, "kind": n.kind.value, "inputs": list(n.inputs),
        "outputs": list(n.outputs), "time": n.time, "overhead": n.overhead,
        "soft_inputs": list(n.soft_inputs), "partner": n.partner, "signature": n.signature,
        "ops": [_op_to_dict(o) for o in n.ops], "mutates": list(n.mutates),
        "random": n.random, "flops": n.flops,
    }


def _node_from_dict(d: dict[str, Any]) -> ComputeNode:
    return ComputeNode(
        id=d["id"], name=d["name"], kind=NodeKind(d["kind"]), inputs=tuple(d["inputs"]),
        outputs=tuple(d["outputs"]), time=d["time"], overhead=d["overhead"],
        soft_inputs=tuple(d["soft_inputs"]), partner=d["partner"], signature=d["signature"],
        ops=tuple(_op_from_dict(o) for o in d["ops"]), mutates=tuple(d["mutates"]),
        random=d["random"], flops=d["flops"],
    )


def _data_to_dict(d: DataNode) -> dict[str, Any]:
    return {
        "id": d.id, "name": d.name, "kind": d.kind.value, "shape": list(d.shape),
        "dtype": d.dtype, "size": d.size, "producer": d.producer, "aliases": list(d.aliases),
    }


def _data_from_dict(d: dict[str, Any]) -> DataNode:
    return DataNode(
        id=d["id"], name=d["name"], kind=DataKind(d["kind"]), shape=tuple(d["shape"]),
        dtype=d["dtype"], size=d["size"], producer=d["producer"], aliases=tuple(d["aliases"]),
    )


def graph_key(graph: Graph, times: bool = False) -> str:
    """SHA-256 of what a solver sees of ``graph``: structure, kinds, sizes, memory overheads
    and op signatures (names, ops and meta left out, so identical blocks of different models
    share entries).

    Measured times are left out unless ``times``: they are medians of a noisy measurement, so
    two captures of one model never agree on them, while the op signature (operation, shapes,
    dtypes, device) already determines what is measured. A hit therefore returns what was
    solved with the first capture's times; the caller re-simulates it with the current ones."""
    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(repr((n.kind.value, n.inputs, n.outputs, n.soft_inputs, n.overhead,
                       n.signature, n.partner, n.random, n.time if times else None)).encode())
    for d in graph.data:
        h.update(repr((d.kind.value, d.size, d.producer)).encode())
    h.update(repr(graph.outputs).encode())
    return h.hexdigest()


def same_program(a: Graph, b: Graph) -> bool:
    """Whether two captures are one program: the same nodes, ops (with their constant
    arguments), values and outputs, whatever their measured times."""
    return (len(a.nodes) == len(b.nodes) and a.outputs == b.outputs
            and all((m.kind, m.inputs, m.outputs, m.ops) == (n.kind, n.inputs, n.outputs, n.ops)
                    for m, n in zip(a.nodes, b.nodes))
            and [(d.kind, d.shape, d.dtype) for d in a.data]
            == [(d.kind, d.shape, d.dtype) for d in b.data])


def same_structure(a: Graph, b: Graph) -> bool:
    """Whether a schedule of ``a`` is a schedule of ``b``: the same nodes (kinds, ATen
    operations in order, inputs, outputs, backward partners, effects), values (kinds,
    producers, dtypes, ranks) and outputs, whatever the sizes and constant arguments. Two
    captures of one model on inputs of other batch sizes or sequence lengths usually are."""
    if len(a.nodes) != len(b.nodes) or len(a.data) != len(b.data) or a.outputs != b.outputs:
        return False
    for m, n in zip(a.nodes, b.nodes):
        if ((m.kind, m.inputs, m.outputs, m.soft_inputs, m.partner, m.random, m.mutates)
                != (n.kind, n.inputs, n.outputs, n.soft_inputs, n.partner, n.random, n.mutates)
                or [o.target for o in m.ops] != [o.target for o in n.ops]):
            return False
    return all((d.kind, d.producer, d.dtype, len(d.shape), len(d.aliases))
               == (e.kind, e.producer, e.dtype, len(e.shape), len(e.aliases))
               for d, e in zip(a.data, b.data))
