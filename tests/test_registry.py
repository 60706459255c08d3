"""Registry: custom solvers and partitioners from outside the package, by decorator and by entry
point, placed at a chosen level and used by the solve."""

from __future__ import annotations

import sys
import textwrap

import pytest

import hiremate
from hiremate import registry
from hiremate.api import solve_graph
from hiremate.errors import ConfigError
from hiremate.testing.synthetic import DagOp, graph_from_dag


def residual_chain(n_blocks: int, size: int = 100):
    """Blocks x -> a -> b -> y = x + b: sequence separators fall between blocks."""
    ops, prev = [], -1
    for _ in range(n_blocks):
        i = len(ops)
        ops.append(DagOp([prev], size, 2.0, code="a"))
        ops.append(DagOp([i], size, 3.0, code="b", saves_output=True))
        ops.append(DagOp([prev, i + 1], size, 0.5, code="add", has_param=False,
                         saves_inputs=False))
        prev = i + 2
    return graph_from_dag(ops, [size])


@pytest.fixture
def clean_registry(monkeypatch):
    registry.solver_names()  # built-ins first, so that the copies hold them
    monkeypatch.setattr(registry, "_SOLVERS", dict(registry._SOLVERS))
    monkeypatch.setattr(registry, "_PARTITIONERS", dict(registry._PARTITIONERS))
    yield


def _define_plugins(prefix: str):
    """A menu solver (TW-Remat's options, relabelled) and a partitioner (two halves)."""
    from hiremate.partition.dag import forward_dag
    from hiremate.partition.hierarchy import hierarchy_from_levels
    from hiremate.solvers.twremat import TWRemat

    class MySolver:
        calls = 0

        def applicable(self, graph):
            return True

        def menu(self, graph, budgets):
            type(self).calls += 1
            return TWRemat().menu(graph, budgets)

    class Halves:
        name = f"{prefix}-halves"

        def partition(self, graph):
            dag, ids, _ = forward_dag(graph)
            half = dag.n // 2
            levels = [[tuple(range(half)), tuple(range(half, dag.n))]]
            return hierarchy_from_levels(dag, levels, partitioner=self.name, graph=graph,
                                         node_ids=ids)

    return MySolver, Halves


def _check_used(report, solver: str, n_blocks: int = 2):
    assert report["hierarchical_path"] and report["blocks"] == n_blocks
    assert all(m["solvers"][solver]["options"] > 0 for m in report["block_menus"])
    # the budget forces recomputation, which only the custom solver's options offer
    assert any(solver in w for w in report["block_solvers"])


def test_decorator_registration_used_at_bottom_level(clean_registry, tmp_path):
    MySolver, Halves = _define_plugins("deco")
    hiremate.register_solver("my-menu")(MySolver)
    hiremate.register_partitioner("deco-halves")(Halves)
    assert "my-menu" in registry.solver_names()
    g = residual_chain(6)
    res = solve_graph(g, 0.8, {"name": "t", "flat": [], "bottom": ["my-menu"],
                               "top": ["rk-rotor"], "partitioner": "deco-halves",
                               "cache": False, "progress": False, "n_jobs": 1})
    sim = hiremate.simulate(g, res.schedule)
    assert sim.valid and sim.peak <= res.report["budget"]
    assert res.report["hierarchy"]["partitioner"] == "deco-halves"
    _check_used(res.report, "my-menu")
    assert MySolver.calls == 2  # the two halves differ (the first reads the input): two menus
    # a solver registered at run time also reaches joblib worker processes
    par = solve_graph(g, 0.8, {"name": "t", "flat": [], "bottom": ["my-menu"],
                               "top": ["rk-rotor"], "partitioner": "deco-halves",
                               "cache": False, "progress": False, "n_jobs": 2,
                               "backend": "loky"})
    assert par.schedule == res.schedule
    _check_used(par.report, "my-menu")


def test_entry_point_registration(clean_registry, tmp_path, monkeypatch):
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "hm_plugin_mod.py").write_text(textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from test_registry import _define_plugins
        EpSolver, EpHalves = _define_plugins("ep")
    """ % str(__import__("pathlib").Path(__file__).parent)))
    dist = pkg / "hm_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hm-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[hiremate.solvers]\nep-menu = hm_plugin_mod:EpSolver\n\n"
        "[hiremate.partitioners]\nep-halves = hm_plugin_mod:EpHalves\n")
    monkeypatch.syspath_prepend(str(pkg))
    registry.load_plugins(force=True)
    assert "ep-menu" in registry.solver_names()
    assert "ep-halves" in registry.partitioner_names()
    g = residual_chain(6)
    res = solve_graph(g, 0.6, {"name": "t", "flat": [], "bottom": ["ep-menu"],
                               "top": ["rk-rotor"], "partitioner": "ep-halves",
                               "cache": False, "progress": False, "n_jobs": 1})
    sim = hiremate.simulate(g, res.schedule)
    assert sim.valid and sim.peak <= res.report["budget"]
    _check_used(res.report, "ep-menu")
    sys.modules.pop("hm_plugin_mod", None)


def test_broken_entry_point_is_skipped_with_warning(clean_registry, tmp_path, monkeypatch, caplog):
    pkg = tmp_path / "site2"
    dist = pkg / "hm_broken-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hm-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[hiremate.solvers]\nbroken = no_such_module:X\n")
    monkeypatch.syspath_prepend(str(pkg))
    registry.load_plugins(force=True)
    assert "broken" not in registry.solver_names()
    assert "cannot load" in caplog.text


def test_builtin_solvers_registered():
    names = registry.solver_names()
    for n in ("hilp", "checkmate", "twremat", "fastsa", "rotor", "autodiff", "rk-rotor"):
        assert n in names
    assert {"hpartition", "sequence", "flat"} <= set(registry.partitioner_names())
    with pytest.raises(ConfigError, match="registered solvers"):
        registry.make_solver("nope")
    with pytest.raises(ConfigError, match="bad parameters for solver 'twremat'"):
        registry.make_solver("twremat", {"colour": 1})
