"""``build_graph``: from a PyTorch model and a sample to a measured CD-graph."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._prims_common import is_non_overlapping_and_dense_or_false

from hiremate.errors import ConfigError, GraphCaptureError, HiremateError
from hiremate.ir.graph import Graph
from hiremate.graphbuilder.assemble import assemble
from hiremate.graphbuilder.capture import capture, capturing, normalise_sample
from hiremate.graphbuilder.costs import check_cost_model, op_costs, resolve_cost_model
from hiremate.graphbuilder.costs.memory import ViewsNeedCopies
from hiremate.graphbuilder.functionalise import copy_before_views
from hiremate.graphbuilder.grouping import group_joint
from hiremate.graphbuilder.guards import guard_to_dict
from hiremate.graphbuilder.opinfo import op_kind

log = logging.getLogger(__name__)


def check_model(model: Any, caller: str) -> None:
    """Refuse what no capture can run: an object that is not a module, and a module whose
    parameters or buffers are on the meta device (shapes without values, as
    ``torch.device("meta")`` or an empty-weights loader leaves them)."""
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{caller} takes a torch.nn.Module, got {type(model).__name__}; wrap "
                          "a function in a module whose forward calls it")
    on_meta = [name for name, t in (*model.named_parameters(), *model.named_buffers())
               if t.is_meta]
    if on_meta:
        raise GraphCaptureError(
            f"the model's {on_meta[0]!r} ({len(on_meta)} tensor(s) in all) is on the meta "
            "device: it has a shape but no values to run. Materialise the model first "
            "(model.to_empty(device=...) and initialise it, or load its weights)")


def build_graph(model: torch.nn.Module, sample: Any, cost_model: str = "auto",
                repeats: int = 7, cache_dir: str | None = None,
                output_gradients: str = "all") -> Graph:
    """Capture ``model`` on ``sample`` (a tensor, a tuple of positional arguments or a dict of
    keyword arguments) as a CD-graph with measured times and memory sizes.

    ``cost_model`` decides the node times (:mod:`hiremate.graphbuilder.costs`): ``"auto"``
    (``measured`` on a GPU, the machine's fitted ``roofline`` on the CPU), ``"measured"`` (each
    unique op timed over ``repeats`` interleaved rounds), ``"flops"`` (fixed constants, the same
    on every machine) or ``"roofline"``. Temporary memory is measured in one run under all of
    them. ``cache_dir`` keeps the roofline fit (default ``$HIREMATE_CACHE``).
    ``output_gradients``: which differentiable outputs the backward starts from, ``"all"`` or
    ``"scalars"`` (:data:`~hiremate.graphbuilder.capture.OUTPUT_GRADIENTS`); the others are
    listed in ``meta["untangented_outputs"]``.
    """
    check_model(model, "build_graph")
    check_cost_model(cost_model)
    _check_devices(model, sample)
    start = time.perf_counter()
    with capturing():
        cap = capture(model, sample, output_gradients)
    t_capture = time.perf_counter() - start
    device = _device(model, sample)
    try:
        grouping, costs = _grouped_and_costed(cap, model, sample, device, cost_model, repeats,
                                              cache_dir)
    except ViewsNeedCopies as relaid:  # the real run's layouts: those views copy, once
        copy_before_views(cap.gm, relaid.names)
        grouping, costs = _grouped_and_costed(cap, model, sample, device, cost_model, repeats,
                                              cache_dir)
    meta = {
        "model": type(model).__name__,
        "capture_path": cap.path,
        "cost_model": resolve_cost_model(cost_model, _device(model, sample)),
        # of the ops' summed time, the part that is the in-situ share (``measured`` costs):
        # near 1 the step is bound by launches and dispatch, not by the ops' own work
        "in_situ_share": _in_situ_share(costs),
        "device": str(_device(model, sample)),
        # a saved CPU generator state (what the executor keeps to rerun a random op); on a GPU
        # the states live in host memory, outside the device's budget
        "rng_state_bytes": (torch.get_rng_state().numel() if _device(model, sample).type == "cpu"
                            else 0),
        "param_names": cap.param_names,
        "frozen_names": cap.frozen_names,
        "buffer_names": cap.buffer_names,
        "input_paths": cap.input_paths,
        "input_requires_grad": cap.input_requires_grad,
        "tangent_for_output": cap.tangent_for_output,
        "n_outputs": cap.n_outputs,
        "joint_ops": sum(1 for n in cap.gm.graph.nodes if n.op == "call_function"),
        "guards": [guard_to_dict(g) for g in cap.guards],
    }
    if cap.untangented_outputs:  # left out otherwise, so that other graphs keep their key
        meta["untangented_outputs"] = cap.untangented_outputs
    constants = input_constants(sample)
    if constants:  # left out otherwise, so that graphs of tensor-only calls keep their key
        meta["input_constants"] = constants
    if device.type == "cpu":  # left out on a GPU, whose kernels' scratch does not follow it
        # a CPU convolution's scratch depends on the intra-op threads (oneDNN's per-thread
        # buffers): a step at another count is built for it (HRockmate) or warned about
        # (an executor built alone)
        meta["cpu_threads"] = torch.get_num_threads()
    cast = autocast_dtype(device.type)
    if cast is not None:  # left out otherwise, so that graphs captured without it keep their key
        meta["autocast"] = cast
    graph = assemble(cap, grouping, costs, meta)
    log.info("built %r in %.2fs (capture %.2fs)", graph, time.perf_counter() - start, t_capture)
    return graph


def _grouped_and_costed(cap: Any, model: torch.nn.Module, sample: Any, device: torch.device,
                        cost_model: str, repeats: int, cache_dir: str | None) -> tuple[Any, Any]:
    """The grouping of ``cap``'s program and its ops' costs (one real run)."""
    grouping = _grouped(cap, model)
    # the program's ops carry the casts of an autocast active at capture: measured as recorded
    with torch.autocast(device.type, enabled=False):
        costs = op_costs(cap.gm, _real_inputs(model, sample, cap), cost_model, repeats,
                         cache_dir=cache_dir,
                         param_grads=[g for g in grouping.grads[:len(cap.param_names)] if g])
    return grouping, costs


def input_constants(sample: Any) -> list[list[Any]]:
    """``[key path, value]`` of every plain constant (``None``, a bool, int, float or string)
    among the sample's arguments: the capture bakes each into the program (``x * scale``), so a
    call with another value must not run it. Other objects cannot be compared reliably and are
    left out (their repr may hold an address)."""
    args, kwargs = normalise_sample(sample)
    leaves, _ = pytree.tree_flatten_with_path((args, kwargs))
    return [[pytree.keystr(path), value] for path, value in leaves if plain_constant(value)]


def plain_constant(value: Any) -> bool:
    """Whether ``value`` is a constant compared by value (None, a bool, int, float or string):
    what :func:`input_constants` records and the executor's input check compares."""
    return value is None or type(value) in (bool, int, float, str)


def autocast_dtype(device_type: str) -> str | None:
    """The dtype autocast casts to on ``device_type`` now (``"bfloat16"``), None when it is off:
    a capture records the casts of the autocast active at capture, so the graph is that
    autocast's program, and a call under another one would compute something else."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")


def _in_situ_share(costs: dict[str, Any]) -> float:
    """The in-situ share of the ops' summed time (0 without time or under other cost models)."""
    total = sum(c.time for c in costs.values())
    return round(sum(c.in_situ for c in costs.values()) / total, 6) if total > 0 else 0.0


def _device(model: torch.nn.Module, sample: Any) -> torch.device:
    for p in model.parameters():
        return p.device
    for t in pytree.tree_leaves(sample):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _grouped(cap: Any, model: torch.nn.Module) -> Any:
    """:func:`group_joint` of the captured program. An error that is not hiremate's own comes
    from a traced construct the grouping does not handle: the user gets a capture error that
    says so (the original kept as its cause), not a bare ``KeyError``."""
    _check_parameters_are_inputs(cap, model)
    try:
        return group_joint(cap)
    except HiremateError:
        raise
    except Exception as exc:
        raise GraphCaptureError(
            f"hiremate traced {type(model).__name__} but could not group its program into "
            f"compute nodes ({type(exc).__name__}: {exc}); this is a hiremate bug: please "
            "report this model (the cause is chained below)") from exc


def _check_parameters_are_inputs(cap: Any, model: torch.nn.Module) -> None:
    """Refuse a program that reads a trainable parameter as a constant of its own.

    Why: the capture passes every parameter into the traced program, so a parameter the trace
    met any other way was used where the capture could not see it as the model's: inside a
    custom ``torch.autograd.Function`` whose backward runs the layer again and differentiates
    it by hand (Reformer's reversible layers, which also run their forward under
    ``no_grad``). Its gradient would then be lost (before, a bare ``KeyError`` in the
    grouping)."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    found = set()
    for node in cap.gm.graph.nodes:
        value = getattr(cap.gm, node.target, None) if node.op == "get_attr" else None
        if isinstance(value, torch.Tensor) and value.requires_grad:
            found.add(names.get(id(value), f"a tensor that needs a gradient ({node.target})"))
    if found:
        shown = ", ".join(sorted(found)[:3]) + (", ..." if len(found) > 3 else "")
        raise GraphCaptureError(
            f"{type(model).__name__} uses {len(found)} trainable parameters where the capture "
            f"cannot see them as its inputs ({shown}): typically inside a custom "
            "torch.autograd.Function that recomputes a layer in its own backward (Reformer's "
            "reversible layers), whose gradients hiremate cannot capture. Pass such tensors "
            "to the Function as arguments, or wrap a model without it")


def _check_devices(model: torch.nn.Module, sample: Any) -> None:
    devices = {p.device for p in model.parameters()}
    devices |= {t.device for t in pytree.tree_leaves(sample) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ConfigError(
            f"the model and the sample live on different devices ({sorted(map(str, devices))}); "
            "move them to one device first (model.to(device), sample.to(device))"
        )


def _real_inputs(model: torch.nn.Module, sample: Any, cap) -> list[Any]:
    """Real values for the joint graph's placeholders: parameters, buffer copies, inputs and
    random tangents (buffers are copied so that measuring leaves the model unchanged)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    args, kwargs = normalise_sample(sample)
    leaves = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
    gen = torch.Generator(device="cpu").manual_seed(0)
    tangents = []
    for ph in [n for n in cap.gm.graph.nodes if n.op == "placeholder"][-len(cap.tangent_for_output):]:
        val = ph.meta["val"]
        # laid out as the trace's tangent was (its output's strides: a transposed output's
        # gradient is transposed too), since the traced backward may view it accordingly
        tangent = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype,
                                      device=val.device)
        tangents.append(tangent.copy_(torch.randn(tuple(val.shape), generator=gen,
                                                  dtype=val.dtype)))
    written = _written_placeholders(cap.gm)
    names = [n.name for n in cap.gm.graph.nodes if n.op == "placeholder"]
    kept = [params[n].detach() for n in cap.param_names + cap.frozen_names]
    # a parameter the program writes (nn.Embedding's max_norm) is copied, as the buffers are
    kept = [p.clone() if names[i] in written else p for i, p in enumerate(kept)]
    return (kept + [buffers[n].detach().clone() for n in cap.buffer_names]
            + [_unshared(t) for t in leaves] + tangents)


def _written_placeholders(gm: torch.fx.GraphModule) -> set[str]:
    """Names of ``gm``'s placeholders that an op writes in place."""
    written = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            for i in op_kind(node.target).writes:
                arg = node.args[i] if i < len(node.args) else None
                if isinstance(arg, torch.fx.Node) and arg.op == "placeholder":
                    written.add(arg.name)
    return written


def _unshared(t: torch.Tensor) -> torch.Tensor:
    """An input for the costs' run: a copy, with the same strides, of one that needs no
    gradient (the program may write into it, as ``x /= 255`` does, and the caller's batch must
    stay as it was), so long as a copy can keep its layout (a dense one)."""
    if t.requires_grad or not is_non_overlapping_and_dense_or_false(t):
        return t.detach()
    return t.detach().clone(memory_format=torch.preserve_format)
