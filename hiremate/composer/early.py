"""The gated flat H-ILP, started early on a second thread while the hierarchy runs.

Why: with ``flat_gap`` the flat H-ILP waits for the hierarchy, the sequence path and a polish,
and runs only when their best schedule leaves more than ``flat_gap`` to the moment bound
(:mod:`hiremate.composer.flat`). Where it does run, its MILP (tens of seconds near the flat size
limit) came after all of that, although most of the hierarchy's work is serial (the top MILPs,
rk-Rotor, the polish) and leaves a core idle. Started beside the hierarchy, the MILP uses that
core, and the gate later takes its answer, or cancels it when the gate skips the MILP. It
starts once the hierarchy's menus are made: they run on every core (``n_jobs``), and a MILP
beside them would only slow them, where the gate may skip it after all.

The schedule does not change: the MILP is the same problem with the same work limit, so its
answer does not depend on when it ran or what ran beside it, and the gate's decision is made
as before. It starts only when a second core is there (``n_jobs`` other than 1; not with
joblib's ``multiprocessing`` backend, which forks), when the flat heuristics leave more than
the gate's threshold to the bound (else the gate is sure to skip it), and when its backend can
be cancelled (HiGHS in this process: :func:`~hiremate.solvers.hilp.backends.can_cancel`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from hiremate.composer import flat as composer_flat
from hiremate.errors import SolverError
from hiremate.ir.blocks import Candidate
from hiremate.ir.graph import Graph

log = logging.getLogger(__name__)

FlatOutcome = tuple[Candidate | None, int | None, str]


class EarlyFlatHilp:
    """The flat H-ILP of ``graph`` at ``budget`` (its configured parameters ``params``), to be
    solved on a thread of its own once :meth:`start` is called. :meth:`result` waits for its
    answer (starting it first if nobody did); :meth:`cancel` abandons it without waiting (the
    thread stops at HiGHS's next interrupt check and is not a daemon, so the interpreter never
    exits inside the solver). ``cancel``: an event of the caller's that also cancels it."""

    def __init__(self, graph: Graph, budget: int, params: dict[str, Any],
                 cancel: threading.Event | None = None):
        self._cancel = cancel if cancel is not None else threading.Event()
        self._outcome: FlatOutcome | None = None
        self._error: BaseException | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(graph, budget, params),
                                        name="hiremate-early-flat-hilp")

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        """Start solving (once; not after :meth:`cancel`)."""
        if not self.started and not self._cancel.is_set():
            log.debug("flat hilp started early, beside the hierarchy")
            self._thread.start()

    def _run(self, graph: Graph, budget: int, params: dict[str, Any]) -> None:
        from hiremate.solvers.hilp.cancel import SolveCancelled, cancellable

        start = time.perf_counter()
        try:
            with cancellable(self._cancel):
                self._outcome = composer_flat.flat_candidate("hilp", params, graph, budget)
        except SolveCancelled:
            log.debug("early flat hilp cancelled after %.2fs", time.perf_counter() - start)
        except BaseException as exc:  # handed to the thread that asks for the result
            self._error = exc
        self.seconds = time.perf_counter() - start

    def result(self) -> FlatOutcome:
        """The answer, as :func:`~hiremate.composer.flat.flat_candidate` gives it."""
        self.start()
        if self.started:
            self._thread.join()
        if self._error is not None:
            raise self._error
        if self._outcome is None:
            raise SolverError("the early flat H-ILP was cancelled before its result was asked")
        return self._outcome

    def cancel(self) -> None:
        """Abandon the solve (a no-op once it has finished; it never starts if it had not)."""
        self._cancel.set()


def spare_core(n_jobs: int) -> bool:
    """Whether a second core is there for the early MILP: ``n_jobs`` 1 asks for one core."""
    import joblib

    return n_jobs != 1 and (joblib.cpu_count() or 1) >= 2


def plan_early_flat_hilp(graph: Graph, budget: int, cfg: Any, candidates: list[Candidate],
                         bound: float) -> EarlyFlatHilp | None:
    """The early flat H-ILP, not started yet, when it may pay (module doc), else None.
    ``candidates``: the flat heuristics' schedules; ``bound``: the moment bound at ``budget``."""
    from hiremate.registry import make_solver
    from hiremate.solvers.hilp.backends import can_cancel

    if ("hilp" not in cfg.flat or not composer_flat.applicable("hilp", cfg, graph)
            or not spare_core(cfg.n_jobs) or cfg.backend == "multiprocessing"):
        return None  # (a fork of the menus' workers must not copy a thread inside HiGHS)
    own = [c.sim.time for c in candidates if c.source in cfg.flat]
    if (not own or not 0 < bound < float("inf")
            or min(own) / bound - 1 <= composer_flat.gate_threshold(graph, budget, cfg)):
        return None  # deferred (no flat heuristic fits), or sure to be skipped by the gate
    params = cfg.solver_params.get("hilp", {})
    if not can_cancel(getattr(getattr(make_solver("hilp", params), "config", None),
                              "backend", "highs")):
        return None
    return EarlyFlatHilp(graph, budget, params)
