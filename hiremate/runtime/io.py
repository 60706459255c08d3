"""Inputs and outputs of the executor: checking a call's inputs, and the output structure.

The graph records every tensor input (its pytree key path, shape and dtype) but not the
structure of the model's output (a tuple, a dict, a transformers ``ModelOutput``...), which is
a Python object; :func:`derive_output_spec` recovers it once by running the model on fake
tensors (nothing is computed, no random number is drawn, no buffer is written).
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any

import torch
import torch.utils._pytree as pytree

from hiremate.errors import InputMismatchError, InvalidGraphError
from hiremate.graphbuilder.build import plain_constant
from hiremate.ir.graph import DataKind, Graph

log = logging.getLogger(__name__)


class InputChecker:
    """Checks that a call's tensor inputs are those the graph was built for."""

    def __init__(self, graph: Graph):
        meta = graph.meta
        self.paths: list[str] = list(meta.get("input_paths", []))
        self.expected = [(tuple(d.shape), d.dtype) for d in graph.data if d.kind is DataKind.INPUT]
        if len(self.expected) != len(self.paths):
            raise InvalidGraphError(
                f"the graph has {len(self.expected)} input data nodes but its meta names "
                f"{len(self.paths)} input paths; rebuild the graph with hiremate.build_graph"
            )
        self._dtypes = [getattr(torch, dt, None) for _, dt in self.expected]
        self._requires_grad = [bool(rg) for rg in meta.get("input_requires_grad",
                                                            [False] * len(self.expected))]
        self._good_spec: Any = None
        self._tensor_pos: list[int] = []
        self.guards = [_RuntimeGuard(g) for g in meta.get("guards", [])]
        # plain constants of the sample, by key path; a path is ignored once a capture with
        # another value gave the same program (see ``ignore_constant``)
        self.constants: dict[str, Any] = {path: v for path, v in meta.get("input_constants", [])}
        self._constant_pos: list[tuple[int, str]] = []

    def signature(self, leaves: list[Any], spec: Any) -> Any:
        """A hashable key of the inputs' structure, shapes, dtypes, whether they need a gradient,
        the values of plain constants (those still checked), and of the values of the graph's
        guards on them (where the structure lets them be computed)."""
        grad = torch.is_grad_enabled()
        ignored = self.ignored()
        if ignored:  # leave out the values of arguments that do not change the program
            with_path, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(leaves, spec))
            leaves = [None if pytree.keystr(p) in ignored else v for p, v in with_path]
        shapes = tuple((tuple(t.shape), t.dtype, grad and t.requires_grad)
                       if isinstance(t, torch.Tensor)
                       else (type(t).__name__, _plain(t)) for t in leaves)
        values: tuple = ()
        if self.guards:
            tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
            try:
                values = tuple(repr(g.evaluate(tensors)) for g in self.guards)
            except Exception:  # noqa: BLE001 - inputs of another structure: no guard values
                values = ("unguarded",)
        return (str(spec), shapes, values)

    def check(self, leaves: list[Any], spec: Any) -> list[torch.Tensor]:
        """The tensor leaves in graph order; raise :class:`InputMismatchError` naming what
        differs (structure, shape or dtype) otherwise."""
        if spec != self._good_spec:
            self._check_structure(leaves, spec)
        tensors = [leaves[i] for i in self._tensor_pos]
        for i, t in enumerate(tensors):
            shape, dtype = self.expected[i]
            if t.shape != shape or t.dtype != self._dtypes[i]:
                what = []
                if tuple(t.shape) != shape:
                    what.append(f"shape {tuple(t.shape)} instead of {shape}")
                if t.dtype != self._dtypes[i]:
                    what.append(f"dtype {str(t.dtype).removeprefix('torch.')} instead of {dtype}")
                raise InputMismatchError(
                    f"input {self.paths[i]} has {' and '.join(what)}: the schedule was made "
                    "for the sample's shapes and dtypes; HRockmate captures and solves again "
                    "for new inputs unless configured with on_new_inputs='raise' (a "
                    "RematModule does so given on_mismatch=callable)"
                )
        for i, path in self._constant_pos:
            expected = self.constants.get(path, _IGNORED)
            if expected is not _IGNORED and not _same_constant(leaves[i], expected):
                error = InputMismatchError(
                    f"argument {path} is {leaves[i]!r} but the graph was captured with "
                    f"{expected!r}: the value is part of the captured program; HRockmate "
                    "captures and solves again for it unless configured with "
                    "on_new_inputs='raise' (and ignores the argument from then on if the "
                    "program comes out the same)")
                error.constant_path = path
                raise error
        if torch.is_grad_enabled():
            for i, t in enumerate(tensors):
                if t.requires_grad and not self._requires_grad[i]:
                    raise InputMismatchError(
                        f"input {self.paths[i]} requires grad, but the graph was built from a "
                        "sample where it did not, so the schedule computes no gradient for it; "
                        "HRockmate captures and solves again for such inputs unless configured "
                        "with on_new_inputs='raise' (then build it from a sample whose tensor "
                        "has requires_grad=True, or pass the input detached)"
                    )
        for guard in self.guards:
            guard.check(tensors)
        return tensors

    def _check_structure(self, leaves: list[Any], spec: Any) -> None:
        with_path, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(leaves, spec))
        pos = [i for i, (_, v) in enumerate(with_path) if isinstance(v, torch.Tensor)]
        paths = [pytree.keystr(with_path[i][0]) for i in pos]
        # every plain constant of the sample was recorded: one at another path is an argument
        # the sample did not pass (its value would be ignored), and a recorded one missing
        # takes the model's default instead of the value the program was captured with
        constants = {pytree.keystr(p) for p, v in with_path
                     if not isinstance(v, torch.Tensor) and plain_constant(v)}
        new_constants = sorted(constants - set(self.constants))
        lost_constants = [p for p, v in self.constants.items()
                          if v is not _IGNORED and p not in constants]
        if paths != self.paths or new_constants or lost_constants:
            missing = [p for p in self.paths if p not in paths]
            extra = [p for p in paths if p not in self.paths]
            detail = []
            if missing:
                detail.append(f"missing tensor input(s) {', '.join(missing)}")
            if extra:
                detail.append(f"unexpected tensor input(s) {', '.join(extra)}")
            if lost_constants:
                detail.append(f"missing argument(s) {', '.join(lost_constants)}")
            if new_constants:
                detail.append(f"argument(s) the sample did not pass {', '.join(new_constants)}")
            if not detail:
                detail.append(f"tensor inputs in the order {paths} instead of {self.paths}")
            raise InputMismatchError(
                f"the call's inputs differ from the sample the graph was built for: "
                f"{'; '.join(detail)} (paths are (args, kwargs) key paths); call the module "
                "with the same arguments as the sample"
            )
        self._good_spec = spec
        self._tensor_pos = pos
        self._constant_pos = [(i, pytree.keystr(p)) for i, (p, v) in enumerate(with_path)
                              if pytree.keystr(p) in self.constants]

    def ignore_constant(self, path: str) -> None:
        """Stop checking argument ``path``: another value of it gave the same program."""
        self.constants[path] = _IGNORED

    def ignored(self) -> set[str]:
        """The argument paths no longer checked."""
        return {path for path, v in self.constants.items() if v is _IGNORED}


#: marks a constant argument whose value does not change the captured program
_IGNORED = object()


def _plain(value: Any) -> Any:
    """A plain constant's value (part of a call's signature); None for other objects."""
    return value if plain_constant(value) else None


def _same_constant(value: Any, expected: Any) -> bool:
    if type(value) is not type(expected):
        return False
    if isinstance(value, float) and math.isnan(value) and math.isnan(expected):
        return True
    return value == expected


def derive_output_spec(model: torch.nn.Module, args: tuple, kwargs: dict, n_leaves: int) -> Any:
    """The pytree structure of ``model(*args, **kwargs)``, from a run on fake tensors (or, if
    the model cannot run on fake tensors, a no-grad run whose RNG and buffer effects are
    undone). The call is the one captured (:func:`~hiremate.graphbuilder.capture.training_call`)."""
    from hiremate.graphbuilder.capture import capturing, plain_checkpoints, training_call

    args, kwargs = training_call(model, args, kwargs)
    with plain_checkpoints(type(model).__name__, announce=False), capturing():
        try:
            spec = _fake_spec(model, args, kwargs)
        except Exception:  # noqa: BLE001 - any failure of fake tensors falls back to a real run
            log.debug("fake-tensor run failed; deriving the output structure eagerly",
                      exc_info=True)
            spec = _real_spec(model, args, kwargs)
    if spec.num_leaves != n_leaves:
        raise InvalidGraphError(
            f"the model returns {spec.num_leaves} output leaves but the graph has {n_leaves}; "
            "the graph was built for another model or other inputs"
        )
    return spec


def _fake_spec(model: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    state = {**dict(model.named_parameters(remove_duplicate=False)),
             **dict(model.named_buffers(remove_duplicate=False))}
    # functional_call does not put back every tensor of a submodule registered under two
    # names (checked, torch 2.13): restore them all, or fake tensors stay in the user's model
    held = [(m, table, name, t) for m in model.modules()
            for table in (m._parameters, m._buffers) for name, t in list(table.items())]
    try:
        with torch.no_grad():
            fake_state = {k: mode.from_tensor(v) for k, v in state.items()}
            fake_in = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
            # with autograd on: a forward may differentiate inside itself (a physics-informed
            # network's derivative of its output by its input), and fake tensors cost nothing
            with mode, torch.enable_grad():
                out = torch.func.functional_call(model, fake_state, fake_in[0], fake_in[1])
    finally:
        for m, table, name, t in held:
            if table.get(name) is not t:
                table[name] = t
    return pytree.tree_structure(out)


def _real_spec(model: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.is_cuda})
    try:
        with torch.random.fork_rng(devices=devices):
            try:
                with torch.no_grad():
                    out = model(*args, **kwargs)
            except RuntimeError:  # a forward that differentiates inside itself needs autograd
                log.debug("the forward failed without autograd; running it with autograd",
                          exc_info=True)
                out = model(*args, **kwargs)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return pytree.tree_structure(out)


class _RuntimeGuard:
    """A value the capture was specialised on (``graph.meta["guards"]``, made by
    ``hiremate.graphbuilder.guards``), recomputed from a call's inputs."""

    def __init__(self, data: dict[str, Any]):
        from hiremate.ir.graph import op_from_dict

        self.where: str = data["where"]
        self.value: Any = data["value"]
        self.inputs: dict[str, int] = dict(data["inputs"])
        self.ops = [op_from_dict(o) for o in data["ops"]]
        self.result: str = data["result"]
        self.convert: str = data["convert"]
        self._fns: list[Any] | None = None

    def evaluate(self, tensors: list[torch.Tensor]) -> Any:
        from hiremate.graphbuilder.encode import decode_arg
        from hiremate.graphbuilder.opinfo import resolve_target

        if self._fns is None:
            self._fns = [resolve_target(op.target) for op in self.ops]
        env: dict[str, Any] = {name: tensors[i] for name, i in self.inputs.items()}
        with torch.no_grad():
            for fn, op in zip(self._fns, self.ops):
                env[op.out] = fn(*decode_arg(op.args, env),
                                 **{k: decode_arg(v, env) for k, v in op.kwargs})
            value = env[self.result]
            if isinstance(value, torch.Tensor):
                value = getattr(value, self.convert)()
        return value

    def check(self, tensors: list[torch.Tensor]) -> None:
        value = self.evaluate(tensors)
        if value != self.value:
            raise InputMismatchError(
                f"the model branches on a value computed from its inputs at {self.where}: it "
                f"was {self.value!r} for the sample the schedule was captured on and is "
                f"{value!r} for this call, so the captured program does not apply; capture "
                "again with such inputs (HRockmate does this itself unless configured to "
                "raise), or make the branch independent of the values (torch.where)"
            )


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def in_sample_form(forward: Any, args: tuple, kwargs: dict,
                   positional: bool) -> tuple[tuple, dict]:
    """A call's arguments in the form of the sample's: all positional (``positional``) or all
    keyword, bound to ``forward``'s signature. ``model(x, mask=m)`` and ``model(x, m)`` are
    the same call to the model, but the captured program names its inputs by position or by
    keyword as the sample gave them. An argument omitted between two given ones takes its
    default. Calls that cannot be put in that form (a keyword-only argument in a positional
    sample, ``*args`` in a keyword one, or arguments the signature does not bind) are
    returned as they are, for the input check to name what differs."""
    if (not kwargs if positional else not args):
        return args, kwargs
    try:
        signature = inspect.signature(forward)
        given = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return args, kwargs
    params = signature.parameters
    if positional:
        names = [n for n, p in params.items() if p.kind in _POSITIONAL]
        if any(n not in names and params[n].kind is not inspect.Parameter.VAR_POSITIONAL
               for n in given):
            return args, kwargs
        last = max((i for i, n in enumerate(names) if n in given), default=-1)
        out = [given[n] if n in given else params[n].default for n in names[:last + 1]]
        for n in given:
            if params[n].kind is inspect.Parameter.VAR_POSITIONAL:
                out.extend(given[n])
        return tuple(out), {}
    out: dict[str, Any] = {}
    for n, value in given.items():
        kind = params[n].kind
        if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            return args, kwargs
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[n] = value
    return (), out


def positional_sample(graph: Graph, loss_captured: bool) -> bool:
    """Whether the model's sample was positional arguments (else keyword arguments), read off
    the key paths of the graph's inputs: ``[0]...`` or ``[1]['name']...`` of ``(args,
    kwargs)``, inside the loss step's first argument when the loss is captured."""
    prefix = "[0][0]" if loss_captured else "[0]"
    keyword = "[0][1]" if loss_captured else "[1]"
    paths = [p for p in graph.meta.get("input_paths", [])
             if p.startswith(prefix) or p.startswith(keyword)]
    return not paths or any(p.startswith(prefix) for p in paths)
