"""Inputs and outputs of the executor: checking a call's inputs, and the output structure.

The graph records every tensor input (its pytree key path, shape and dtype) but not the
structure of the model's output (a tuple, a dict, a transformers ``ModelOutput``...), which is
a Python object; :func:`derive_output_spec` recovers it once by running the model on fake
tensors (nothing is computed, no random number is drawn, no buffer is written).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.utils._pytree as pytree

from hiremate.errors import InputMismatchError, InvalidGraphError
from hiremate.graph import DataKind, Graph

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
        self._good_spec: Any = None
        self._tensor_pos: list[int] = []

    def signature(self, leaves: list[Any], spec: Any) -> Any:
        """A hashable key of the inputs' structure, shapes and dtypes."""
        return (str(spec), tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor)
                                 else type(t).__name__ for t in leaves))

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
                    "for the sample's shapes and dtypes; build a graph and schedule for these "
                    "inputs (or pass on_mismatch=callable to RematModule to do it on demand)"
                )
        return tensors

    def _check_structure(self, leaves: list[Any], spec: Any) -> None:
        with_path, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(leaves, spec))
        pos = [i for i, (_, v) in enumerate(with_path) if isinstance(v, torch.Tensor)]
        paths = [pytree.keystr(with_path[i][0]) for i in pos]
        if paths != self.paths:
            missing = [p for p in self.paths if p not in paths]
            extra = [p for p in paths if p not in self.paths]
            detail = []
            if missing:
                detail.append(f"missing tensor input(s) {', '.join(missing)}")
            if extra:
                detail.append(f"unexpected tensor input(s) {', '.join(extra)}")
            if not detail:
                detail.append(f"tensor inputs in the order {paths} instead of {self.paths}")
            raise InputMismatchError(
                f"the call's inputs differ from the sample the graph was built for: "
                f"{'; '.join(detail)} (paths are (args, kwargs) key paths); call the module "
                "with the same arguments as the sample"
            )
        self._good_spec = spec
        self._tensor_pos = pos


def derive_output_spec(model: torch.nn.Module, args: tuple, kwargs: dict, n_leaves: int) -> Any:
    """The pytree structure of ``model(*args, **kwargs)``, from a run on fake tensors (or, if
    the model cannot run on fake tensors, a no-grad run whose RNG and buffer effects are
    undone)."""
    try:
        spec = _fake_spec(model, args, kwargs)
    except Exception:  # noqa: BLE001 - any failure of fake tensors falls back to a real run
        log.debug("fake-tensor run failed; deriving the output structure eagerly", exc_info=True)
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
            with mode:
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
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            out = model(*args, **kwargs)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return pytree.tree_structure(out)
