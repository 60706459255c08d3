"""MILP backends for H-ILP: HiGHS (highspy, default), CP-SAT (ortools), PuLP (CBC, Gurobi).

Each backend takes the same :class:`~hiremate.solvers.hilp.model.Milp` (sparse matrices), a
time limit, a relative MIP gap and an optional warm-start vector, and returns a
:class:`MilpResult`. When time runs out the best incumbent is returned with status
``"feasible"``. Why several: HiGHS is fast and always installed; CP-SAT is strong on the
pure-binary structure and uses several workers; PuLP reaches CBC and, where installed, Gurobi
(the solver used in the paper).
"""

from __future__ import annotations

import logging
import math
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from hiremate.errors import SolverError
from hiremate.solvers.hilp.model import Milp

log = logging.getLogger(__name__)

BACKENDS = ("highs", "cpsat", "pulp")


@dataclass
class MilpResult:
    """``status``: optimal, feasible (limit reached with an incumbent), infeasible, or
    unknown (limit reached without any solution)."""

    status: str
    x: np.ndarray | None
    objective: float
    bound: float
    solve_time: float
    backend: str

    @property
    def has_solution(self) -> bool:
        return self.status in ("optimal", "feasible") and self.x is not None


def solve_milp(
    milp: Milp,
    backend: str = "highs",
    time_limit: float = 60.0,
    mip_gap: float = 1e-6,
    hint: np.ndarray | None = None,
    threads: int = 1,
    relax: bool = False,
    pulp_solver: str = "auto",
) -> MilpResult:
    """Solve ``milp`` with ``backend``; ``relax`` drops integrality (HiGHS only: the LP bound).

    When the backend's package is not installed, the next backend of :data:`BACKENDS` that is
    installed solves the model instead, with a warning (SolverError when none is)."""
    if backend not in BACKENDS:
        raise SolverError(f"unknown H-ILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    # PuLP first among the others: CP-SAT needs a model built with an integer memory unit
    order = [backend] if relax else [backend] + [b for b in ("pulp", "highs", "cpsat")
                                                 if b != backend]
    missing: list[str] = []
    for name in order:
        try:
            return _solve_with(milp, name, time_limit, mip_gap, hint, threads, relax, pulp_solver)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
            log.warning("H-ILP backend %r is not installed (%s); trying the next one", name, exc)
    raise SolverError(f"no H-ILP backend is installed: {'; '.join(missing)}; install highspy "
                      "(pip install highspy), ortools or pulp")


def _solve_with(milp, backend, time_limit, mip_gap, hint, threads, relax, pulp_solver):
    if backend == "highs":
        args = (milp, time_limit, mip_gap, hint, threads, relax)
        if _loaded("ortools.sat.python.cp_model_helper"):
            return _in_subprocess("_solve_highs", args, time_limit)
        return _solve_highs(*args)
    if relax:
        raise SolverError(f"the LP relaxation is computed with backend='highs', not {backend!r}")
    if backend == "cpsat":
        args = (milp, time_limit, mip_gap, hint, threads)
        if _loaded("highspy"):
            return _in_subprocess("_solve_cpsat", args, time_limit)
        return _solve_cpsat(*args)
    if backend == "pulp":
        return _solve_pulp(milp, time_limit, mip_gap, hint, threads, pulp_solver)
    raise SolverError(f"unknown H-ILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")


# -- process isolation ----------------------------------------------------------------------------
# ortools bundles its own build of HiGHS: once either highspy or ortools' CP-SAT is loaded, the
# other fails to load in the same process (undefined symbols, checked with highspy 1.15 and
# ortools 9.15). The second one then runs in a fresh interpreter.
def _loaded(module: str) -> bool:
    return module in sys.modules


def _in_subprocess(fn: str, args: tuple, time_limit: float) -> MilpResult:
    code = "from hiremate.solvers.hilp.backends import _worker; _worker()"
    try:
        proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((fn, args)),
                              capture_output=True, timeout=float(time_limit) + 120.0)
    except subprocess.TimeoutExpired as exc:
        raise SolverError(f"H-ILP backend {fn} did not return in time") from exc
    if proc.returncode != 0:
        raise SolverError(f"H-ILP backend {fn} failed in its subprocess: "
                          f"{proc.stderr.decode(errors='replace')[-2000:]}")
    result = pickle.loads(proc.stdout)
    if isinstance(result, Exception):
        raise result
    return result


def _worker() -> None:
    """Entry point of the subprocess: read (function name, args), write the result."""
    fn, args = pickle.loads(sys.stdin.buffer.read())
    try:
        result = globals()[fn](*args)
    except Exception as exc:  # handed back to the parent, which raises it
        result = exc
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.flush()


# -- HiGHS ------------------------------------------------------------------------------------
def _solve_highs(milp, time_limit, mip_gap, hint, threads, relax) -> MilpResult:
    import highspy

    A = milp.A.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_ = A.shape[1]
    lp.num_row_ = A.shape[0]
    lp.col_cost_ = milp.c
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
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    # below hilp_model.MEM_MARGIN (1e-6 of the unit), as the memory rows assume; HiGHS's
    # default (1e-6) let a schedule a byte over a 1 TiB budget through
    h.setOptionValue("mip_feasibility_tolerance", 1e-7)
    h.setOptionValue("threads", int(threads))
    h.passModel(lp)
    if hint is not None and not relax:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, hint))
        sol.value_valid = True
        h.setSolution(sol)
    start = time.perf_counter()
    h.run()
    elapsed = time.perf_counter() - start
    ms = h.getModelStatus()
    info = h.getInfo()
    S = highspy.HighsModelStatus
    x = np.array(h.getSolution().col_value) if h.getSolution().value_valid else None
    if ms == S.kOptimal:
        status = "optimal"
    elif ms in (S.kInfeasible,):
        status = "infeasible"
    elif ms == S.kUnboundedOrInfeasible:
        status = "infeasible"
    elif x is not None and ms in (S.kTimeLimit, S.kIterationLimit, S.kInterrupt,
                                  S.kSolutionLimit, S.kObjectiveBound, S.kObjectiveTarget):
        status = "feasible" if (relax or info.primal_solution_status == 2) else "unknown"
    elif ms in (S.kTimeLimit, S.kIterationLimit, S.kInterrupt):
        status = "unknown"
    else:
        raise SolverError(f"HiGHS stopped with status {h.modelStatusToString(ms)}")
    if status in ("infeasible", "unknown"):
        x = None
    objective = float(info.objective_function_value) if x is not None else math.inf
    bound = objective if relax else float(getattr(info, "mip_dual_bound", -math.inf))
    return MilpResult(status, x, objective, bound, elapsed, "highs")


# -- CP-SAT -----------------------------------------------------------------------------------
def _solve_cpsat(milp, time_limit, mip_gap, hint, threads) -> MilpResult:
    """CP-SAT needs integer variables and coefficients: the model must be built with an
    integer memory unit (``hilp_model.gcd_unit``); every variable is then an integer."""
    from ortools.sat.python import cp_model

    A = milp.A.tocsr()
    if not np.allclose(A.data, np.round(A.data)):
        raise SolverError("CP-SAT needs integer coefficients: build the model with "
                          "mem_unit=gcd_unit(graph)")
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
    nz = np.flatnonzero(milp.c)
    model.minimize(cp_model.LinearExpr.weighted_sum([xs[c] for c in nz], milp.c[nz].tolist()))
    if hint is not None:
        for c in np.flatnonzero(milp.integer):
            model.add_hint(xs[c], int(round(hint[c])))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.relative_gap_limit = float(mip_gap)
    solver.parameters.num_workers = max(int(threads), 1)
    start = time.perf_counter()
    st = solver.solve(model)
    elapsed = time.perf_counter() - start
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
        return MilpResult(status, x, float(solver.objective_value),
                          float(solver.best_objective_bound), elapsed, "cpsat")
    return MilpResult(status, None, math.inf, -math.inf, elapsed, "cpsat")


# -- PuLP -------------------------------------------------------------------------------------
def _pulp_solver(name: str, time_limit, mip_gap, threads, warm: bool):
    import pulp

    available = set(pulp.listSolvers(onlyAvailable=True))
    if name == "auto":
        name = next((s for s in ("GUROBI", "GUROBI_CMD", "PULP_CBC_CMD") if s in available),
                    "PULP_CBC_CMD")
    if name not in available:
        raise SolverError(f"PuLP solver {name!r} is not available here; available: "
                          f"{', '.join(sorted(available))}")
    kwargs = dict(msg=False, timeLimit=time_limit, gapRel=mip_gap, warmStart=warm)
    if name == "PULP_CBC_CMD":
        kwargs["threads"] = threads
    return pulp.getSolver(name, **kwargs)


def _solve_pulp(milp, time_limit, mip_gap, hint, threads, solver_name) -> MilpResult:
    import pulp

    A = milp.A.tocsr()
    n = A.shape[1]
    prob = pulp.LpProblem("hilp", pulp.LpMinimize)
    xs = [
        pulp.LpVariable(f"x{i}", lowBound=float(milp.col_lo[i]), upBound=float(milp.col_hi[i]),
                        cat=pulp.LpInteger if milp.integer[i] else pulp.LpContinuous)
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
    solver = _pulp_solver(solver_name, time_limit, mip_gap, threads, hint is not None)
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
    if status in ("infeasible", "unknown"):
        return MilpResult(status, None, math.inf, -math.inf, elapsed, "pulp")
    x = np.array(values, float)
    return MilpResult(status, x, float(milp.c @ x), -math.inf, elapsed, "pulp")
