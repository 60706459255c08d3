"""Exceptions a user can act on.

Every failure that a user can cause raises a subclass of :class:`HiremateError`, so a caller can
catch all of them at once, and each message says what went wrong and what to do about it.
"""

from __future__ import annotations


class HiremateError(Exception):
    """Base class of every error raised by hiremate."""


class HiremateWarning(UserWarning):
    """Base class of every warning hiremate raises (a test suite can turn them all into
    errors by this category, wherever the warning is attributed)."""


class CacheWarning(HiremateWarning, RuntimeWarning):
    """A menu-cache entry could not be used; it is removed and the result solved again."""


class GraphCaptureError(HiremateError):
    """No capture path could turn the model into a graph.

    ``attempts`` maps each path that was tried to the reason it failed.
    """

    def __init__(self, message: str, attempts: dict[str, str] | None = None):
        super().__init__(message)
        self.attempts = dict(attempts or {})


class InvalidGraphError(HiremateError):
    """A graph violates an invariant of the CD-graph (a builder or user bug)."""


class InvalidScheduleError(HiremateError):
    """A schedule cannot be executed on its graph; the message names the first bad step."""

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


class InfeasibleBudgetError(HiremateError):
    """No configured solver can meet the budget; ``min_budget`` is the smallest that works."""

    def __init__(self, message: str, min_budget: int | None = None):
        super().__init__(message)
        self.min_budget = min_budget


class ConfigError(HiremateError):
    """A configuration (preset, YAML file, dict or keyword) is malformed."""


class InputMismatchError(HiremateError):
    """A call's inputs differ from the sample the schedule was built for."""


class SolverError(HiremateError):
    """A solver failed for a reason other than an infeasible budget."""
