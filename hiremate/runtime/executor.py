"""The executor: a schedule run as an ``nn.Module`` that autograd treats like any other.

One call is one application of a ``torch.autograd.Function`` (docs/design.md, "The executor"): its
forward runs the schedule up to the loss node and returns the model's outputs; its backward
runs the rest of the schedule and returns the gradients of the inputs and of the parameters,
so autograd accumulates ``.grad`` as usual, outputs can feed any further computation, and a
module can be called several times before one ``backward`` (HiRemate, appendix
C.2.2). What a call keeps between its two phases (the values the schedule holds at the loss
node and the RNG states) lives on the autograd context of that call, never on the module.

Usage::

    graph = hiremate.build_graph(model, sample)
    module = RematModule(model, graph, hiremate.autodiff_schedule(graph))
    loss = module(**sample).logits.sum()
    loss.backward()
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from hiremate.errors import (
    BackwardTwiceError,
    ConfigError,
    DoubleBackwardError,
    InputMismatchError,
    InvalidGraphError,
    ModelChangedError,
    ModifiedInPlaceError,
    OutputGradientError,
)
from hiremate.runtime.codegen import Program, generate, generate_inference
from hiremate.runtime.io import InputChecker, derive_output_spec
from hiremate.runtime.rng import CallState, generator_states
from hiremate.runtime import structure
from hiremate.runtime.grad_reach import tangents_reaching
from hiremate.ir.graph import DataKind, Graph
from hiremate.graphbuilder.capture import is_capturing
from hiremate.graphbuilder.encode import decode_arg
from hiremate.ir.schedule import Compute, Schedule
from hiremate.ir.simulator import SimulationResult, simulate
from hiremate.ir.sequence import complete_effects

log = logging.getLogger(__name__)


#: holds :func:`_untraced_call`'s function once made (a plain global, not a cache decorator:
#: Dynamo, tracing a compiled model that holds a wrapper, warns about cache wrappers)
_UNTRACED: list[Any] = []


def _untraced_call() -> Any:
    """``RematModule._run_call`` hidden from torch.compile: compiling a wrapper (or a model
    holding one) runs the schedule as it is, since its frees and reruns are what keep the step
    within its budget and a compiler free to fuse, reorder or deduplicate them would not keep
    them. Made once, by the first module built (outside any trace; capture has imported
    torch's compiler by then, which a plain ``import hiremate`` does not do, for a second)."""
    if not _UNTRACED:
        _UNTRACED.append(torch.compiler.disable(RematModule._run_call))
    return _UNTRACED[0]


class RematModule(torch.nn.Module):
    """Run ``schedule`` (a valid schedule of ``graph``, the CD-graph of ``model``) as a module.

    ``model`` supplies the parameters and buffers (read at every call, so optimizers and
    ``.to()`` work as usual); it is registered as the submodule ``model``. ``sample``
    (optional) is an input the model accepts; when given, the output structure is derived at
    construction instead of at the first call. ``on_mismatch`` says what to do when a call's
    inputs differ from those the graph was built for: ``"raise"`` (an
    :class:`InputMismatchError`), or a callable ``(args, kwargs, error) -> RematModule`` that
    builds a module for the new inputs (it is kept and reused for inputs of that signature;
    with ``max_others``, at most that many are kept, the least recently used evicted). A CPU
    training step at another intra-op thread count than the graph's build goes to such a
    module too, built at that count (with ``"raise"``: it runs here, after a warning).
    ``on_output_gradient`` serves a backward that reaches an output the graph gives no
    tangent (``meta["untangented_outputs"]``): a callable ``(args, kwargs, rng_states, inputs,
    params, grad_outputs, needs) -> gradients`` that differentiates the call again with every
    output (:meth:`hiremate.HRockmate`'s rebuilds for them); without it such a backward raises
    :class:`OutputGradientError`.
    """

    def __init__(self, model: torch.nn.Module, graph: Graph, schedule: Schedule, *,
                 sample: Any = None,
                 on_mismatch: str | Callable[[tuple, dict, InputMismatchError], "RematModule"]
                 = "raise", max_others: int | None = None,
                 on_output_gradient: Callable[..., list] | None = None):
        super().__init__()
        _untraced_call()  # made here, outside any trace
        if on_mismatch != "raise" and not callable(on_mismatch):
            raise ConfigError(f"on_mismatch must be 'raise' or a callable, got {on_mismatch!r}")
        if max_others is not None and (isinstance(max_others, bool) or
                                       not isinstance(max_others, int) or max_others < 1):
            raise ConfigError(f"max_others must be None or an integer >= 1, got {max_others!r}")
        self.model = model
        self._graph = graph
        self._schedule = tuple(complete_effects(graph, tuple(schedule)))
        # the simulator's validity rules include what the generated code needs (random nodes
        # first computed in the graph's order, every buffer write computed)
        self._predicted = simulate(graph, self._schedule).raise_if_invalid()
        meta = graph.meta
        self._param_names: list[str] = meta.get("param_names", [])
        self._frozen_names: list[str] = meta.get("frozen_names", [])
        self._buffer_names: list[str] = meta.get("buffer_names", [])
        self._input_rg: list[bool] = meta.get("input_requires_grad", [])
        self._tangent_for_output: list[int] = meta.get("tangent_for_output", [])
        self._out_values: list[Any] = meta.get("output_values", [])
        # read once: ``graph.meta`` is a copy, too slow for a check on every step; None on a
        # graph not built on the CPU
        self._built_threads: int | None = meta.get("cpu_threads")
        self._resolve_slots()
        self._check_shapes(graph)
        self._watch = structure.ModelWatch(model)  # the model as captured
        self._checker = InputChecker(graph)
        self._out_spec: Any = None
        self._programs: dict[torch.device, tuple[Program, Program]] = {}
        self._inference: dict[torch.device, Program] = {}
        self._on_mismatch = on_mismatch
        self._others: OrderedDict[Any, RematModule] = OrderedDict()  # least recent first
        self._max_others = max_others
        self._evicted: set[Any] = set()  # signatures whose module was evicted
        self._thrash_warned = False
        self._threads_warned = False
        # per returned gradient (parameters, then inputs), the tangents that reach it
        self._grad_reach = tangents_reaching(graph)
        # positions among the tensor outputs of those that carry a gradient (tangents)
        tensor_pos = {}
        for i, o in enumerate(self._out_values):
            if isinstance(o, str):
                tensor_pos[i] = len(tensor_pos)
        self._tangent_pos = [tensor_pos[i] for i in self._tangent_for_output]
        # differentiable outputs the backward is assumed not to reach (no tangent in the graph)
        self._untangented_pos = [tensor_pos[i] for i in meta.get("untangented_outputs", [])]
        self._on_output_gradient = on_output_gradient
        # a rerun for such an output needs the generators' states of the call's start when the
        # graph draws random numbers (counted: hiremate.ir.simulator.replay_state_bytes)
        self._replays_random = any(n.random for n in graph.nodes)
        self._consts = {i: decode_arg(o["const"], {}) for i, o in enumerate(self._out_values)
                        if not isinstance(o, str)}
        self._n_params = len(self._param_names)
        if sample is not None:
            args, kwargs = _normalise(sample)
            self._out_spec = derive_output_spec(model, args, kwargs, len(self._out_values))

    # -- public facts ----------------------------------------------------------------------
    @property
    def graph(self) -> Graph:
        return self._graph

    @property
    def schedule(self) -> Schedule:
        return self._schedule

    @property
    def predicted(self) -> SimulationResult:
        return self._predicted

    @property
    def variants(self) -> tuple["RematModule", ...]:
        """The modules ``on_mismatch`` built for other inputs, least recently used first."""
        return tuple(self._others.values())

    def generated_source(self, device: torch.device | str = "cpu") -> tuple[str, str]:
        """Text of the generated forward and backward programs (for reading and debugging)."""
        fwd, bwd = self._get_programs(torch.device(device))
        return fwd.source, bwd.source

    # -- sources ---------------------------------------------------------------------------
    def _slots(self, names: list[str], kind: str) -> list[tuple[dict, str]]:
        """``(owner's _parameters or _buffers dict, attribute)`` of each name: a call reads
        each tensor with one dict lookup (``get_parameter`` walks the module path, which
        costs more than some ops), and still sees a parameter replaced after construction."""
        slots = []
        for name in names:
            prefix, _, attr = name.rpartition(".")
            owner = self.model.get_submodule(prefix)
            table = owner._parameters if kind == "param" else owner._buffers
            if table.get(attr) is None:
                raise InvalidGraphError(
                    f"the model has no {'parameter' if kind == 'param' else 'buffer'} {name!r} "
                    "that the graph names; build the graph from this model"
                )
            slots.append((table, attr))
        return slots

    def _check_shapes(self, graph: Graph) -> None:
        """Raise :class:`InvalidGraphError` when a parameter or buffer of the model has another
        shape or dtype than the graph's: the graph is of another model (a ``from_graph`` or
        ``RematModule`` given a graph built elsewhere), whose program would run on these."""
        for kind, names, tensors in (
                (DataKind.PARAM, self._param_names + self._frozen_names,
                 self._lookup(self._param_slots + self._frozen_slots)),
                (DataKind.BUFFER, self._buffer_names, self._lookup(self._buffer_slots))):
            nodes = [d for d in graph.data if d.kind is kind]
            if len(nodes) != len(names):  # not a graph of this builder's layout: nothing to pair
                continue
            for name, node, t in zip(names, nodes, tensors):
                if t is None:
                    continue
                dtype = str(t.dtype).removeprefix("torch.")
                if tuple(t.shape) != tuple(node.shape) or dtype != node.dtype:
                    raise InvalidGraphError(
                        f"the model's {kind.value} {name!r} is {tuple(t.shape)} {dtype} but the "
                        f"graph was captured with {tuple(node.shape)} {node.dtype}: the graph is "
                        "of another model; build it from this one")

    def _resolve_slots(self) -> None:
        self._param_slots = self._slots(self._param_names, "param")
        self._frozen_slots = self._slots(self._frozen_names, "param")
        self._buffer_slots = self._slots(self._buffer_names, "buffer")

    @property
    def captured_fingerprint(self) -> tuple:
        """The :func:`~hiremate.runtime.structure.fingerprint` of the model this module was
        made for."""
        return self._watch.fingerprint

    def model_change(self) -> str | None:
        """What changed in the model since the graph was captured (modules added, removed or
        with other settings; parameters or buffers of other shapes), or None
        (:class:`hiremate.runtime.structure.ModelWatch`). A module replaced by an equal one (a
        head of the same shape) is read from its new owner from then on."""
        return self._watch.change(on_same=self._resolve_slots)

    def _lookup(self, slots: list[tuple[dict, str]]) -> list[torch.Tensor]:
        return [table[attr] for table, attr in slots]

    def _get_programs(self, device: torch.device) -> tuple[Program, Program]:
        progs = self._programs.get(device)
        if progs is None:
            progs = generate(self._graph, self._schedule, device)
            self._programs[device] = progs
            log.debug("generated programs for %s on %s", self._graph, device)
        return progs

    def _get_inference(self, device: torch.device) -> Program:
        prog = self._inference.get(device)
        if prog is None:
            prog = generate_inference(self._graph, device)
            self._inference[device] = prog
        return prog

    # -- call --------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if is_capturing():  # inside another wrapper's capture: the model's own ops are recorded
            return self.model(*args, **kwargs)
        return self._call(args, kwargs, flat=False)

    def written_parameters(self) -> list[torch.Tensor]:
        """The parameters a call writes in place (``nn.Embedding``'s ``max_norm``), which a
        measurement puts back after each run."""
        written = set(self._graph.meta.get("mutated_buffers", ()))
        params = self._lookup(self._param_slots) + self._lookup(self._frozen_slots)
        return [p for name, p in zip(self._param_names + self._frozen_names, params)
                if name in written]

    def call_flat(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        """The call's tensor outputs in the graph's order (what the autograd function returns;
        a call puts them back in the model's output structure)."""
        return self._call(args, kwargs, flat=True)

    def _call(self, args: tuple, kwargs: dict, flat: bool) -> Any:
        return _untraced_call()(self, args, kwargs, flat)

    def _run_call(self, args: tuple, kwargs: dict, flat: bool) -> Any:
        change = self.model_change()
        if change is not None:
            raise ModelChangedError(
                f"the model changed after its graph was captured ({change}): this module "
                "would run the old program; build it again from the changed model (HRockmate "
                "does so by itself)")
        leaves, spec = pytree.tree_flatten((args, kwargs))
        try:
            inputs = self._checker.check(leaves, spec)
        except InputMismatchError as err:
            if self._on_mismatch == "raise":
                raise
            return self._other(leaves, spec, args, kwargs, err)._call(args, kwargs, flat)
        if self._out_spec is None:
            self._out_spec = derive_output_spec(self.model, args, kwargs, len(self._out_values))
        params = self._lookup(self._param_slots)
        frozen = self._lookup(self._frozen_slots)
        buffers = self._lookup(self._buffer_slots)
        device = params[0].device if params else (inputs[0].device if inputs else
                                                   torch.device("cpu"))
        for i, t in enumerate(inputs):
            if t.device != device:
                raise InputMismatchError(
                    f"input {self._checker.paths[i]} is on {t.device} but the parameters are "
                    f"on {device}; move the inputs to {device}"
                )
        training = torch.is_grad_enabled() and (
            any(p.requires_grad for p in params) or any(t.requires_grad for t in inputs))
        if torch.is_grad_enabled() and any(f.requires_grad for f in frozen):
            unfrozen = [n for n, f in zip(self._frozen_names, frozen) if f.requires_grad]
            raise InputMismatchError(
                f"parameters frozen when the graph was built need a gradient now "
                f"({', '.join(unfrozen[:3])}{', ...' if len(unfrozen) > 3 else ''}); the graph "
                "computes none for them: build the graph again (HRockmate does so by itself)")
        if training:
            other_threads = self._other_threads(device)
            if other_threads is not None:
                return self._other(leaves, spec, args, kwargs, other_threads)._call(
                    args, kwargs, flat)
            # what a backward that reaches an untangented output needs to run the call again
            replay = ((args, kwargs, generator_states(_cuda_index(device))
                       if self._replays_random else None)
                      if self._untangented_pos else None)
            run = _Run(self, device, frozen, buffers, replay)
            outs = _RematFunction.apply(run, len(inputs), *inputs, *params)
        else:
            prog = self._get_inference(device)
            call = CallState(_cuda_index(device))
            with _as_captured(device):
                outs, _ = prog.fn(call, None, inputs, params, frozen, buffers, ())
        return tuple(outs) if flat else self._rebuild(outs)

    def _other(self, leaves: list, spec: Any, args: tuple, kwargs: dict,
               why: InputMismatchError) -> "RematModule":
        """The module ``on_mismatch`` built for this call's inputs and, on a CPU graph, this
        intra-op thread count (built now when none is kept; ``why`` says why this module does
        not serve the call)."""
        threads = torch.get_num_threads() if self._built_threads is not None else None
        key = (self._checker.signature(leaves, spec), threads)
        other = self._others.get(key)
        if other is not None:
            self._others.move_to_end(key)
            return other
        if key in self._evicted and not self._thrash_warned:
            log.warning("inputs of more shapes than the %d modules kept (max_shapes) come in "
                        "turn, so each evicted shape is captured again when it returns; raise "
                        "max_shapes, or pad the inputs to a few fixed shapes (sequence lengths "
                        "in buckets)", self._max_others)
            self._thrash_warned = True
        other = self._on_mismatch(args, kwargs, why)
        self._others[key] = other
        while self._max_others is not None and len(self._others) > self._max_others:
            old_key, _ = self._others.popitem(last=False)
            self._evicted.add(old_key)
            log.info("evicted the module built for inputs %s (least recently used; at most %d "
                     "kept)", old_key, self._max_others)
        return other

    def _other_threads(self, device: torch.device) -> InputMismatchError | None:
        """Why a CPU training step at another intra-op thread count than the graph was built
        at is not this module's to run: CPU convolutions take scratch of another size then
        (oneDNN's per-thread buffers), which the schedule's memory does not count. With
        ``on_mismatch`` a callable, the step goes to a module built at its thread count, as
        for new inputs; with ``"raise"``, it runs here after a warning (once)."""
        if device.type != "cpu" or (self._threads_warned and self._on_mismatch == "raise"):
            return None
        built, now = self._built_threads, torch.get_num_threads()
        if built is None or built == now:
            return None
        if self._on_mismatch != "raise":
            return InputMismatchError(
                f"this module's graph was built at {built} intra-op threads and the step runs "
                f"at {now}: CPU kernels such as convolutions take scratch of another size then")
        self._threads_warned = True
        log.warning("this module's graph was built at %d intra-op threads and runs at %d: "
                    "CPU kernels such as convolutions may take scratch of another size, so the "
                    "peak may differ from the one solved for; build it at the thread count "
                    "you train with (torch.set_num_threads before HRockmate)", built, now)
        return None

    def _untangented_backward(self, run: "_Run", inputs: list, params: list,
                              grad_outputs: tuple, needs: tuple) -> list:
        """Gradients of a call whose backward reached an output the graph gives no tangent
        (``on_output_gradient``, see the class docstring)."""
        names = [v for v in self._out_values if isinstance(v, str)]  # the tensor outputs'
        reached = [names[pos] for pos in self._untangented_pos if grad_outputs[pos] is not None]
        if self._on_output_gradient is None or run.replay is None:
            raise OutputGradientError(
                f"the backward reached output(s) {reached} of this module, but its graph was "
                "captured to be differentiated from its scalar outputs only (the loss); "
                "capture it with output_gradients='all' (HRockmate does so by itself)")
        args, kwargs, states = run.replay
        return self._on_output_gradient(args, kwargs, states, inputs, params, grad_outputs,
                                        needs)

    def _rebuild(self, outs: tuple[torch.Tensor, ...]) -> Any:
        flat: list[Any] = []
        it = iter(outs)
        for i, o in enumerate(self._out_values):
            flat.append(next(it) if isinstance(o, str) else self._consts[i])
        return pytree.tree_unflatten(flat, self._out_spec)

    def __getstate__(self) -> dict:
        # generated functions do not pickle; they are made again on the first call
        state = self.__dict__.copy()
        state["_programs"], state["_inference"] = {}, {}
        return state

    def extra_repr(self) -> str:
        return (f"graph={self._graph!r}, steps={len(self._schedule)}, "
                f"predicted_peak={self._predicted.peak}")


def differentiate_again(module: RematModule, args: tuple, kwargs: dict, states: tuple,
                        inputs: list, params: list, grad_outputs: tuple,
                        needs: tuple) -> list[torch.Tensor | None]:
    """Gradients of ``inputs`` and ``params`` (where ``needs`` says) for ``grad_outputs``,
    from ``module`` (a module of the same model and inputs whose graph gives every output a
    tangent) run again on ``args``/``kwargs`` from the generator ``states`` of the first run
    (None when it drew no random numbers), so that its random ops draw what they drew then;
    what the rerun writes (buffers) and draws is undone
    (:func:`hiremate.runtime.preserve.preserved`)."""
    from hiremate.runtime.preserve import preserved
    from hiremate.runtime.rng import set_generator_states

    wrt = [t for t, need in zip([*inputs, *params], needs) if need]
    with preserved(module.model), torch.enable_grad():
        if states is not None:  # the call drew random numbers: draw them again
            set_generator_states(_cuda_index(params[0].device if params else inputs[0].device),
                                 states)
        outs = module.call_flat(*args, **kwargs)
        pairs = [(o, g) for o, g in zip(outs, grad_outputs)
                 if g is not None and o.requires_grad]
        grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                         allow_unused=True)) if wrt else iter(())
        del outs, pairs
    return [next(grads) if need else None for need in needs]


def _as_captured(device: torch.device) -> Any:
    """Autocast off while a captured program runs: a capture under autocast recorded its casts
    and lower-precision ops, one without it recorded none, and either program must run as it
    was recorded (autocast would cast again what the backward expects in the captured dtype;
    ``HRockmate`` runs the plain model when the autocast of a call is not the capture's)."""
    return torch.autocast(device.type, enabled=False)


class _Run:
    """What one call's autograd function needs from its module (kept on the context)."""

    __slots__ = ("module", "device", "frozen", "buffers", "replay")

    def __init__(self, module: RematModule, device: torch.device, frozen: list, buffers: list,
                 replay: tuple | None = None):
        self.module = module
        self.device = device
        self.frozen = frozen
        self.buffers = buffers
        self.replay = replay  # (args, kwargs, generator states at the call's start) or None


class _RematFunction(torch.autograd.Function):
    """One call of a RematModule: forward phase in ``forward``, the rest in ``backward``."""

    @staticmethod
    def forward(ctx: Any, run: _Run, n_inputs: int, *tensors: torch.Tensor):
        module = run.module
        inputs, params = list(tensors[:n_inputs]), list(tensors[n_inputs:])
        fwd, _ = module._get_programs(run.device)
        call = CallState(_cuda_index(run.device))
        with _as_captured(run.device):
            outs, saved = fwd.fn(call, None, inputs, params, run.frozen, run.buffers, ())
        ctx.run = run
        ctx.state = (call, [saved], inputs, params)
        # tensors the caller can write in place before backward: inputs, parameters, and
        # outputs that the backward reads (as eager autograd, such a write is an error)
        watched = inputs + params + [o for o in outs if any(o is t for t in saved)]
        ctx.versions = (watched, [t._version for t in watched])
        ctx.set_materialize_grads(False)
        # the layout of the trace's tangent, made by zeros_like: the output's own strides, or
        # dense ones where the output overlaps itself (an expanded output) or has gaps
        ctx.out_meta = [(o.shape, o.dtype, torch.empty_like(o, device="meta").stride())
                        for o in outs]
        # the caller gets aliases, so that no returned tensor is referenced by the context
        results = tuple(o.detach() for o in outs)
        diff = set(module._tangent_pos) | set(module._untangented_pos)
        nondiff = [r for i, r in enumerate(results) if i not in diff or not r.is_floating_point()]
        if nondiff:
            ctx.mark_non_differentiable(*nondiff)
        return results

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor | None):
        if torch.is_grad_enabled():
            raise DoubleBackwardError(
                "a RematModule does not support double backward (create_graph=True, or "
                "torch.autograd.grad(..., create_graph=True)): its backward runs ATen "
                "gradient ops that are not themselves differentiated; compute higher-order "
                "gradients with the original model"
            )
        state = ctx.state
        if state is None:
            raise BackwardTwiceError(
                "the backward of a RematModule call ran a second time, but the first one was "
                "not told to keep the graph and freed what the call kept; pass "
                "retain_graph=True to the first backward, as eager PyTorch asks"
            )
        run = ctx.run
        keep = torch._C._autograd._get_current_graph_task_keep_graph()
        call, box, inputs, params = state
        if keep:
            # retain_graph=True: this backward runs on copies of the call's state, whose
            # values stay on the context for the next one (as eager autograd keeps its saved
            # tensors, so this backward's peak is above the schedule's)
            call = CallState(call.cuda_device, dict(call.rng), dict(call.snap))
            box = list(box)
        else:
            ctx.state = None
        watched, versions = ctx.versions
        if not keep:
            ctx.versions = None
        for t, v in zip(watched, versions):
            if t._version != v:
                raise ModifiedInPlaceError(
                    f"a tensor of shape {tuple(t.shape)} that the backward of a RematModule "
                    f"call needs (an input, a parameter or an output) was modified in place "
                    f"after the call (version {t._version} instead of {v}); call the module "
                    "again after the modification, or modify a copy"
                )
        module = run.module
        untangented = any(grad_outputs[pos] is not None for pos in module._untangented_pos)
        if untangented:
            box.clear()  # the call is differentiated again from its inputs: free what it kept
            del call, box, state
            grads = module._untangented_backward(run, inputs, params, grad_outputs,
                                                 ctx.needs_input_grad[2:])
            if not keep:
                run.replay = None
            return (None, None, *grads)
        del state
        _, bwd = module._get_programs(run.device)
        tangents = _tangents(module._tangent_pos, ctx.out_meta, grad_outputs, run.device)
        # tangents the loss reached (autograd gives None for outputs it did not use)
        live = {k for k, pos in enumerate(module._tangent_pos) if grad_outputs[pos] is not None}
        del grad_outputs
        with _as_captured(run.device):
            grads = bwd.fn(call, box, inputs, params, run.frozen, run.buffers, tangents)
        del tangents
        n_p = module._n_params
        reach = module._grad_reach
        param_grads = list(grads[:n_p])
        input_grads: list[torch.Tensor | None] = [None] * len(inputs)
        k = n_p
        for i, rg in enumerate(module._input_rg):
            if rg:
                g = grads[k]
                # None where no used output reaches the input, as eager autograd leaves it
                input_grads[i] = g if ctx.needs_input_grad[2 + i] and reach[k] & live else None
                k += 1
        for j in range(n_p):
            if not ctx.needs_input_grad[2 + len(inputs) + j] or not reach[j] & live:
                param_grads[j] = None
        return (None, None, *input_grads, *param_grads)


def _tangents(positions: list[int], out_meta: list, grad_outputs: tuple,
              device: torch.device) -> list[torch.Tensor]:
    """The gradients of the differentiable outputs, laid out like the outputs (a helper, so
    that no local variable keeps one alive once the backward program has freed it)."""
    tangents = []
    for pos in positions:
        g = grad_outputs[pos]
        shape, dtype, stride = out_meta[pos]
        if g is None:  # an output the loss did not use: a zero laid out as the trace's tangent
            g = torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()
        elif g.stride() != stride or g.dtype != dtype:
            # the traced backward ops assume the layout of the output (e.g. they view it);
            # an expanded or transposed incoming gradient is made dense like it
            dense = torch.empty_strided(shape, stride, dtype=dtype, device=g.device)
            dense.copy_(g)
            g = dense
        tangents.append(g)
    return tangents


def _cuda_index(device: torch.device) -> int | None:
    """Index of the CUDA generator to save and replay (None on other devices)."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def _normalise(sample: Any) -> tuple[tuple, dict]:
    from hiremate.graphbuilder.capture import normalise_sample

    return normalise_sample(sample)


__all__ = ["BackwardTwiceError", "DoubleBackwardError", "RematModule"]
