"""Budgets: what a user may write (bytes, a size with a unit, a fraction of autodiff's peak) and
the one integer number of bytes every solver works with.

A fraction is relative to the store-everything peak that :func:`hiremate.simulate` predicts for
:func:`hiremate.autodiff_schedule`, so "0.5" means "half of what eager PyTorch would use" on the
same graph and cost model, whatever the model's size.
"""

from __future__ import annotations

import math
import numbers

from hiremate.errors import ConfigError
from hiremate.ir.graph import Graph
from hiremate.ir.simulator import autodiff_schedule, simulate
from hiremate.units import parse_bytes


def autodiff_peak(graph: Graph) -> int:
    """Predicted peak of the store-everything schedule."""
    return simulate(graph, autodiff_schedule(graph)).peak


def resolve_budget(budget: int | float | str, graph: Graph | None = None,
                   reference: int | None = None) -> int:
    """Bytes for ``budget``: an int (bytes), a string with a unit (``"512MiB"``, ``"2GB"``) or a
    float in (0, 1] (that fraction of the autodiff peak of ``graph``, or of ``reference``)."""
    if isinstance(budget, bool) or budget is None:
        raise ConfigError(f"budget {budget!r} is not a memory size; give bytes (int), a size "
                          "with a unit ('512MiB') or a fraction of the autodiff peak (0.5)")
    if isinstance(budget, str):
        text = budget.strip()
        try:  # "0.5" written as a string is a fraction too
            value = float(text)
        except ValueError:
            value = None
        if value is not None and "." in text and 0 < value <= 1:
            return resolve_budget(value, graph, reference)
        out = parse_bytes(text)
        if out <= 0:
            raise ConfigError(f"budget {budget!r} must be positive")
        return out
    if isinstance(budget, numbers.Integral):
        if budget <= 0:
            raise ConfigError(f"budget {budget} bytes must be positive; give bytes (int), a size "
                              "with a unit ('512MiB') or a fraction in (0, 1] of the autodiff peak")
        return int(budget)
    if isinstance(budget, numbers.Real):
        value = float(budget)
        if math.isnan(value) or not 0 < value <= 1:
            raise ConfigError(
                f"budget {budget!r}: a float is a fraction of the autodiff peak and must lie in "
                "(0, 1]; give bytes as an int or a string with a unit ('512MiB') otherwise")
        if reference is None:
            if graph is None:
                raise ConfigError("a fractional budget needs the graph to measure the autodiff "
                                  "peak against")
            reference = autodiff_peak(graph)
        return max(1, int(math.floor(value * reference)))
    raise ConfigError(f"budget of type {type(budget).__name__} is not understood; give bytes "
                      "(int), a size with a unit ('512MiB') or a fraction (0.5)")
