"""hiremate: train any PyTorch model within an activation-memory budget.

The pipeline: ``build_graph`` captures a CD-graph, partitioners group it, solvers schedule it,
and the executor runs the schedule as an ``nn.Module``. README.md describes the layout.

``import hiremate`` stays light: it loads the graph and schedule types, the simulator and the
errors, and none of torch, the solvers or the model zoo. The rest of the public API
(``HRockmate``, ``Config``, ``RematModule``, ``zoo``, ...) is imported on first use.
``__all__`` is the short list a user needs; the other names below stay importable.
"""

from hiremate.errors import (
    ConfigError,
    ExecutionError,
    GraphCaptureError,
    HiremateError,
    InfeasibleBudgetError,
    InputMismatchError,
    InvalidGraphError,
    InvalidScheduleError,
    SolverError,
)
# the names not in __all__ stay importable for existing code (hence the noqa)
from hiremate.ir.graph import (  # noqa: F401
    ComputeNode, DataKind, DataNode, Graph, NodeKind, Op, Ref,
)
from hiremate.ir.schedule import Compute, Delete, Schedule  # noqa: F401
from hiremate.ir.simulator import SimulationResult, autodiff_schedule, simulate  # noqa: F401
from hiremate.units import fmt_bytes, parse_bytes  # noqa: F401

__version__ = "0.1.0"


def build_graph(model, sample, **kwargs):
    """Capture ``model`` on ``sample`` as a :class:`Graph` (see ``hiremate.graphbuilder``)."""
    from hiremate.graphbuilder import build_graph as _build

    return _build(model, sample, **kwargs)


def measure(fn, *args, **kwargs):
    """Peak activation bytes and time of one forward+backward (see
    ``hiremate.runtime.measurement``)."""
    from hiremate.runtime.measurement import measure as _measure

    return _measure(fn, *args, **kwargs)


__all__ = [
    # solve and run
    "HRockmate", "Config", "load_config", "RematModule", "solve_graph",
    # extend
    "register_solver", "register_partitioner",
    # graphs and schedules
    "build_graph", "Graph", "Schedule", "simulate", "autodiff_schedule", "measure", "zoo",
    # errors
    "HiremateError", "ConfigError", "GraphCaptureError", "InfeasibleBudgetError",
    "InputMismatchError", "InvalidGraphError", "InvalidScheduleError", "SolverError",
    "ExecutionError",
]

#: names imported on first use: attribute -> module that defines it (a module itself when the
#: attribute is the module's last component)
_LAZY = {
    "HRockmate": "hiremate.api", "solve_graph": "hiremate.api",
    "Config": "hiremate.config", "load_config": "hiremate.config",
    "register_solver": "hiremate.registry", "register_partitioner": "hiremate.registry",
    "RematModule": "hiremate.runtime.executor",
    "zoo": "hiremate.zoo",
}


def __getattr__(name: str):
    """Lazy exports of the pipeline's public API (importing it loads torch and the solvers)."""
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return module if _LAZY[name] == f"{__name__}.{name}" else getattr(module, name)
    raise AttributeError(f"module 'hiremate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
