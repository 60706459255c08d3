"""Python branches on tensor values, met while tracing: specialised on the sample and guarded.

A traced program has no Python control flow, so a model that asks a tensor for its value
(``if mask.all():``, ``n = int(lengths.max())``) cannot be traced on fake tensors as such. What
the branch depends on decides what is done, by looking at the ops that compute the asked value
in the graph traced so far:

- only inputs that need no gradient (attention and padding masks, token ids, lengths) and
  constants: the value is computed from the sample's real tensors, the trace follows that
  branch (*specialised*), and the ops computing the value become a **guard** kept in the graph.
  The executor evaluates every guard on each call's inputs before running the schedule; a call
  whose guarded values differ is not run on this program (it is captured again, or refused);
- a random op (Hugging Face LayerDrop draws ``torch.rand([])`` per layer): no capture; the error
  says where, and for LayerDrop, which setting turns it off;
- parameters, buffers, or inputs that need a gradient (a branch on an activation): no capture;
  the error names the op and the source line.

A tensor whose *size* depends on tensor values (``x[mask]``, ``nonzero``, ``masked_select``)
has no fixed size to budget: the recorder notes where the first one is made, and the capture
refuses the program with that place (:func:`check_static_sizes`).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

from hiremate.errors import GraphCaptureError
from hiremate.ir.graph import Op
from hiremate.graphbuilder.encode import encode_arg
from hiremate.graphbuilder.packed import read_batch_sizes
from hiremate.graphbuilder.traceable import TRACEABLE_FORMS
from hiremate.graphbuilder.opinfo import op_kind, qualified_name

log = logging.getLogger(__name__)

#: the Tensor methods that hand a tensor's value to Python
_CONCRETISING = {
    torch.Tensor.__bool__: bool, torch.Tensor.item: lambda t: t.item(),
    torch.Tensor.tolist: lambda t: t.tolist(), torch.Tensor.__int__: int,
    torch.Tensor.__float__: float, torch.Tensor.__index__: lambda t: t.__index__(),
}


@dataclass(frozen=True)
class Guard:
    """A value the trace was specialised on: ``ops`` compute it from the inputs named in
    ``inputs`` (placeholder name -> position among the model's tensor inputs)."""

    where: str
    value: Any
    inputs: dict[str, int]
    ops: tuple[Op, ...]
    result: str
    convert: str  # name of the Tensor method that asked for the value


class BranchRecorder(TorchFunctionMode):
    """Active during the joint trace; answers each request for a tensor's value (see the
    module docstring). ``placeholders`` says what each traced placeholder holds, in order:
    ``("input", i)`` for the i-th tensor input that needs no gradient, anything else for
    sources a branch must not depend on; ``real_inputs`` are the sample's tensors."""

    def __init__(self, placeholder_roles: list[tuple[str, int | None]],
                 real_inputs: list[torch.Tensor], model: torch.nn.Module):
        super().__init__()
        self.roles = placeholder_roles
        self.real_inputs = real_inputs
        self.model = model
        self.guards: list[Guard] = []
        #: where the first tensor of a value-dependent size was made, and by which function
        self.sized_by_values: tuple[str, str] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handled, value = read_batch_sizes(func, args)
        if handled:
            return value
        traceable = TRACEABLE_FORMS.get(func)
        if traceable is not None:
            out = traceable(self._value_of, *args, **kwargs)
        elif func in _CONCRETISING and args and isinstance(args[0], torch.Tensor):
            return self._value_of(args[0], func)
        else:
            out = func(*args, **kwargs)
        if self.sized_by_values is None and _sized_by_values(out):
            self.sized_by_values = (_user_frame(), getattr(func, "__name__", str(func)))
        return out

    def _value_of(self, tensor: torch.Tensor, func: Any = torch.Tensor.tolist) -> Any:
        """``func`` of ``tensor`` (a Tensor method that hands its value to Python; ``tolist`` by
        default), guarded when the tensor is traced; a real constant answers as it is."""
        mode = get_proxy_mode()
        if mode is None:
            return func(tensor)
        try:
            node = get_proxy_slot(tensor, mode.tracer).proxy.node
        except (KeyError, AttributeError, RuntimeError):  # not a traced value: a real constant
            return func(tensor)
        return self._specialise(node, func, mode.tracer)

    def _specialise(self, node: torch.fx.Node, func: Any, tracer: Any) -> Any:
        graph, root = tracer.graph, tracer.root
        where = _user_frame()
        order = {n: i for i, n in enumerate(graph.nodes)}
        needed = sorted(_ancestors(node), key=order.__getitem__)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        role = {ph.name: r for ph, r in zip(placeholders, self.roles)}
        asked = qualified_name(node.target) if node.op == "call_function" else node.name
        for n in needed:
            if n.op == "call_function" and op_kind(n.target).random:
                raise GraphCaptureError(self._random_message(where, n))
            if n.op == "placeholder" and role.get(n.name, ("?", None))[0] != "input":
                raise GraphCaptureError(_changing_value_message(
                    func, asked if n is not node else "", where, role.get(n.name)))
        inputs = {n.name: role[n.name][1] for n in needed if n.op == "placeholder"}
        with _disable_current_modes():  # a constant's value read under the tracer is symbolic
            ops = tuple(_record(n, root) for n in needed if n.op == "call_function")
        value = self._evaluate(needed, node, inputs, func, root)
        guard = Guard(where, value, inputs, ops, node.name, func.__name__)
        self.guards.append(guard)
        log.warning("specialised the capture on a value computed from the inputs at %s "
                    "(%s = %r); later calls are checked against it", where, asked, value)
        return value

    def _evaluate(self, needed: list[torch.fx.Node], node: torch.fx.Node,
                  inputs: dict[str, int], func: Any, root: torch.nn.Module) -> Any:
        """The asked value on the sample's real tensors, computed outside every tracing mode."""
        sub = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        for n in needed:
            env[n] = sub.node_copy(n, lambda a: env[a])
        sub.output(env[node])
        module = torch.fx.GraphModule(root, sub)
        real = [self.real_inputs[inputs[n.name]] for n in needed if n.op == "placeholder"]
        with _disable_current_modes(), torch.no_grad():
            tensor = module(*real)
            return _CONCRETISING[func](tensor)

    def _random_message(self, where: str, node: torch.fx.Node) -> str:
        config = getattr(self.model, "config", None)
        hint = ""
        if getattr(config, "layerdrop", 0) or "layerdrop" in where.lower():
            hint = (" This is Hugging Face LayerDrop (a random skip of whole layers): set "
                    "layerdrop=0 in the model's config (e.g. "
                    f"{type(config).__name__}(..., layerdrop=0.0)) to train it with hiremate.")
        return (f"the forward branches on a random value ({qualified_name(node.target)}) at "
                f"{where}: each call would run another program, which no single schedule "
                f"can follow.{hint}")


def _ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def _record(node: torch.fx.Node, root: torch.nn.Module) -> Op:
    """``node`` as an :class:`Op`, with the traced constants it reads recorded by value."""
    def constant(a: torch.fx.Node) -> Any:
        return getattr(root, a.target) if a.op == "get_attr" else a

    args = torch.fx.node.map_arg(node.args, constant)
    kwargs = torch.fx.node.map_arg(node.kwargs, constant)
    return Op(target=qualified_name(node.target), args=tuple(encode_arg(a) for a in args),
              kwargs=tuple((k, encode_arg(v)) for k, v in kwargs.items()), out=node.name)


def guard_to_dict(guard: Guard) -> dict[str, Any]:
    """A guard as JSON-ready data, for the graph's meta."""
    from hiremate.ir.graph import op_to_dict

    return {"where": guard.where, "value": guard.value, "inputs": guard.inputs,
            "ops": [op_to_dict(o) for o in guard.ops], "result": guard.result,
            "convert": guard.convert}


def _changing_value_message(func: Any, asked: str, where: str,
                            role: tuple[str, int | str | None] | None) -> str:
    """Why the forward cannot ask for a value that depends on ``role`` (a placeholder that is
    not an input the executor can check per call), and what to write instead."""
    kind, name = role if role else ("?", None)
    source = {"param": f"the parameter {name!r}", "buffer": f"the buffer {name!r}",
              "grad_input": "an input that needs a gradient",
              "tangent": "an output's gradient"}.get(kind, "a value hiremate cannot check per call")
    call = {"__bool__": "", "__int__": "int()", "__float__": "float()", "__index__": "an index",
            "item": ".item()", "tolist": ".tolist()"}.get(func.__name__, func.__name__)
    asking = (f"reads the value of a tensor into Python ({call})" if call else
              "branches on the value of a tensor")
    of = f" ({asked})" if asked else ""
    if kind == "buffer":
        why = ("a buffer may change from one call to the next (a step counter, a queue's "
               "position), and a captured program keeps the value it had at the build. Keep "
               "the value in a tensor (index with a tensor: index_copy, torch.where, "
               "masking), or keep that step outside the wrapped model")
        if str(name).endswith("num_batches_tracked"):
            why = ("this is a BatchNorm with momentum=None (a cumulative average of the "
                   "batches' statistics), which divides by its batch count read into Python at "
                   "every call, and a captured program keeps the build's count. Give it a "
                   "momentum (torch's default is 0.1), or keep it outside the wrapped model")
    else:
        why = ("such a value changes as the model trains, and a traced program cannot "
               "follow a branch on it. Rewrite the branch without asking for the tensor's "
               "value (torch.where, masking), or keep it outside the wrapped model")
    return f"the forward {asking}{of} at {where}, and that value depends on {source}: {why}"


def _sized_by_values(value: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and free_unbacked_symbols(t)
               for t in torch.utils._pytree.tree_leaves(value))


def check_static_sizes(gm: torch.fx.GraphModule, made_at: tuple[str, str] | None) -> None:
    """Refuse a traced program with a tensor whose size depends on tensor values: the schedule's
    memory needs every size before it runs. The error names the op and where the model made
    the first such tensor (``made_at``: the line and the function, as
    :class:`BranchRecorder` saw it being made)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and _sized_by_values(node.meta.get("val")):
            where, func = made_at or ("a line the capture did not see", "")
            made_by = f"{func}, " if func else ""
            raise GraphCaptureError(
                f"the forward makes a tensor whose size depends on tensor values ({made_by}"
                f"{qualified_name(node.target)}) at {where}: boolean-mask indexing "
                "(x[mask]), nonzero, masked_select and unique make such tensors, and a "
                "captured program needs every size to plan its memory. Keep the size fixed "
                "(torch.where(mask, x, 0), or multiply by the mask), or keep that step outside "
                "the wrapped model")


#: path parts of frames that are not the model's own code (torch, hiremate, their plumbing)
_NOT_THE_MODELS = ("/torch/", "/hiremate/", "/graphbuilder/", "/contextlib.py", "/functools.py")


def _user_frame() -> str:
    """``file:line (code)`` of the innermost frame outside torch and hiremate: the model's own
    line that asked for the value."""
    for frame in reversed(traceback.extract_stack()):
        if not any(s in frame.filename for s in _NOT_THE_MODELS):
            return f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
    return "an unknown line"


def _data_dependent_kinds() -> tuple[type, ...]:
    """torch's errors for a value read from a traced tensor that no trace can know."""
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return (GuardOnDataDependentSymNode, DataDependentOutputException)


def failure_reason(exc: BaseException) -> str:
    """One line saying why a capture path failed (a GraphCaptureError's message is already
    written for the user and kept whole)."""
    text = str(exc).strip()
    if isinstance(exc, GraphCaptureError):
        return text
    reason = _data_dependent_reason(exc)
    if reason is not None:
        return reason
    first_line = text.splitlines()[0] if text else repr(exc)
    return f"{type(exc).__name__}: {first_line[:300]}"


def _data_dependent_reason(exc: BaseException) -> str | None:
    """What to tell the user when the trace stopped at a read of a traced tensor's value that
    :class:`BranchRecorder` did not see: one made inside a torch function (a check such as
    ``gaussian_nll_loss``'s on its variance, ``istft``'s on its window), where the recorder's
    mode is off. The line of the model that called it is read from the traceback; None when
    ``exc`` is not such an error."""
    if not isinstance(exc, _data_dependent_kinds()):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    user = max((i for i, f in enumerate(frames) if not any(s in f.filename for s in _NOT_THE_MODELS)
                and not f.filename.startswith("<eval_with_key>")), default=None)
    if user is None:
        where = "a line the capture did not see"
        inside = ""
    else:
        frame = frames[user]
        where = f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
        inside = ""
        for inner in frames[user + 1:]:  # the deepest public torch function on the way
            if "/torch/" not in inner.filename:
                continue
            parts = inner.filename.rsplit("/torch/", 1)[1].removesuffix(".py").split("/")
            if (not any(p.startswith("_") or p == "fx" for p in parts)
                    and parts[-2:] != ["modules", "module"]):  # not Module.__call__'s frames
                inside = f" inside torch.{'.'.join(parts)}.{inner.name}"
    text = str(exc).strip().splitlines()
    asked = text[0] if text and text[0].startswith("aten.") else "a condition on its values"
    return (f"the forward reads the value of a traced tensor ({asked}){inside}, called at "
            f"{where}: a traced program cannot follow a branch or a check on values computed "
            "in the model. Compute that step without reading the values (torch.where, "
            "masking), or keep it outside the wrapped model")
