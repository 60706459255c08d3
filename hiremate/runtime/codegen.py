"""Code generation for the executor: a schedule phase as one straight-line Python function.

Why generated code: an interpreter pays a dictionary lookup, a dispatch on the step type and a
decoding of every argument for each of the thousands of ops of an iteration; generated code
pays none of that. It is compiled once per (schedule, device) and reused by every call.

Safety: the source text is built only from identifiers this module makes up (``v12``,
``f3``, ``k7``), Python literals of ints, finite floats, bools and None, and keyword names
checked with ``str.isidentifier``. Value names from the graph never enter the text; op targets
are resolved with :func:`hiremate.graphbuilder.opinfo.resolve_target` into a table of
callables, and every other constant (dtypes, devices, strings) sits in a table too.

Memory: a value lives in a local variable exactly as long as the schedule keeps its data node
alive; ``Delete`` becomes ``del`` of the owner and its views, and the temporaries of a node
(values that belong to no data node) are deleted right after their last use inside the node.
"""

from __future__ import annotations

import itertools
import keyword
import linecache
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from hiremate.errors import InvalidGraphError, InvalidScheduleError
from hiremate.ir.buffer_writes import (
    ignored_positions, node_output_names, rerun_ops, snapshot_spans)
from hiremate.ir.graph import ComputeNode, DataKind, Graph, Op, Ref
from hiremate.graphbuilder.encode import decode_arg
from hiremate.graphbuilder.opinfo import resolve_target
from hiremate.ir.schedule import Compute, Delete, Step

#: ops that only relabel storage; without autograd they are the identity
_IDENTITY = {"aten.detach.default", "aten.alias.default", "aten.lift_fresh.default"}
#: names of the containers a generated function receives (see :class:`Program`)
SOURCE_TABLES = {"param": "P", "frozen": "Z", "buffer": "B", "input": "I", "tangent": "T"}
_counter = itertools.count()


@dataclass
class Program:
    """A compiled phase. ``fn`` signature: ``fn(C, S, I, P, Z, B, T)`` with ``C`` the per-call
    state (RNG states), ``S`` a one-element list holding the tuple of values saved by the
    forward phase (popped, so the program owns them), and the source tables: inputs,
    parameters needing grad, frozen parameters, buffers, tangents. It returns
    ``(outputs, saved)`` for the forward phase and the gradients for the backward phase."""

    fn: Callable
    source: str
    loaded: list[str] = field(default_factory=list)  # graph names read from S (backward)


class SourceMap:
    """Where each source value of the graph comes from: table letter and index."""

    def __init__(self, graph: Graph):
        meta = graph.meta
        counts = [
            ("param", DataKind.PARAM, len(meta.get("param_names", []))),
            ("frozen", DataKind.PARAM, len(meta.get("frozen_names", []))),
            ("buffer", DataKind.BUFFER, len(meta.get("buffer_names", []))),
            ("input", DataKind.INPUT, len(meta.get("input_paths", []))),
            ("tangent", DataKind.TANGENT, len(meta.get("tangent_for_output", []))),
        ]
        sources = [d for d in graph.data if d.producer is None or d.kind is DataKind.TANGENT]
        self.where: dict[str, tuple[str, int]] = {}
        self.by_table: dict[str, list[str]] = {t: [] for t, _, _ in counts}
        pos = 0
        for table, kind, n in counts:
            for i in range(n):
                if pos >= len(sources) or sources[pos].kind is not kind:
                    raise InvalidGraphError(
                        f"the graph's source data nodes do not match its meta ({table} #{i}); "
                        "rebuild the graph with hiremate.build_graph"
                    )
                self.where[sources[pos].name] = (SOURCE_TABLES[table], i)
                self.by_table[table].append(sources[pos].name)
                pos += 1
        if pos != len(sources):
            raise InvalidGraphError(
                f"the graph has {len(sources)} source data nodes but its meta describes {pos}; "
                "rebuild the graph with hiremate.build_graph"
            )


class _Emitter:
    """Builds the text of one function while tracking which graph names are bound."""

    def __init__(self, graph: Graph, sources: SourceMap, namespace: dict[str, Any],
                 device: torch.device, phase: str, inherited: set[str] | None = None):
        self.graph = graph
        self.sources = sources
        self.ns = namespace
        self.device = device
        self.captured = torch.device(graph.meta.get("device", "cpu"))
        self.phase = phase
        self.lines: list[str] = []
        self.prologue: list[str] = []
        self.idents: dict[str, str] = namespace.setdefault("__idents__", {})
        self.bound: set[str] = set()
        self.inherited: set[str] = set(inherited or ())  # bound in the forward, held in S
        self.loaded: list[str] = []
        self.sources_bound: set[str] = set()
        self.computed: set[int] = set()
        self.runs_left: Counter = Counter()  # computations of each node not yet emitted
        self.rng_index = {n.id: k for k, n in enumerate(n for n in graph.nodes if n.random)}
        self.owner: dict[str, int] = {}
        for d in graph.data:
            self.owner[d.name] = d.id
            for a in d.aliases:
                self.owner[a] = d.id
        #: names of the model's outputs (and their views): the caller holds them from the forward
        self.caller_held = {n for d in graph.outputs
                            for n in (graph.data[d].name, *graph.data[d].aliases)}
        # buffers the forward writes whose earlier value a later step reads
        # (hiremate.ir.buffer_writes): buffer name -> (key in C.snap, writer, its write op)
        self.snapshots: dict[str, tuple[int, int, int]] = {}
        self.release_at: dict[int, list[int]] = {}  # step index -> keys to free after it
        self.snapped: set[str] = set()  # written already: value reads take the copy
        self.step_no = 0
        self._real_buffers = False  # an argument the op writes or ignores: the buffer itself

    # -- identifiers and constants -----------------------------------------------------------
    def ident(self, name: str) -> str:
        if name not in self.idents:
            self.idents[name] = f"v{len(self.idents)}"
        return self.idents[name]

    def const(self, value: Any) -> str:
        consts = self.ns.setdefault("__consts__", [])
        for i, c in enumerate(consts):
            if type(c) is type(value) and not isinstance(c, torch.Tensor) and c == value:
                return f"k{i}"
        name = f"k{len(consts)}"
        consts.append(value)
        self.ns[name] = value
        return name

    def func(self, target: str) -> str:
        funcs = self.ns.setdefault("__funcs__", {})
        if target not in funcs:
            try:
                fn = resolve_target(target)
            except (ValueError, AttributeError, RuntimeError) as exc:
                raise InvalidGraphError(
                    f"the graph calls {target!r}, which is not an operator of this torch "
                    f"({exc}); rebuild the graph with this torch version"
                ) from exc
            name = f"f{len(funcs)}"
            funcs[target] = name
            self.ns[name] = public_binding(target, fn) or getattr(fn, "_op", fn)
        return funcs[target]

    def read(self, name: str, node: ComputeNode) -> str:
        """The identifier holding graph value ``name``, binding sources and saved values."""
        if name in self.bound:
            return self.ident(name)
        if name in self.snapped and not self._real_buffers:
            return f"C.snap[{self.snapshots[name][0]}]"
        if name in self.sources.where:
            table, i = self.sources.where[name]
            if table == "T" and self.phase != "bwd":
                raise InvalidScheduleError(
                    f"node {node.name!r} reads the output gradient {name!r} before backward"
                )
            if name not in self.sources_bound:
                self.prologue.append(f"    {self.ident(name)} = {table}[{i}]")
                self.sources_bound.add(name)
            return self.ident(name)
        if name in self.inherited:
            self.inherited.discard(name)
            self.loaded.append(name)
            self.bound.add(name)
            return self.ident(name)
        raise InvalidScheduleError(
            f"node {node.name!r} reads {name!r}, which is not in memory at that point of the "
            "schedule (never computed, deleted, or a graph the builder got wrong)"
        )

    def expr(self, value: Any, node: ComputeNode) -> str:
        if isinstance(value, Ref):
            return self.read(value.name, node)
        if value is None or isinstance(value, bool):
            return repr(value)
        if isinstance(value, int):
            return repr(int(value))
        if isinstance(value, float) and math.isfinite(value):
            return repr(float(value))
        if isinstance(value, list):
            if not any(isinstance(v, (Ref, list, tuple, dict)) for v in value):
                # a list of plain numbers: a tuple literal is built once, at compile time
                return self.expr(tuple(value), node)
            return "[" + ", ".join(self.expr(v, node) for v in value) + "]"
        if isinstance(value, tuple):
            return "(" + "".join(self.expr(v, node) + ", " for v in value) + ")"
        if isinstance(value, dict) and "torch" in value:
            decoded = decode_arg(value, {})
            if isinstance(decoded, torch.device) and _same_device(decoded, self.captured):
                decoded = self.device  # the capture device stands for the device in use
            elif isinstance(decoded, torch.Tensor) and _same_device(decoded.device, self.captured):
                decoded = decoded.to(self.device)
            return self.const(decoded)
        return self.const(value)

    # -- steps -------------------------------------------------------------------------------
    def compute(self, node: ComputeNode) -> None:
        first = node.id not in self.computed
        self.computed.add(node.id)
        if node.is_loss:
            return
        if not first and not node.outputs:
            self.lines.append(f"    # node {node.id}: effect only, already done")
            return
        keep = node_output_names(self.graph, node)
        ops = list(enumerate(node.ops)) if first else self._rerun_ops(node, keep)
        last_use: dict[str, int] = {}
        for i, op in ops:
            for r in op.refs():
                last_use[r] = i
        local: set[str] = set()
        self.lines.append(f"    # node {node.id}{'' if first else ' (recomputed)'}")
        rng = self.rng_index.get(node.id)
        if rng is not None:
            self.lines.append(f"    _rng_save(C, {rng})" if first
                              else f"    _tok = _rng_replay(C, {rng})")
        for i, op in ops:
            # a model output made again while the caller holds its first copy, or a parameter
            # gradient made again beside the first (which the executor returns at the end):
            # the new copy is dropped at once and the first one read from here on (the same
            # value; a rebinding would leave both allocated, the first until the caller's
            # copy or the end of the step, where the simulator counts two copies only while
            # the step runs and a parameter's gradient not at all)
            again = (not first and (op.out in self.caller_held or self._param_grad(op.out))
                     and (op.out in self.bound or op.out in self.inherited))
            written = [name for name, (_, w, k) in self.snapshots.items()
                       if first and w == node.id and k == i]
            for name in written:  # the value before the write, for the steps that read it
                self._real_buffers = True
                self.lines.append(f"    C.snap[{self.snapshots[name][0]}] = "
                                  f"_clone({self.read(name, node)})")
                self._real_buffers = False
            line = self.op_line(op, node, recompute=not first, out="_again" if again else None)
            self.lines.append("    " + line)
            self.snapped.update(written)
            if again:
                self.lines.append("    del _again")
            else:
                local.add(op.out)
                self.bound.add(op.out)
                self.inherited.discard(op.out)
            dead = [r for r in dict.fromkeys([*op.refs(), op.out])
                    if r in local and r not in keep and last_use.get(r, -1) <= i]
            if dead:
                self.lines.append("    del " + ", ".join(self.ident(r) for r in dead))
                for r in dead:
                    local.discard(r)
                    self.bound.discard(r)
        if rng is not None and not first:
            self.lines.append("    _rng_restore(_tok); del _tok")
            self.runs_left[node.id] -= 1
            if self.runs_left[node.id] == 1:  # the last replay: its saved state is not needed
                self.lines.append(f"    _rng_release(C, {rng})")

    def _param_grad(self, name: str) -> bool:
        owner = self.owner.get(name)
        return owner is not None and self.graph.data[owner].kind is DataKind.PARAM_GRAD

    def _rerun_ops(self, node: ComputeNode, keep: set[str]) -> list[tuple[int, Op]]:
        """The ops of a rerun of ``node``, with their indices: those that its outputs other
        than parameter gradients need, and any op that draws random numbers
        (:func:`hiremate.ir.buffer_writes.rerun_ops`; a buffer's write is not made again). Why: a
        backward node rerun for its input gradient would compute its parameters' gradients
        again, which the first run made and the executor holds to the end (a rerun of a
        layer's backward then cost a weight-sized tensor and a matrix product for nothing)."""
        needed = {n for n in keep if not (self._param_grad(n) and (
            n in self.bound or n in self.inherited))}  # a deleted one is made again
        return [(i, node.ops[i]) for i in rerun_ops(node, needed)]

    def op_line(self, op: Op, node: ComputeNode, recompute: bool, out: str | None = None) -> str:
        out = out or self.ident(op.out)
        if op.target == "getitem":
            base, index = op.args
            return f"{out} = {self.expr(base, node)}[{self.expr(index, node)}]"
        if op.target in _IDENTITY and len(op.args) == 1 and isinstance(op.args[0], Ref):
            return f"{out} = {self.read(op.args[0].name, node)}"
        args = []
        skip = ignored_positions(op)
        for i, a in enumerate(op.args):
            self._real_buffers = i in skip
            text = self.expr(a, node)
            self._real_buffers = False
            if recompute and i in op.mutated_args and isinstance(a, Ref):
                text = f"_clone({text})"  # the buffer was written by the first execution
            args.append(text)
        for k, v in op.kwargs:
            if not (isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k)):
                raise InvalidGraphError(f"op {op.target} has a keyword argument {k!r} that is "
                                        "not an identifier")
            args.append(f"{k}={self.expr(v, node)}")
        return f"{out} = {self.func(op.target)}({', '.join(args)})"

    def delete(self, data_id: int) -> None:
        names = [n for n in (self.graph.data[data_id].name, *self.graph.data[data_id].aliases)]
        gone = [n for n in names if n in self.bound or n in self.sources_bound]
        self.sources_bound.difference_update(gone)  # a deleted tangent
        for n in names:
            self.inherited.discard(n)  # never loaded: simply not taken from S
        if gone:
            self.lines.append("    del " + ", ".join(self.ident(n) for n in gone))
            self.bound.difference_update(gone)

    def step(self, step: Step) -> None:
        if isinstance(step, Compute):
            self.compute(self.graph.nodes[step.node])
            for key in self.release_at.get(self.step_no, ()):
                self.lines.append(f"    C.snap.pop({key}, None)")
        elif isinstance(step, Delete):
            self.delete(step.data)
        else:
            raise InvalidScheduleError(f"unknown schedule step {step!r}")

    def finish(self, name: str, body_end: list[str]) -> Program:
        header = [f"def {name}(C, S, I, P, Z, B, T):"]
        src = "\n".join(header + self.prologue + self.lines + body_end) + "\n"
        filename = f"<hiremate-executor-{next(_counter)}-{name}>"
        code = compile(src, filename, "exec")
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        env = dict(self.ns)
        exec(code, env)  # noqa: S102 - text built only from generated identifiers
        return Program(env[name], src)


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


_PUBLIC_MODULES = (torch._C._VariableFunctions, torch._C._nn, torch._C._linalg, torch._C._fft,
                   torch._C._special)


def public_binding(target: str, overload: Any) -> Callable | None:
    """The C++ Python binding of ATen op ``target`` (``torch.mm`` for ``aten.mm.default``),
    when there is one: it parses its arguments about twice as fast as an ``OpOverload``, and
    calls the same kernel. The overloads of one op name are one function over different
    argument types (Tensor or Scalar, a dim or a list of dims), so the binding's choice among
    them, made from the argument types, computes what the recorded overload computes; the
    executor's tests check that outputs and gradients stay bit-identical to eager PyTorch.
    """
    if not isinstance(overload, torch._ops.OpOverload) or target.count(".") != 2:
        return None
    ns, name, _ = target.split(".")
    if ns != "aten":
        return None
    schema = overload._schema
    if any(str(a.type) == "List[Optional[Tensor]]" for a in schema.arguments):
        # the bindings parse an index list as tensors only, where the op takes None for the
        # dimensions it does not index (``x[:, idx]``, and index_put in its backward)
        return None
    if any(_default_may_read_as_zero(a) for a in schema.arguments):
        return None
    for module in _PUBLIC_MODULES:
        fn = getattr(module, name, None)
        if fn is not None:
            return fn
    if (schema.arguments and schema.arguments[0].name == "self"
            and isinstance(schema.arguments[0].type, torch.TensorType)):
        return getattr(torch._C.TensorBase, name, None)  # a method: self comes first
    return None


def _default_may_read_as_zero(arg: Any) -> bool:
    """Whether a call that leaves ``arg`` out gets another value from the public binding than
    from the op. A traced call leaves out the arguments at their schema default, and the
    bindings parse an integer default from its C++ text, so a default written as an enum reads
    as 0: ``torch._C._nn.mse_loss(a, b)`` returns the elementwise loss where
    ``aten.mse_loss.default(a, b)`` returns its mean. The schema gives the value, not its text;
    the one integer default ATen writes as an enum is the losses' ``reduction=Mean``
    (``tests/test_executor_defaults.py`` checks that against torch's operator table). Filling
    the default in instead can make a binding pick another overload: ``add(x, 2, 1)`` parses
    as the deprecated ``add(input, alpha, other)``."""
    return (arg.name == "reduction" and not arg.kwarg_only and arg.has_default_value()
            and str(arg.type) == "int")


def _namespace() -> dict[str, Any]:
    from hiremate.runtime.rng import rng_release, rng_replay, rng_restore, rng_save

    return {"__builtins__": {}, "_clone": torch.clone, "_rng_save": rng_save,
            "_rng_replay": rng_replay, "_rng_restore": rng_restore,
            "_rng_release": rng_release}


def split_schedule(graph: Graph, schedule: tuple[Step, ...]) -> int:
    """Index of the first step of the backward phase (just after the loss node's Compute)."""
    for i, step in enumerate(schedule):
        if isinstance(step, Compute) and step.node == graph.loss:
            return i + 1
    raise InvalidScheduleError("the schedule never computes the loss node")


def generate(graph: Graph, schedule: tuple[Step, ...], device: torch.device
             ) -> tuple[Program, Program]:
    """The forward and backward programs of ``schedule`` (split at the loss node)."""
    sources = SourceMap(graph)
    cut = split_schedule(graph, schedule)
    ns = _namespace()
    fwd = _Emitter(graph, sources, ns, device, "fwd")
    # a random node that runs once needs no saved generator state (a few KiB each, memory
    # the cost model does not count); only recomputed ones replay theirs
    runs = Counter(step.node for step in schedule if isinstance(step, Compute))
    fwd.rng_index = {k: i for k, i in fwd.rng_index.items() if runs[k] > 1}
    fwd.runs_left = runs
    for buffer, _, last in snapshot_spans(graph, schedule):
        fwd.snapshots[buffer.name] = (buffer.source, buffer.writer, buffer.write_op)
        fwd.release_at.setdefault(last, []).append(buffer.source)
    for fwd.step_no, step in enumerate(schedule[:cut]):
        fwd.step(step)
    out_names = output_names(graph)
    outs = [fwd.read(n, graph.nodes[graph.loss]) for n in out_names]
    bwd = _Emitter(graph, sources, ns, device, "bwd", inherited=set(fwd.bound))
    bwd.computed = set(fwd.computed)
    bwd.rng_index = fwd.rng_index
    bwd.runs_left = runs
    bwd.idents = fwd.idents
    bwd.snapshots, bwd.release_at, bwd.snapped = fwd.snapshots, fwd.release_at, fwd.snapped
    for name in sources.by_table["tangent"]:
        bwd.read(name, graph.nodes[graph.loss])
    for bwd.step_no, step in enumerate(schedule[cut:], start=cut):
        bwd.step(step)
    grads = []
    for g in graph.meta.get("grad_values", []):
        grads.append("None" if g is None else bwd.read(g, graph.nodes[-1]))
    saved = list(bwd.loaded)
    load = ([f"    ({''.join(bwd.ident(n) + ', ' for n in saved)}) = S.pop()"] if saved
            else ["    S.pop()"])
    # the program owns the tangents from here on: a Delete of one frees it
    bwd.prologue = load + bwd.prologue + ["    T.clear()"]
    bwd_prog = bwd.finish("backward_phase", [f"    return ({''.join(g + ', ' for g in grads)})"])
    bwd_prog.loaded = saved
    fwd_end = [f"    return ({''.join(o + ', ' for o in outs)}), "
               f"({''.join(fwd.ident(n) + ', ' for n in saved)})"]
    return fwd.finish("forward_phase", fwd_end), bwd_prog


def generate_inference(graph: Graph, device: torch.device) -> Program:
    """Every forward node once in order, each value freed after its last forward use."""
    sources = SourceMap(graph)
    fwd_nodes = [n for n in graph.nodes if n.is_fwd]
    protected = set(graph.outputs)
    last: dict[int, int] = {}
    for n in fwd_nodes:
        for d in n.outputs:
            last.setdefault(d, n.id)
        for d in n.inputs:
            last[d] = n.id
    frees: dict[int, list[int]] = {}
    for d, n in last.items():
        if d not in protected and graph.data[d].producer is not None:
            frees.setdefault(n, []).append(d)
    em = _Emitter(graph, sources, _namespace(), device, "inference")
    for n in fwd_nodes:
        em.compute(n)
        for d in sorted(frees.get(n.id, ())):
            em.delete(d)
    outs = [em.read(n, graph.nodes[graph.loss]) for n in output_names(graph)]
    return em.finish("inference", [f"    return ({''.join(o + ', ' for o in outs)}), ()"])


def output_names(graph: Graph) -> list[str]:
    """Graph names of the tensor outputs, in flat output order (constants left out)."""
    return [o for o in graph.meta.get("output_values", []) if isinstance(o, str)]
