"""Benchmarks of the general-graph heuristics (FastSA, TW-Remat) on synthetic CD-graphs.

    python bench/bench_fastsa.py rate      # FastSA mutations per second (--frac: the budget)
    python bench/bench_fastsa.py big       # FastSA on a graph of about 1,000 compute nodes
    python bench/bench_fastsa.py big --cold   # ... with the numba kernel compiled afresh

    python bench/bench_fastsa.py compare --rev REV   # evaluation rate: revision REV vs working tree
    python bench/bench_fastsa.py table     # predicted overhead at 30/50/70% of the autodiff peak

``--accelerate python`` times the pure-Python loop instead of the numba kernel (the default
``auto`` uses the kernel when numba is installed).

``overhead_table(graph, solvers)`` is the reusable piece: for each fraction of the autodiff
peak it runs each solver and reports the predicted overhead (simulated time / autodiff time - 1)
and the solve time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Callable

import hiremate
from hiremate.errors import InfeasibleBudgetError
from hiremate.ir.graph import Graph
from hiremate.solvers.fastsa.solver import FastSA
from hiremate.solvers.twremat import TWRemat
from hiremate.testing.synthetic import random_graph

FRACTIONS = (0.3, 0.5, 0.7)


def default_solvers() -> dict[str, Callable[[], object]]:
    return {"twremat": TWRemat,
            "fastsa": lambda: FastSA(seed=0, iters_grouped=50_000, iters_fine=20_000)}


def overhead_table(graph: Graph, solvers: dict[str, Callable[[], object]] | None = None,
                   fractions: tuple[float, ...] = FRACTIONS) -> list[dict]:
    """Rows ``{solver, fraction, budget, feasible, peak, overhead, solve_s}`` for ``graph``.

    ``overhead`` is simulated time / autodiff time - 1 (None when the budget is not met).
    """
    solvers = solvers or default_solvers()
    auto = hiremate.simulate(graph, hiremate.autodiff_schedule(graph))
    rows = []
    for name, make in solvers.items():
        solver = make()
        for frac in fractions:
            budget = int(frac * auto.peak)
            start = time.perf_counter()
            try:
                sched = solver.schedule(graph, budget)  # type: ignore[attr-defined]
            except InfeasibleBudgetError as exc:
                rows.append(dict(solver=name, fraction=frac, budget=budget, feasible=False,
                                 peak=exc.min_budget, overhead=None,
                                 solve_s=time.perf_counter() - start))
                continue
            elapsed = time.perf_counter() - start
            res = hiremate.simulate(graph, sched).raise_if_invalid()
            rows.append(dict(solver=name, fraction=frac, budget=budget,
                             feasible=res.peak <= budget, peak=res.peak,
                             overhead=res.time / auto.time - 1, solve_s=elapsed))
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'solver':8} {'frac':>5} {'budget':>9} {'peak':>9} {'overhead':>9} {'solve s':>8}"]
    for r in rows:
        ov = "infeas." if r["overhead"] is None else f"{100 * r['overhead']:.1f}%"
        lines.append(f"{r['solver']:8} {r['fraction']:5.2f} {r['budget']:9d} {r['peak']:9d} "
                     f"{ov:>9} {r['solve_s']:8.2f}")
    return "\n".join(lines)


def warm_up(accelerate: str = "auto") -> float:
    """Seconds to load (or compile, on a cold cache) the numba kernel: a tiny solve, so that
    rates measure the annealing loop alone."""
    start = time.perf_counter()
    FastSA(seed=0, iters_grouped=10, iters_fine=10, accelerate=accelerate).solve(
        random_graph(0, 3), 1 << 40)
    return time.perf_counter() - start


def mutation_rate(graph: Graph, iters: int = 200_000, frac: float | None = None,
                  accelerate: str = "auto") -> dict:
    """Mutations drawn and evaluated per second in FastSA's grouped and fine annealing.

    An evaluated mutation is one that was valid and whose accept/reject decision was made
    (``bounded`` of them were rejected from a lower bound of the new objective alone).
    ``frac=None``: a budget it cannot reach (1/20 of the autodiff peak), so the first
    annealing runs all its iterations; else that fraction of the autodiff peak (the first
    annealing stops once the budget is met). The kernel is loaded first (``warm_up_s``).
    """
    out: dict = dict(accelerate=accelerate, warm_up_s=round(warm_up(accelerate), 2))
    auto = hiremate.simulate(graph, hiremate.autodiff_schedule(graph))
    solver = FastSA(seed=0, iters_grouped=iters, iters_fine=iters, time_limit=1e9,
                    accelerate=accelerate)
    solver.solve(graph, max(1, auto.peak // 20) if frac is None else int(frac * auto.peak))
    for stage, st in zip(("grouped", "fine"), solver.last_stats):
        out[stage] = dict(attempts=st.attempts, evaluated=st.evaluated, accepted=st.accepted,
                          bounded=st.bounded, seconds=round(st.seconds, 2),
                          cpu_seconds=round(st.cpu_seconds, 2),
                          attempts_per_s=round(st.attempts_per_s),
                          evaluated_per_s=round(st.evaluated_per_s),
                          evaluated_per_cpu_s=round(st.evaluated / st.cpu_seconds)
                          if st.cpu_seconds else 0)
    return out


#: modules that an older revision's FastSA imports under the names they had before the layout
#: became subpackages, and where they are now
MOVED_MODULES = {
    "hiremate.graph": "hiremate.ir.graph",
    "hiremate.option": "hiremate.ir.option",
    "hiremate.schedule": "hiremate.ir.schedule",
    "hiremate.simulator": "hiremate.ir.simulator",
    "hiremate.solvers.remat_sequence": "hiremate.ir.sequence",
    "hiremate.solvers.hilp_menu": "hiremate.solvers.menu",
    "hiremate.solvers.fastsa_segtree": "hiremate.testing.segtree",
    "hiremate.solvers.fastsa_accel": "hiremate.solvers.fastsa.accel",
}

#: where FastSA's state and solver modules lie in a revision: today's layout, then the old one
LAYOUTS = (("solvers/fastsa/state.py", "solvers/fastsa/solver.py",
            ("hiremate.solvers.fastsa.state",)),
           ("solvers/fastsa_state.py", "solvers/fastsa.py", ("hiremate.solvers.fastsa_state",)))


def _git_show(root: str, rev: str, path: str) -> str | None:
    import subprocess

    done = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True,
                          text=True)
    return done.stdout if done.returncode == 0 else None


def load_fastsa_at(rev: str):
    """The ``FastSA`` class of git revision ``rev`` (its state and solver modules, loaded from
    ``git show`` under private module names), for before/after comparisons. Revisions from
    before the subpackage layout work too: the modules they import are renamed to where those
    modules are now (:data:`MOVED_MODULES`)."""
    import importlib.util
    import re
    import subprocess
    import sys
    import tempfile

    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    tag = rev.replace("/", "_")[:12]
    for state_path, solver_path, state_names in LAYOUTS:
        texts = {"state": _git_show(root, rev, state_path),
                 "solver": _git_show(root, rev, solver_path)}
        if None not in texts.values():
            break
    else:
        raise SystemExit(f"revision {rev!r} has no FastSA in either layout")
    renames = dict(MOVED_MODULES)
    renames.update({name: f"fastsa_state_{tag}" for name in state_names})
    names = "|".join(re.escape(k) for k in sorted(renames, key=len, reverse=True))
    pattern = re.compile(r"\b(" + names + r")(?![\w.])")
    tmp = tempfile.mkdtemp(prefix="fastsa_rev_")
    for kind in ("state", "solver"):
        name = f"fastsa_{kind}_{tag}"
        path = f"{tmp}/{name}.py"
        with open(path, "w") as fh:
            fh.write(pattern.sub(lambda m: renames[m.group(1)], texts[kind]))
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return sys.modules[f"fastsa_solver_{tag}"].FastSA


def compare_rates(graph: Graph, rev: str, iters: int = 200_000, rounds: int = 2) -> list[dict]:
    """Evaluated mutations per wall and CPU second, FastSA at ``rev`` vs the working tree,
    interleaved (``rounds`` times each) so that both see the same machine load. Times whole
    solves (grouping, both annealings, the final simulations), after the kernel is loaded."""
    warm_up()
    auto = hiremate.simulate(graph, hiremate.autodiff_schedule(graph))
    budget = max(1, auto.peak // 20)
    rows = []
    for _ in range(rounds):
        for label, cls in ((rev, load_fastsa_at(rev)), ("working tree", FastSA)):
            solver = cls(seed=0, iters_grouped=iters, iters_fine=iters, time_limit=1e9)
            w0, c0 = time.perf_counter(), time.process_time()
            solver.solve(graph, budget)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            ev = sum(st.evaluated for st in solver.last_stats)
            rows.append(dict(version=label, evaluated=ev, wall_s=round(wall, 2),
                             cpu_s=round(cpu, 2), evaluated_per_s=round(ev / wall),
                             evaluated_per_cpu_s=round(ev / cpu)))
    return rows


def big_graph_solve(n_fwd: int = 500, frac: float = 0.5, accelerate: str = "auto") -> dict:
    """Solve time and result of FastSA (default settings) on ``random_graph(0, n_fwd)``.

    The time is that of the first solve in the process: it includes loading the numba kernel,
    or compiling it when its cache is cold (``big --cold``)."""
    g = random_graph(0, n_fwd)
    auto = hiremate.simulate(g, hiremate.autodiff_schedule(g))
    solver = FastSA(seed=0, accelerate=accelerate)
    start, cpu = time.perf_counter(), time.process_time()
    seq, peak, t = solver.solve(g, int(frac * auto.peak))
    return dict(compute_nodes=len(g), accelerate=accelerate,
                solve_s=round(time.perf_counter() - start, 2),
                solve_cpu_s=round(time.process_time() - cpu, 2),
                peak_fraction=round(peak / auto.peak, 3), overhead=round(t / auto.time - 1, 3),
                attempts=[st.attempts for st in solver.last_stats])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["rate", "big", "table", "compare"])
    parser.add_argument("--rev", default=None,
                        help="compare: the git revision to time against the working tree")
    parser.add_argument("--n", type=int, default=None, help="forward ops of the random graph")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--fanin", type=int, default=3, help="max fan-in of the random DAG")
    parser.add_argument("--frac", type=float, default=None,
                        help="rate: budget as a fraction of the autodiff peak (default: 1/20)")
    parser.add_argument("--iters", type=int, default=200_000,
                        help="rate: iterations of each annealing")
    parser.add_argument("--accelerate", choices=["auto", "numba", "python"], default="auto",
                        help="rate, big: FastSA's annealing loop in numba or in Python")
    parser.add_argument("--cold", action="store_true",
                        help="big: compile the numba kernel afresh (an empty cache directory)")
    args = parser.parse_args()
    if args.cold:  # before numba is first imported (FastSA imports it on first use)
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastsa_numba_cache_")
    if args.what == "rate":
        print(mutation_rate(random_graph(0, args.n or 200), iters=args.iters, frac=args.frac,
                            accelerate=args.accelerate))
    elif args.what == "compare":
        if args.rev is None:
            parser.error("compare needs --rev (the git revision to time against)")
        for row in compare_rates(random_graph(0, args.n or 200), args.rev):
            print(row)
    elif args.what == "big":
        print(big_graph_solve(args.n or 500, accelerate=args.accelerate))
    else:
        for seed in args.seeds:
            g = random_graph(seed, args.n or 60, max_fanin=args.fanin)
            print(f"random_graph({seed}, {args.n or 60}, max_fanin={args.fanin}): {g!r}")
            print(format_rows(overhead_table(g)))


if __name__ == "__main__":
    main()
