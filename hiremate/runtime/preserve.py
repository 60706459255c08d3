"""Leaving a model as the caller left it: parameters, buffers, gradients and the global RNG.

Building a wrapper runs the model for real more than once (cost measurement, the output
structure, calibration with :func:`hiremate.measure`), and a real run of a model in training
mode writes its buffers (BatchNorm's running statistics and ``num_batches_tracked``) and draws
from the global random generators (dropout). The wrapper promises (docs/design.md, "The executor") that
building never changes them: :func:`preserved` is the one place that keeps that promise, used
once around the whole build by :class:`hiremate.HRockmate` (and around every re-capture for a
new input shape), and around its runs by :func:`hiremate.measure`.

What is kept, and how:

- buffers: a copy of each one's value (buffers are small next to parameters), written back
  into the original tensor at exit when it changed, so references the caller holds stay
  valid;
- parameters: not copied (that would double the model's memory); nothing in a build writes
  them, and their version counters are checked at exit: a write is logged as an error;
- the tensor objects themselves: a parameter or buffer that a run replaced in its module's
  table (``functional_call`` with a submodule registered twice can leave a stand-in) is put
  back;
- ``.grad`` of every parameter, by reference;
- the CPU generator's state, and each CUDA device's when CUDA is initialised (reading a state
  from an uninitialised CUDA would initialise it, and nothing can have drawn from it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator

import torch

log = logging.getLogger(__name__)


class ModelState:
    """A snapshot of what :func:`preserved` restores (see the module docstring)."""

    def __init__(self, modules: Iterable[torch.nn.Module]):
        self._slots: list[tuple[dict, str, torch.Tensor]] = []
        seen_modules: set[int] = set()
        for root in modules:
            for m in root.modules():
                if id(m) in seen_modules:
                    continue
                seen_modules.add(id(m))
                for table in (m._parameters, m._buffers):
                    for name, t in table.items():
                        if t is not None:
                            self._slots.append((table, name, t))
        params: dict[int, torch.Tensor] = {}
        buffers: dict[int, torch.Tensor] = {}
        for table, _, t in self._slots:
            if isinstance(t, torch.nn.Parameter):
                params.setdefault(id(t), t)
            else:
                buffers.setdefault(id(t), t)
        self._params = list(params.values())
        self._param_versions = [p._version for p in self._params]
        self._grads = [p.grad for p in self._params]
        with torch.no_grad():
            self._buffers = [(b, b._version, b.detach().clone()) for b in buffers.values()]
        self._cpu_rng = torch.get_rng_state()
        self._cuda_rng = (torch.cuda.get_rng_state_all()
                          if torch.cuda.is_available() and torch.cuda.is_initialized() else None)

    def restore(self) -> None:
        """Put everything back; the parameters' values are checked, not restored."""
        for table, name, t in self._slots:
            # ``in`` and ``[]``, which a TorchScript module's tables have too (no ``get``)
            if (table[name] if name in table else None) is not t:
                table[name] = t
        with torch.no_grad():
            for b, version, saved in self._buffers:
                # a write that bypassed the version counter (through ``.data``) is caught by
                # the comparison; an unchanged buffer is not written, since a write would bump
                # its version and break a pending backward that saved it (BatchNorm in eval)
                if not _unchanged(b, version, saved):
                    b.copy_(saved)
        for p, g in zip(self._params, self._grads):
            if p.grad is not g:
                p.grad = g
        written = [tuple(p.shape) for p, v in zip(self._params, self._param_versions)
                   if p._version != v]
        if written:
            log.error("%d parameter(s) (shapes %s) were written in place while hiremate ran the "
                      "model; their values were not restored", len(written), written[:3])
        torch.set_rng_state(self._cpu_rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state_all(self._cuda_rng)


def _unchanged(buffer: torch.Tensor, version: int, saved: torch.Tensor) -> bool:
    """Whether ``buffer`` still holds ``saved``: its version, and for a dense tensor its values
    (``torch.equal`` has no kernel for sparse layouts, whose in-place writes bump the version)."""
    if buffer._version != version:
        return False
    return buffer.layout is not torch.strided or torch.equal(buffer, saved)


@contextlib.contextmanager
def preserved(*modules: torch.nn.Module) -> Iterator[ModelState]:
    """Run the body, then restore ``modules``' buffers, tensors and gradients and the global
    RNG states as they were on entry (also when the body raises)."""
    state = ModelState(modules)
    try:
        yield state
    finally:
        state.restore()


__all__ = ["ModelState", "preserved"]
