"""A quiet library: a whole ``HRockmate`` build writes nothing to stdout or stderr.

The checks read the process's file descriptors 1 and 2 (pytest's ``capfd``), below Python's
``sys.stdout``: native code (HiGHS's banner, the torch profiler's start/stop lines) writes
there directly, and so do progress bars and anything a solver backend prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from hiremate.api import HRockmate
from hiremate.config import load_config
from hiremate.errors import ConfigError, SolverError
from hiremate.quiet import QuietContext, show_progress, silenced_fds
from hiremate.solvers.hilp import backends
from hiremate.solvers.hilp.model import build_model
from hiremate.testing.synthetic import random_graph


def small_model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(128, 128), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(128, 10)), torch.randn(64, 128)


#: configurations whose solvers reach each MILP backend (flat and hierarchical paths)
TOP = {"flat": [], "bottom": ["twremat"], "top": ["hilp-top"], "flat_max_nodes": 0,
       "n_jobs": 1}
LIGHT = {"time_limit": 10.0, "retries": 1, "refine_rounds": 0}
CONFIGS = {
    "default": {},
    "hilp-highs": {"flat": ["hilp"], "n_jobs": 1,
                   "solver_params": {"hilp": {"backend": "highs", "time_limit": 5.0}}},
    "hilp-cpsat": {"flat": ["hilp"], "n_jobs": 1,
                   "solver_params": {"hilp": {"backend": "cpsat", "time_limit": 5.0}}},
    "hilp-top-highs": {**TOP, "solver_params": {"hilp-top": {**LIGHT, "backend": "highs"}}},
    "hilp-top-cpsat": {**TOP, "solver_params": {"hilp-top": {**LIGHT, "backend": "cpsat"}}},
    "hilp-top-cbc": {**TOP, "solver_params": {"hilp-top": {**LIGHT, "backend": "pulp",
                                                           "pulp_solver": "CBC"}}},
}


@pytest.fixture
def own_cache(tmp_path) -> str:
    """A fresh menu cache, so that the solvers run rather than a cache answering (the roofline
    fit is the test run's: a first fit's quiet is the fresh interpreter's test below)."""
    return str(tmp_path / "menus")


@pytest.fixture(scope="module")
def captured():
    """The small model's graph, captured once for the module."""
    import hiremate

    model, sample = small_model()
    return hiremate.build_graph(model, sample)


@pytest.fixture
def reuse_capture(request, captured, monkeypatch):
    """Builds of the solver configurations reuse the module's capture (the capture itself
    is checked by the default configuration's build, which captures)."""
    import hiremate

    if request.node.callspec.params.get("name", "") != "default":
        monkeypatch.setattr(hiremate, "build_graph", lambda model, sample, **_: captured)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_whole_build_writes_nothing(name, capfd, own_cache, reuse_capture):
    model, sample = small_model()
    capfd.readouterr()
    remat = HRockmate(model, sample, 0.5, cache_dir=own_cache, **CONFIGS[name])
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    report = remat.report()
    # the H-ILP solvers ran on the backend asked for (a missing one would be an error here)
    assert not [k for k in report["errors"] if "hilp" in k], report["errors"]
    if name.startswith("hilp-top"):
        assert report["solver"] == "hilp-top"


def test_hilp_top_through_the_subprocess_path_writes_nothing(capfd, own_cache, monkeypatch,
                                                            captured):
    """HiGHS in a fresh interpreter (as when ortools' CP-SAT is loaded): its banner is printed
    there, on the first solver object of that process, and must neither reach the console
    nor spoil the channel that brings the result back."""
    calls = []
    real = backends._in_subprocess

    def counted(fn, args, time_limit):
        calls.append(fn)
        return real(fn, args, time_limit)

    import hiremate

    monkeypatch.setattr(hiremate, "build_graph", lambda model, sample, **_: captured)
    monkeypatch.setattr(backends, "_loaded", lambda module: True)
    monkeypatch.setattr(backends, "_in_subprocess", counted)
    model, sample = small_model()
    capfd.readouterr()
    HRockmate(model, sample, 0.5, cache_dir=own_cache, **CONFIGS["hilp-top-highs"])
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert "_solve_highs" in calls


def test_a_fresh_interpreter_builds_quietly(capfd, tmp_path):
    """HiGHS prints its banner once per process and the profiler initialises once: a child
    interpreter (its descriptors are capfd's) sees both for the first time, and with a cache
    of its own it fits the roofline too, as a new user's first build does."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from test_quiet import small_model
        from hiremate.api import HRockmate
        model, sample = small_model()
        HRockmate(model, sample, 0.5, n_jobs=1)
    """) % str(Path(__file__).parent)
    capfd.readouterr()
    proc = subprocess.run([sys.executable, "-c", code],
                          env={**os.environ, "HIREMATE_CACHE": str(tmp_path / "cache")})
    out, err = capfd.readouterr()
    assert proc.returncode == 0, err
    assert (out, err) == ("", "")


# -- the pieces ---------------------------------------------------------------------------------
def test_silenced_fds_sends_native_output_to_the_debug_log(capfd, caplog):
    capfd.readouterr()
    with caplog.at_level("DEBUG", logger="hiremate.quiet"):
        with silenced_fds(what="native"):
            os.write(1, b"banner line\n")
            os.write(2, b"profiler line\n")
            with silenced_fds():  # nested: still diverted
                os.write(1, b"inner\n")
        os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert (out, err) == ("after\n", "")
    assert "native: banner line" in caplog.text and "native: profiler line" in caplog.text
    assert "inner" in caplog.text


def test_a_quiet_context_passes_exceptions_through():
    entered = []

    class Inner:
        def __enter__(self):
            entered.append(True)
            return "inner"

        def __exit__(self, *exc):
            entered.append(exc[0])
            return False

    with pytest.raises(KeyError):
        with QuietContext(Inner(), "x") as got:
            assert got == "inner"
            raise KeyError("k")
    assert entered == [True, KeyError]


def test_progress_is_auto_by_default_and_follows_the_terminal(monkeypatch):
    assert load_config("hiremate").progress == "auto"
    assert load_config(None).progress == "auto"

    class Tty:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setattr(sys, "stderr", Tty(False))
    assert not show_progress("auto") and show_progress(True) and not show_progress(False)
    monkeypatch.setattr(sys, "stderr", Tty(True))
    assert show_progress("auto") and not show_progress(False)


@pytest.mark.parametrize("bad", ["sometimes", 1, None])
def test_progress_takes_true_false_or_auto(bad):
    with pytest.raises(ConfigError, match="progress"):
        load_config("hiremate", progress=bad)


def test_the_projects_warnings_fail_the_tests_that_do_not_expect_them():
    """pyproject's filterwarnings: hiremate's category is an error wherever it is attributed,
    so is any warning raised in a hiremate module, and so are PuLP's 4.0 deprecations."""
    import warnings

    from hiremate.errors import CacheWarning

    with pytest.raises(CacheWarning):
        warnings.warn("an unreadable cache entry", CacheWarning)
    with pytest.raises(UserWarning):
        warnings.warn_explicit("from our code", UserWarning, "x.py", 1, module="hiremate.x")
    with pytest.raises(DeprecationWarning):
        warnings.warn("LpVariable.dicts is deprecated; for PuLP 4.0 ...", DeprecationWarning)
    with pytest.warns(RuntimeWarning):  # expected: fine (CacheWarning is a RuntimeWarning)
        warnings.warn("an unreadable cache entry", CacheWarning)


# -- backends: the one asked for runs ------------------------------------------------------------
def _milp(cpsat: bool = False):
    from hiremate.solvers.hilp.model import gcd_unit

    g = random_graph(3, 4, max_fanin=2)
    return build_model(g, 10 ** 9, None, gcd_unit(g) if cpsat else None).milp


@pytest.mark.parametrize("backend", ["highs", "cpsat", "pulp"])
def test_each_backend_is_installed_and_is_the_one_that_runs(backend):
    res = backends.solve_milp(_milp(backend == "cpsat"), backend, time_limit=30.0)
    assert res.backend == backend
    assert res.status == "optimal"


def test_a_missing_backend_is_an_error_not_a_substitute(monkeypatch):
    monkeypatch.setattr(backends, "installed", lambda name: name != "cpsat")
    with pytest.raises(SolverError, match="'cpsat' needs the package 'ortools'"):
        backends.solve_milp(_milp(True), "cpsat")
    # "auto" chooses among what is installed
    assert backends.solve_milp(_milp(True), "auto").backend == "highs"
    monkeypatch.setattr(backends, "installed", lambda name: name == "cpsat")
    assert backends.solve_milp(_milp(True), "auto").backend == "cpsat"
    with pytest.raises(SolverError, match="no H-ILP backend"):
        backends.solve_milp(_milp(False), "auto")  # CP-SAT cannot take fractional rows


def test_a_backend_that_fails_to_import_is_a_solver_error(monkeypatch):
    def broken(*args, **kwargs):
        raise ImportError("undefined symbol")

    monkeypatch.setattr(backends, "_solve_pulp", broken)
    with pytest.raises(SolverError, match="fails to import"):
        backends.solve_milp(_milp(), "pulp")


def test_a_garbled_subprocess_channel_is_a_solver_error(monkeypatch):
    class Done:
        returncode = 0
        stdout = b"Running HiGHS ... no result"
        stderr = b""

    monkeypatch.setattr(backends.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(SolverError, match="no readable result"):
        backends._in_subprocess("_solve_highs", (), 1.0)


def test_pulp_runs_without_deprecation_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        res = backends.solve_milp(_milp(), "pulp", pulp_solver="CBC", hint=None)
    assert res.status == "optimal"
