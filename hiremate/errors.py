"""Exceptions a user can act on.

Every failure that a user can cause raises a subclass of :class:`HiremateError`, so a caller can
catch all of them at once, and each message says what went wrong and what to do about it.

Each class also derives from the builtin exception a Python caller would expect for that kind of
failure, so code written against the conventions keeps working: a bad budget, configuration,
graph, schedule or input is a :class:`ValueError` (an input of the wrong structure is a
:class:`TypeError` as well); a failed capture, solver or run is a :class:`RuntimeError`.
"""

from __future__ import annotations


class HiremateError(Exception):
    """Base class of every error raised by hiremate."""


class HiremateWarning(UserWarning):
    """Base class of every warning hiremate raises (a test suite can turn them all into
    errors by this category, wherever the warning is attributed)."""


class CacheWarning(HiremateWarning, RuntimeWarning):
    """A menu-cache entry could not be used; it is removed and the result solved again."""


class GraphCaptureError(HiremateError, RuntimeError):
    """No capture path could turn the model into a graph.

    ``attempts`` maps each path that was tried to the reason it failed.
    """

    def __init__(self, message: str, attempts: dict[str, str] | None = None):
        super().__init__(message)
        self.attempts = dict(attempts or {})


class InvalidGraphError(HiremateError, ValueError):
    """A graph violates an invariant of the CD-graph (a builder or user bug), or does not
    belong to the model it is used with."""


class InvalidScheduleError(HiremateError, ValueError):
    """A schedule cannot be executed on its graph; the message names the first bad step."""

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


class InfeasibleBudgetError(HiremateError, ValueError):
    """No configured solver can meet the budget; ``min_budget`` is the smallest that works."""

    def __init__(self, message: str, min_budget: int | None = None):
        super().__init__(message)
        self.min_budget = min_budget


class ConfigError(HiremateError, ValueError):
    """A configuration (preset, YAML file, dict, keyword or budget) is malformed."""


class FileAccessError(ConfigError, OSError):
    """A file hiremate was asked to write or read (a saved module) could not be: an
    :class:`OSError` as well, for code that catches those."""


class InputMismatchError(HiremateError, ValueError, TypeError):
    """A call's inputs differ from the sample the schedule was built for (in structure, which
    a caller may catch as a ``TypeError``, or in shape and dtype, a ``ValueError``)."""


class SolverError(HiremateError, RuntimeError):
    """A solver failed for a reason other than an infeasible budget."""


class ExecutionError(HiremateError, RuntimeError):
    """Running a schedule (a :class:`~hiremate.runtime.executor.RematModule` call or its
    backward) failed for a reason the caller can fix."""


class ModelChangedError(ExecutionError):
    """The model's modules or the shapes of its parameters or buffers changed after the graph
    was captured: the captured program is no longer the model's (``HRockmate`` captures again;
    a bare ``RematModule`` raises)."""


class DoubleBackwardError(ExecutionError):
    """Backward through a RematModule was asked to build a graph (``create_graph=True``)."""


class BackwardTwiceError(ExecutionError):
    """The backward of one RematModule call ran again after one that freed what the call kept
    (the first backward was not given ``retain_graph=True``; eager PyTorch refuses the same)."""


class ModifiedInPlaceError(ExecutionError):
    """A tensor the backward of a RematModule call needs was modified in place after the call
    (eager PyTorch refuses the same with a ``RuntimeError``)."""


class OutputGradientError(ExecutionError):
    """The backward of a RematModule call reached an output that its graph was captured to give
    no gradient (``output_gradients``), and the module has no way to run the call again for
    every output (``HRockmate`` has)."""


class FormatError(HiremateError, ValueError):
    """Data read back from a file (a cache entry, a stored option or schedule) is not of the
    expected kind, shape or version."""
