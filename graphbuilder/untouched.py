"""Real runs of the user's model during a build that leave its parameters and inputs as they
were, even when the forward writes into them in place.

A forward may write into a parameter (``nn.Embedding(max_norm=...)`` renormalises the rows it
reads) or into its input (``x /= 255``). The build runs the forward for real once, to read the
outputs' structure; without care that run applies the write to the user's tensors, so a build
that then refuses the write would still leave the model or the batch changed. Snapshotting
every parameter first would double the model's memory, so the snapshot is taken on the first
write only: a dispatch mode sees each ATen op that writes into an argument, and copies the
tensor that owns the storage before the op runs. On exit the copies are written back and the
version counters reset, so the tensors are as they were for autograd too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse or other layouts without one storage
        return None
    return storage.data_ptr() if storage.nbytes() else None


_set_versions = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)


class _CopyOnWrite(TorchDispatchMode):
    """Copies a guarded tensor (or the one whose storage a view shares) before an op writes it."""

    def __init__(self, guarded: list[torch.Tensor]) -> None:
        super().__init__()
        self.owners: dict[int, torch.Tensor] = {}
        for t in guarded:
            key = _storage_key(t)
            if key is not None:
                self.owners.setdefault(key, t)
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)  # a higher-order op has none: it runs as is
        for i, arg in enumerate(schema.arguments if schema is not None else ()):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor):
                    self._save(t)
        return func(*args, **kwargs)

    def _save(self, written: torch.Tensor) -> None:
        key = _storage_key(written)
        owner = self.owners.get(key) if key is not None else None
        if owner is None or key in self.saved:
            return
        with torch.no_grad():
            # below the mode already: the copy is not dispatched here again
            self.saved[key] = (owner, owner.detach().clone(), owner._version)

    def restore(self) -> None:
        for owner, copy, version in self.saved.values():
            put_back(owner, copy, version)
        self.saved.clear()


def put_back(tensor: torch.Tensor, copy: torch.Tensor, version: int) -> None:
    """Write ``copy`` into ``tensor`` and set its version counter back to ``version``, so that
    autograd sees it as never written."""
    with torch.no_grad():
        tensor.data.copy_(copy)
    if _set_versions is not None:
        _set_versions((tensor,), (version,))


@contextlib.contextmanager
def writes_undone(tensors: list[torch.Tensor]) -> Iterator[None]:
    """Run the body; whatever it wrote into ``tensors`` in place is put back on exit (with
    none, the body runs without the watch)."""
    mode = _CopyOnWrite([t for t in tensors if isinstance(t, torch.Tensor)])
    if not mode.owners:
        yield
        return
    try:
        with mode:
            yield
    finally:
        mode.restore()


__all__ = ["put_back", "writes_undone"]
