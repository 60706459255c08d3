"""hiremate: train any PyTorch model within an activation-memory budget.

The pipeline: ``build_graph`` captures a CD-graph, partitioners group it, solvers schedule it,
and the executor runs the schedule as an ``nn.Module``. See DESIGN.md for the stages.
"""

from hiremate.errors import (
    ConfigError,
    GraphCaptureError,
    HiremateError,
    InfeasibleBudgetError,
    InputMismatchError,
    InvalidGraphError,
    InvalidScheduleError,
    SolverError,
)
from hiremate.ir.graph import ComputeNode, DataKind, DataNode, Graph, NodeKind, Op, Ref
from hiremate.ir.schedule import Compute, Delete, Schedule
from hiremate.ir.simulator import SimulationResult, autodiff_schedule, simulate
from hiremate.units import fmt_bytes, parse_bytes

__version__ = "0.1.0"


def build_graph(model, sample, **kwargs):
    """Capture ``model`` on ``sample`` as a :class:`Graph` (see ``hiremate.graphbuilder``)."""
    from hiremate.graphbuilder import build_graph as _build

    return _build(model, sample, **kwargs)


def measure(fn, *args, **kwargs):
    """Peak activation bytes and time of one forward+backward (see ``hiremate.runtime.measurement``)."""
    from hiremate.runtime.measurement import measure as _measure

    return _measure(fn, *args, **kwargs)


__all__ = [
    "Compute", "ComputeNode", "ConfigError", "DataKind", "DataNode", "Delete", "Graph",
    "GraphCaptureError", "HiremateError", "InfeasibleBudgetError", "InputMismatchError",
    "InvalidGraphError", "InvalidScheduleError", "NodeKind", "Op", "Ref", "Schedule",
    "SimulationResult", "SolverError", "autodiff_schedule", "build_graph", "fmt_bytes",
    "measure", "parse_bytes", "simulate",
    "HRockmate", "Config", "RematModule", "register_solver", "register_partitioner",
    "solve_graph", "load_config",
]

_LAZY = {
    "HRockmate": "hiremate.api", "Config": "hiremate.config",
    "register_solver": "hiremate.registry", "register_partitioner": "hiremate.registry",
    "RematModule": "hiremate.runtime.executor", "solve_graph": "hiremate.api",
    "load_config": "hiremate.config",
}


def __getattr__(name):
    """Lazy exports of the pipeline's public API (importing it loads the solvers)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hiremate' has no attribute {name!r}")
