"""What an ATen op does to storage: creates it, views it, or writes into it.

Decided from the op's schema (alias annotations), so that views and in-place writes can join
the compute node that owns the storage they touch (they allocate nothing of their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hiremate.errors import InvalidGraphError

#: ops that return a tensor sharing storage although their schema does not say so
_HIDDEN_VIEWS = {"aten::_unsafe_view", "aten::alias", "aten::lift_fresh"}
#: ops that write into arguments although their schema does not say so (the running
#: statistics of the legacy batch-norm kernels)
_HIDDEN_WRITES = {
    "aten::native_batch_norm": (3, 4),
    "aten::cudnn_batch_norm": (3, 4),
    "aten::miopen_batch_norm": (3, 4),
}
#: "*_like" factories that read only the metadata of their first argument, and the
#: plain factory that builds the same tensor from a shape
LIKE_FACTORIES = {
    "aten::zeros_like": "zeros",
    "aten::ones_like": "ones",
    "aten::empty_like": "empty",
    "aten::full_like": "full",
    "aten::rand_like": "rand",
    "aten::randn_like": "randn",
}


@dataclass(frozen=True)
class OpKind:
    """``view_of``: argument index whose storage the result shares (None if it allocates);
    ``inplace``: the result is argument ``view_of`` written in place; ``writes``: indices of
    arguments the op writes into; ``returns_views``: a list result made of views of arg 0."""

    view_of: int | None = None
    inplace: bool = False
    writes: tuple[int, ...] = ()
    returns_views: bool = False
    random: bool = False


def op_kind(target: Any) -> OpKind:
    """Classify an ``OpOverload`` by its schema."""
    if not isinstance(target, torch._ops.OpOverload):
        return OpKind()
    schema = target._schema
    writes = tuple(
        i for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )
    if target._overloadname == "default":
        writes = writes + _HIDDEN_WRITES.get(schema.name, ())
    random = torch.Tag.nondeterministic_seeded in target.tags
    returns = schema.returns
    if schema.name in _HIDDEN_VIEWS:
        return OpKind(view_of=0, writes=writes, random=random)
    if len(returns) == 1 and returns[0].alias_info is not None:
        alias = returns[0].alias_info
        base = _argument_with_set(schema, alias.before_set)
        if str(returns[0].type).startswith("List") or str(returns[0].type).endswith("[]"):
            return OpKind(returns_views=True, writes=writes, random=random)
        if base is not None:
            return OpKind(view_of=base, inplace=alias.is_write, writes=writes, random=random)
    return OpKind(writes=writes, random=random)


def _argument_with_set(schema: Any, alias_set: Any) -> int | None:
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.before_set == alias_set:
            return i
    return None


def schema_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    return getattr(target, "__name__", str(target))


def qualified_name(target: Any) -> str:
    """``"aten.mm.default"`` for ``torch.ops.aten.mm.default``; ``"getitem"`` for getitem."""
    if isinstance(target, torch._ops.OpOverload):
        ns, name = target._schema.name.split("::")
        return f"{ns}.{name}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def resolve_target(name: str) -> Any:
    """Inverse of :func:`qualified_name`, restricted to ``torch.ops`` and ``getitem``."""
    import operator

    if name == "getitem":
        return operator.getitem
    parts = name.split(".")
    if len(parts) != 3 or not all(p.replace("_", "a").isalnum() for p in parts):
        raise InvalidGraphError(f"{name!r} is not an operator name (namespace.op.overload, or "
                                "getitem); the graph was not written by hiremate's builder: "
                                "rebuild it with build_graph")
    ns, op, overload = parts
    return getattr(getattr(getattr(torch.ops, ns), op), overload)
