"""MILP backends for H-ILP: HiGHS (highspy, default), CP-SAT (ortools), PuLP (CBC, Gurobi).

Each backend takes the same :class:`~hiremate.solvers.hilp.model.Milp` (sparse matrices), a
work limit, a wall-clock cap, a relative MIP gap and an optional warm-start vector, and returns
a :class:`MilpResult`. When a limit is reached the best incumbent is returned with status
``"feasible"``.

Determinism: the same model must give the same answer at any machine load, so the limit that
decides is a *work* limit, counted by the solver in units that do not depend on the clock
(:data:`DEFAULT_WORK` says which unit each backend counts), with one thread (or CP-SAT's
deterministic interleaved search) and a fixed seed. The wall-clock ``time_limit`` stays as a
safety cap far above the usual solve; a solve it stops is logged as a warning, since its result
depends on the load. Why several backends: HiGHS is fast and always installed; CP-SAT is
strong on the pure-binary structure and uses several workers; PuLP reaches CBC and, where
installed, Gurobi (the solver the HiRemate paper used).

The backend asked for is the one that runs: when its package is missing, a
:class:`~hiremate.errors.SolverError` says so (only ``backend="auto"`` picks one). Every backend
runs with its console output off; HiGHS's banner, which it prints when its first solver object
is created, goes to the debug log (:func:`hiremate.quiet.silenced_fds`).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from hiremate.errors import SolverError
from hiremate.quiet import silenced_fds
from hiremate.solvers.hilp.cancel import SolveCancelled, watch_cancel
from hiremate.solvers.hilp.model import Milp

log = logging.getLogger(__name__)

#: ``auto``: the first installed of HiGHS, PuLP and CP-SAT (CP-SAT only for a model whose
#: constraint coefficients are integers)
BACKENDS = ("highs", "cpsat", "pulp", "auto")
#: backend -> (module that must import, how to install it)
_PACKAGES = {"highs": ("highspy", "pip install highspy"),
             "cpsat": ("ortools", "pip install ortools"),
             "pulp": ("pulp", "pip install pulp")}

#: the work limit each backend stops at when none is given, in that backend's own unit:
#: HiGHS: branch-and-bound nodes (``mip_max_nodes``; the root node's work, LP, cuts and
#: heuristics, is bounded by HiGHS's own effort settings, which count LP iterations);
#: CP-SAT: deterministic seconds (``max_deterministic_time``, a count of the work done, about
#: a second of one core each); PuLP: branch-and-bound nodes of CBC (``maxNodes``; Gurobi and
#: the other solvers PuLP reaches stop by the wall clock only)
DEFAULT_WORK = {"highs": 2000, "cpsat": 20.0, "pulp": 2000}
#: the default wall-clock cap, in seconds: a safety net far above what the work limits take
SAFETY_TIME = 600.0


@dataclass
class MilpResult:
    """``status``: optimal, feasible (limit reached with an incumbent), infeasible, or
    unknown (limit reached without any solution). ``limit``: which limit stopped the solve
    before its proof, ``"work"`` (reproducible) or ``"time"`` (the wall-clock cap: the result
    depends on the load), None when it ran to its end."""

    status: str
    x: np.ndarray | None
    objective: float
    bound: float
    solve_time: float
    backend: str
    limit: str | None = None

    @property
    def has_solution(self) -> bool:
        return self.status in ("optimal", "feasible") and self.x is not None


def installed(backend: str) -> bool:
    """Whether ``backend``'s package is installed (found, not imported: highspy and ortools
    cannot both be loaded in one process, see :func:`_loaded`)."""
    module = _PACKAGES[backend][0]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def integral(milp: Milp) -> bool:
    """Whether every constraint coefficient of ``milp`` is an integer (what CP-SAT needs)."""
    data = milp.A.data
    return bool(np.all(np.abs(data - np.round(data)) <= 1e-9 * np.maximum(1.0, np.abs(data))))


def choose_backend(milp: Milp, relax: bool = False) -> str:
    """The backend ``"auto"`` stands for: the LP relaxation needs HiGHS; otherwise the first
    installed of HiGHS, PuLP and (for an integral model) CP-SAT."""
    order = ("highs",) if relax else ("highs", "pulp", "cpsat")
    for name in order:
        if installed(name) and (name != "cpsat" or integral(milp)):
            return name
    raise SolverError("no H-ILP backend is installed for this model; install highspy "
                      "(pip install highspy), pulp, or ortools")


def backend_and_work(milp: Milp, backend: str, work_limit: float | None,
                     relax: bool = False) -> tuple[str, float]:
    """The backend that runs ``milp`` (:func:`choose_backend`) and its work limit or default."""
    name = choose_backend(milp, relax) if backend == "auto" else backend
    return name, (DEFAULT_WORK[name] if work_limit is None else work_limit)


def solve_milp(
    milp: Milp, backend: str = "highs", time_limit: float = SAFETY_TIME, mip_gap: float = 1e-6,
    hint: np.ndarray | None = None, threads: int = 1, relax: bool = False,
    pulp_solver: str = "auto", work_limit: float | None = None, seed: int = 0,
    highs_options: dict | None = None,
) -> MilpResult:
    """Solve ``milp`` with ``backend``; ``relax`` drops integrality (HiGHS only: the LP bound).

    ``work_limit``: the deterministic budget of work, in the backend's unit
    (:data:`DEFAULT_WORK`, which also gives the default); ``time_limit``: the wall-clock
    safety cap, in seconds; ``seed``: the backend's random seed. ``threads`` counts for CP-SAT
    (interleaved, deterministic, search over that many workers) and CBC; HiGHS runs on one.
    ``backend="auto"`` picks one (:func:`choose_backend`); any other name is the backend that
    runs, and a :class:`SolverError` says so when its package is not installed.
    ``highs_options``: HiGHS settings over :data:`HIGHS_HEURISTICS` (other backends ignore them)."""
    if backend not in BACKENDS:
        raise SolverError(f"unknown H-ILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    name, work = backend_and_work(milp, backend, work_limit, relax)
    module, how = _PACKAGES[name]
    if not installed(name):
        raise SolverError(f"H-ILP backend {name!r} needs the package {module!r}, which is not "
                          f"installed ({how})")
    if not work > 0:
        raise SolverError(f"H-ILP work_limit must be positive, not {work_limit!r}")
    try:
        res = _solve_with(milp, name, time_limit, mip_gap, hint, threads, relax, pulp_solver,
                          work, int(seed), highs_options)
    except ImportError as exc:
        raise SolverError(f"H-ILP backend {name!r}: {module!r} is installed but fails to "
                          f"import ({exc}); reinstall it ({how})") from exc
    if res.limit == "time":
        log.warning("H-ILP backend %s was stopped by the wall-clock cap (time_limit %gs) before "
                    "its work limit (%g): this %s result depends on the machine's load and may "
                    "differ from run to run; raise time_limit or lower work_limit", name,
                    float(time_limit), work, res.status)
    return res


def solve_highs_batch(milps: list[Milp], relax: bool = False,
                      work_limit: float = DEFAULT_WORK["highs"]) -> list[MilpResult]:
    """Each of ``milps`` by HiGHS (one thread, seed 0, ``work_limit`` nodes, the safety cap), in
    one process: a fresh interpreter when CP-SAT is loaded here, as :func:`solve_milp` does for
    one problem, so that many small problems pay for one interpreter, not one each."""
    if not installed("highs"):
        raise SolverError("HiGHS is needed here and highspy is not installed (pip install "
                          "highspy)")
    args = (list(milps), relax, work_limit)
    if _loaded("ortools.sat.python.cp_model_helper"):
        return _in_subprocess("_solve_highs_batch", args, SAFETY_TIME)
    return _solve_highs_batch(*args)


def _solve_highs_batch(milps, relax, work):
    return [_solve_highs(m, SAFETY_TIME, 1e-6, None, relax, work, 0) for m in milps]


def _solve_with(milp, backend, time_limit, mip_gap, hint, threads, relax, pulp_solver, work,
                seed, highs_options=None):
    if backend == "highs":
        args = (milp, time_limit, mip_gap, hint, relax, work, seed, highs_options)
        if _loaded("ortools.sat.python.cp_model_helper"):
            return _in_subprocess("_solve_highs", args, time_limit)
        return _solve_highs(*args)
    if relax:
        raise SolverError(f"the LP relaxation is computed with backend='highs', not {backend!r}")
    if backend == "cpsat":
        args = (milp, time_limit, mip_gap, hint, threads, work, seed)
        if _loaded("highspy"):
            return _in_subprocess("_solve_cpsat", args, time_limit)
        return _solve_cpsat(*args)
    if backend == "pulp":
        return _solve_pulp(milp, time_limit, mip_gap, hint, threads, pulp_solver, work, seed)
    raise SolverError(f"unknown H-ILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")


# -- process isolation ----------------------------------------------------------------------------
# ortools bundles its own build of HiGHS: once either highspy or ortools' CP-SAT is loaded, the
# other fails to load in the same process (undefined symbols, checked with highspy 1.15 and
# ortools 9.15). The second one then runs in a fresh interpreter.
def _loaded(module: str) -> bool:
    return module in sys.modules


#: precedes the pickled result on the worker's result channel: whatever else reached that
#: channel before it (it should be nothing) is skipped
_MARK = b"\x00hiremate-milp-result\x00"


def _in_subprocess(fn: str, args: tuple, time_limit: float) -> MilpResult:
    code = "from hiremate.solvers.hilp.backends import _worker; _worker()"
    try:
        proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((fn, args)),
                              capture_output=True, timeout=float(time_limit) + 120.0)
    except subprocess.TimeoutExpired as exc:
        raise SolverError(f"H-ILP backend {fn} did not return in time") from exc
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise SolverError(f"H-ILP backend {fn} failed in its subprocess: {err[-2000:]}")
    for line in err.splitlines():
        if line.strip():
            log.debug("%s subprocess: %s", fn, line.rstrip())
    at = proc.stdout.rfind(_MARK)
    if at < 0:
        raise SolverError(f"H-ILP backend {fn}: its subprocess returned no readable result (no "
                          f"result marker); it wrote {proc.stdout[:200]!r} and {err[-2000:]!r}")
    try:
        result = pickle.loads(proc.stdout[at + len(_MARK):])
    except Exception as exc:  # a garbled channel: say what came back
        raise SolverError(f"H-ILP backend {fn}: its subprocess returned no readable result "
                          f"({exc}); it wrote {proc.stdout[:200]!r} and {err[-2000:]!r}") from exc
    if isinstance(result, Exception):
        raise result
    return result


def _worker() -> None:
    """Entry point of the subprocess: read (function name, args), write the result.

    The result travels on a copy of the original stdout; descriptor 1 itself is pointed at
    stderr first, so that anything native code prints (HiGHS's banner) cannot garble it."""
    channel = os.fdopen(os.dup(1), "wb")
    sys.stdout.flush()
    os.dup2(2, 1)
    fn, args = pickle.loads(sys.stdin.buffer.read())
    try:
        result = globals()[fn](*args)
    except Exception as exc:  # handed back to the parent, which raises it
        result = exc
    channel.write(_MARK + pickle.dumps(result))
    channel.flush()


def can_cancel(backend: str) -> bool:
    """Whether a solve by ``backend`` in this process obeys
    :func:`~hiremate.solvers.hilp.cancel.cancellable`: HiGHS only, and only while it runs here
    rather than in a subprocess (CP-SAT loaded)."""
    return (backend == "highs" and installed("highs")
            and not _loaded("ortools.sat.python.cp_model_helper"))


# -- HiGHS ------------------------------------------------------------------------------------
def _new_highs():
    """A HiGHS solver object with its output off. HiGHS prints its banner when the first one
    of a process is created, before any option can be set: the creation runs with the
    console descriptors diverted to the debug log."""
    import highspy

    with silenced_fds(what="HiGHS"):
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
    return h


#: LP relaxations with more columns than this are solved by HiGHS's interior point method
LARGE_LP_COLUMNS = 100_000
#: HiGHS's absolute MIP gap, in the model's own objective unit (HiGHS's default, which the
#: solves relied on before the objective was scaled: it is scaled with the objective, so that
#: a solve stops where it stopped unscaled)
HIGHS_ABS_GAP = 1e-6


#: HiGHS's options beyond the limits: RINS (a sub-MIP around the incumbent and the LP point)
#: off. On the hierarchical MILPs it took a large share of a root node's time (the menus'
#: MILPs stop at the root) and found no better schedule than HiGHS's other heuristics and the
#: warm start; RENS, which also costs much, stays on: without it UNet's top-level MILP lost
#: its best schedule (docs/results.md, "Solve times", has both measurements)
HIGHS_HEURISTICS = {"mip_heuristic_run_rins": False}


def objective_scale(c: np.ndarray) -> float:
    """The factor HiGHS's objective is multiplied by: one over the mean magnitude of the
    nonzero costs, so that a typical cost is 1. Why: the H-ILP objectives are in seconds, most
    ops take a small fraction of a millisecond, and HiGHS's absolute tolerances (its dual
    feasibility tolerance) then blur the reduced costs that decide its branching and bounds;
    it warns of such "excessively small costs". Scaled, the same model is solved to the same
    optimum with better-conditioned LPs (docs/results-history.md, stop 50, has the work saved)."""
    nonzero = np.abs(np.asarray(c, dtype=float))
    nonzero = nonzero[nonzero > 0]
    if not nonzero.size or not np.all(np.isfinite(nonzero)):
        return 1.0
    return float(1.0 / nonzero.mean())


def _solve_highs(milp, time_limit, mip_gap, hint, relax, work, seed, options=None
                 ) -> MilpResult:
    """HiGHS on one thread with a fixed seed: its branch and bound is then deterministic, and
    ``work`` (branch-and-bound nodes) is the limit that decides."""
    import highspy

    A = milp.A.tocsc()
    scale = objective_scale(milp.c)
    lp = highspy.HighsLp()
    lp.num_col_ = A.shape[1]
    lp.num_row_ = A.shape[0]
    lp.col_cost_ = milp.c * scale
    lp.col_lower_ = milp.col_lo
    lp.col_upper_ = milp.col_hi
    lp.row_lower_ = np.where(np.isinf(milp.row_lo), -highspy.kHighsInf, milp.row_lo)
    lp.row_upper_ = np.where(np.isinf(milp.row_hi), highspy.kHighsInf, milp.row_hi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr
    lp.a_matrix_.index_ = A.indices
    lp.a_matrix_.value_ = A.data
    if not relax:
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if f else highspy.HighsVarType.kContinuous
            for f in milp.integer
        ]
    h = _new_highs()
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    h.setOptionValue("mip_abs_gap", HIGHS_ABS_GAP * scale)
    # below hilp_model.MEM_MARGIN (1e-6 of the unit), as the memory rows assume; HiGHS's
    # default (1e-6) let a schedule a byte over a 1 TiB budget through
    h.setOptionValue("mip_feasibility_tolerance", 1e-7)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", int(seed) % 2**31)
    for option, value in {**HIGHS_HEURISTICS, **(options or {})}.items():
        h.setOptionValue(option, value)
    h.setOptionValue("mip_max_nodes", int(min(max(work, 1), 2**31 - 1)))
    if relax and A.shape[1] > LARGE_LP_COLUMNS:
        # the simplex does not finish the relaxations of graphs of a few hundred compute
        # nodes within minutes (docs/results.md); the interior point solves them to its
        # tolerances, and a crossover to a vertex adds nothing to a bound
        h.setOptionValue("solver", "ipm")
        h.setOptionValue("run_crossover", "off")
    h.passModel(lp)
    if hint is not None and not relax:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, hint))
        sol.value_valid = True
        h.setSolution(sol)
    event = watch_cancel(h)
    start = time.perf_counter()
    h.run()
    elapsed = time.perf_counter() - start
    if event is not None and event.is_set():
        raise SolveCancelled("the solve was cancelled")
    ms = h.getModelStatus()
    info = h.getInfo()
    S = highspy.HighsModelStatus
    x = np.array(h.getSolution().col_value) if h.getSolution().value_valid else None
    limits = {S.kTimeLimit: "time", S.kIterationLimit: "work", S.kSolutionLimit: "work",
              S.kInterrupt: "time"}
    limit = limits.get(ms)
    if ms == S.kOptimal:
        status = "optimal"
    elif ms in (S.kInfeasible,):
        status = "infeasible"
    elif ms == S.kUnboundedOrInfeasible:
        status = "infeasible"
    elif x is not None and ms in (S.kTimeLimit, S.kIterationLimit, S.kInterrupt,
                                  S.kSolutionLimit, S.kObjectiveBound, S.kObjectiveTarget):
        status = "feasible" if (relax or info.primal_solution_status == 2) else "unknown"
    elif ms in (S.kTimeLimit, S.kIterationLimit, S.kInterrupt, S.kSolutionLimit):
        status = "unknown"  # a node limit reached before any incumbent
    else:
        raise SolverError(f"HiGHS stopped with status {h.modelStatusToString(ms)}")
    if status in ("infeasible", "unknown"):
        x = None
    objective = float(info.objective_function_value) / scale if x is not None else math.inf
    bound = objective if relax else float(getattr(info, "mip_dual_bound", -math.inf)) / scale
    return MilpResult(status, x, objective, bound, elapsed, "highs", limit)


# -- CP-SAT -----------------------------------------------------------------------------------
#: CP-SAT's objective has integer coefficients: times are scaled so that the largest one is
#: this many steps, then rounded (each coefficient within half a step of its exact value)
CPSAT_TIME_STEPS = 2 ** 30
#: and so that no objective value the variables' bounds allow exceeds this (far within int64)
_CPSAT_REACH = 2 ** 52


def integer_objective(c: np.ndarray, lo: np.ndarray, hi: np.ndarray
                      ) -> tuple[np.ndarray, float, float]:
    """Integer coefficients for CP-SAT's objective: ``(rounded c * scale, scale, error)``, where
    ``error`` bounds ``|c.x - rounded.x / scale|`` over the box ``lo <= x <= hi``. A nonzero
    coefficient stays nonzero (at least one step), so that no node becomes free to rerun."""
    c = np.asarray(c, float)
    nz = c != 0
    if not nz.any():
        return np.zeros(len(c), np.int64), 1.0, 0.0
    reach = np.maximum(np.abs(lo), np.abs(hi))
    big = float(np.abs(c).max())
    total = float(np.abs(c) @ reach)
    scale = min(CPSAT_TIME_STEPS / big, _CPSAT_REACH / max(total, big))
    ci = np.round(c * scale)
    ci[nz & (ci == 0)] = np.sign(c[nz & (ci == 0)])
    error = float(np.abs(ci / scale - c) @ reach)
    return ci.astype(np.int64), scale, error


def _solve_cpsat(milp, time_limit, mip_gap, hint, threads, work, seed) -> MilpResult:
    """CP-SAT needs integer variables and coefficients: the model must be built with an
    integer memory unit (``hilp_model.gcd_unit``, ``hier.gcd_unit_top``); every variable is
    then an integer. The objective (times) is scaled to integers (:func:`integer_objective`);
    the reported objective is recomputed exactly from the solution, the bound is lowered by
    the rounding error. ``work`` is CP-SAT's deterministic time; with several ``threads`` the
    workers' search is interleaved, which CP-SAT keeps deterministic (its default parallel
    portfolio is not)."""
    from ortools.sat.python import cp_model

    A = milp.A.tocsr()
    if not integral(milp):
        raise SolverError("CP-SAT needs integer constraint coefficients: build the model with "
                          "an integer memory unit (mem_unit=gcd_unit(graph))")
    model = cp_model.CpModel()
    lo = np.ceil(milp.col_lo - 1e-9).astype(np.int64)
    hi = np.floor(milp.col_hi + 1e-9).astype(np.int64)
    xs = [model.new_int_var(int(a), int(b), "") for a, b in zip(lo, hi)]
    data = np.round(A.data).astype(np.int64)
    for i in range(A.shape[0]):
        s, e = A.indptr[i], A.indptr[i + 1]
        if s == e:
            continue
        rlo, rhi = milp.row_lo[i], milp.row_hi[i]
        expr = cp_model.LinearExpr.weighted_sum([xs[c] for c in A.indices[s:e]],
                                                data[s:e].tolist())
        lb = cp_model.INT_MIN if np.isinf(rlo) else int(math.ceil(rlo - 1e-9))
        ub = cp_model.INT_MAX if np.isinf(rhi) else int(math.floor(rhi + 1e-9))
        model.add_linear_constraint(expr, lb, ub)
    ci, scale, error = integer_objective(milp.c, lo, hi)
    nz = np.flatnonzero(ci)
    model.minimize(cp_model.LinearExpr.weighted_sum([xs[c] for c in nz], ci[nz].tolist()))
    if hint is not None:
        for c in np.flatnonzero(milp.integer):
            model.add_hint(xs[c], int(round(hint[c])))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.max_deterministic_time = float(work)
    solver.parameters.relative_gap_limit = float(mip_gap)
    solver.parameters.num_workers = max(int(threads), 1)
    if threads > 1:
        solver.parameters.interleave_search = True
    solver.parameters.random_seed = int(seed) % 2**31
    solver.parameters.log_search_progress = False
    start = time.perf_counter()
    st = solver.solve(model)
    elapsed = time.perf_counter() - start
    limit = None
    if st in (cp_model.FEASIBLE, cp_model.UNKNOWN):
        limit = "time" if solver.wall_time >= 0.99 * float(time_limit) else "work"
    if st == cp_model.OPTIMAL:
        status = "optimal"
    elif st == cp_model.FEASIBLE:
        status = "feasible"
    elif st == cp_model.INFEASIBLE:
        status = "infeasible"
    elif st == cp_model.UNKNOWN:
        status = "unknown"
    else:
        raise SolverError(f"CP-SAT stopped with status {solver.status_name(st)}")
    if status in ("optimal", "feasible"):
        x = np.array([solver.value(v) for v in xs], float)
        bound = float(solver.best_objective_bound) / scale - error
        return MilpResult(status, x, float(milp.c @ x), bound, elapsed, "cpsat", limit)
    return MilpResult(status, None, math.inf, -math.inf, elapsed, "cpsat", limit)


# -- PuLP -------------------------------------------------------------------------------------
#: names of CBC in ``pulp_solver``: "CBC" and "COIN_CMD" (a ``cbc`` on the PATH, else the one
#: bundled with PuLP); "PULP_CBC_CMD" is PuLP's deprecated name of the bundled one
_CBC_NAMES = ("CBC", "COIN_CMD", "PULP_CBC_CMD")


def _cbc(kwargs: dict, threads: int):
    """CBC through ``COIN_CMD``, PuLP's supported CBC interface: the ``cbc`` on the PATH (or
    from ``pulp[cbc]``), else the binary bundled with PuLP (which the deprecated
    ``PULP_CBC_CMD`` would run)."""
    import pulp

    solver = pulp.getSolver("COIN_CMD", threads=threads, **kwargs)
    if solver.available():
        return solver
    legacy = getattr(pulp, "PULP_CBC_CMD", None)  # the class; not instantiated (it warns)
    bundled = getattr(legacy, "pulp_cbc_path", None)
    if bundled and os.path.isfile(bundled):
        solver = pulp.getSolver("COIN_CMD", path=bundled, threads=threads, **kwargs)
        if solver.available():
            return solver
    raise SolverError("PuLP's CBC is not available here: install it (pip install 'pulp[cbc]') "
                      "or put a cbc executable on the PATH")


def _pulp_solver(name: str, time_limit, mip_gap, threads, warm: bool, work=None, seed=0):
    """The PuLP solver ``name`` ("auto": Gurobi where available, else CBC), output off. CBC
    stops at ``work`` branch-and-bound nodes and seeds its heuristics with ``seed + 1`` (CBC
    takes a seed of 0 to mean the time of day); the other solvers stop by the wall clock."""
    import pulp

    kwargs = dict(msg=False, timeLimit=time_limit, gapRel=mip_gap, warmStart=warm)
    if name == "auto":
        name = next((s for s in ("GUROBI", "GUROBI_CMD")
                     if pulp.getSolver(s, msg=False).available()), "CBC")
    if name in _CBC_NAMES:
        if work is not None:
            kwargs["maxNodes"] = int(min(max(work, 1), 2**31 - 1))
        kwargs["options"] = [f"randomCbcSeed {int(seed) % (2**31 - 1) + 1}"]
        return _cbc(kwargs, threads)
    try:
        solver = pulp.getSolver(name, **kwargs)
    except pulp.PulpSolverError as exc:
        raise SolverError(f"PuLP knows no solver {name!r}: {exc}") from exc
    if not solver.available():
        raise SolverError(f"PuLP solver {name!r} is not available here; available: "
                          f"{', '.join(sorted(pulp.listSolvers(onlyAvailable=True)))}")
    return solver


def _new_variable(prob, name: str, lo: float, hi: float, cat: str):
    """A variable of ``prob``: ``LpProblem.add_variable`` where PuLP has it (the form PuLP
    4.0 keeps), else the ``LpVariable`` constructor of older PuLP."""
    import pulp

    add = getattr(prob, "add_variable", None)
    if add is not None:
        return add(name, lowBound=lo, upBound=hi, cat=cat)
    return pulp.LpVariable(name, lowBound=lo, upBound=hi, cat=cat)


def _solve_pulp(milp, time_limit, mip_gap, hint, threads, solver_name, work=None, seed=0
                ) -> MilpResult:
    import pulp

    A = milp.A.tocsr()
    n = A.shape[1]
    prob = pulp.LpProblem("hilp", pulp.LpMinimize)
    xs = [
        _new_variable(prob, f"x{i}", float(milp.col_lo[i]), float(milp.col_hi[i]),
                      pulp.LpInteger if milp.integer[i] else pulp.LpContinuous)
        for i in range(n)
    ]
    nz = np.flatnonzero(milp.c)
    prob += pulp.LpAffineExpression([(xs[c], float(milp.c[c])) for c in nz])
    for i in range(A.shape[0]):
        s, e = A.indptr[i], A.indptr[i + 1]
        if s == e:
            continue
        expr = pulp.LpAffineExpression(
            [(xs[c], float(v)) for c, v in zip(A.indices[s:e], A.data[s:e])])
        rlo, rhi = milp.row_lo[i], milp.row_hi[i]
        if rlo == rhi:
            prob += pulp.LpConstraint(expr, pulp.LpConstraintEQ, f"r{i}", float(rhi))
            continue
        if not np.isinf(rlo):
            prob += pulp.LpConstraint(expr, pulp.LpConstraintGE, f"l{i}", float(rlo))
        if not np.isinf(rhi):
            prob += pulp.LpConstraint(expr, pulp.LpConstraintLE, f"u{i}", float(rhi))
    if hint is not None:
        for v, val in zip(xs, hint):
            v.setInitialValue(float(round(val)) if v.cat == pulp.LpInteger else float(val))
    solver = _pulp_solver(solver_name, time_limit, mip_gap, threads, hint is not None, work,
                          seed)
    start = time.perf_counter()
    try:
        prob.solve(solver)
    except pulp.PulpSolverError as exc:
        raise SolverError(f"PuLP ({solver.name}) failed: {exc}") from exc
    elapsed = time.perf_counter() - start
    st = pulp.LpStatus[prob.status]
    values = [v.varValue for v in xs]
    have = all(val is not None for val in values)
    sol_status = getattr(prob, "sol_status", None)
    if st == "Optimal" and sol_status in (None, pulp.LpSolutionOptimal):
        status = "optimal"
    elif st == "Optimal" and have:  # CBC stopped by the time limit with an incumbent
        status = "feasible"
    elif st == "Infeasible":
        status = "infeasible"
    elif st == "Not Solved" or not have:
        status = "unknown"
    else:
        raise SolverError(f"PuLP ({solver.name}) stopped with status {st}")
    # PuLP does not say which limit stopped CBC: the wall clock when it ran that long
    limit = ("time" if elapsed >= 0.99 * float(time_limit) else "work") \
        if status in ("feasible", "unknown") else None
    if status in ("infeasible", "unknown"):
        return MilpResult(status, None, math.inf, -math.inf, elapsed, "pulp", limit)
    x = np.array(values, float)
    return MilpResult(status, x, float(milp.c @ x), -math.inf, elapsed, "pulp", limit)
