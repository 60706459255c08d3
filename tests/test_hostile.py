"""Hostile inputs: each raises the documented exception with a message that says what to do, or
is survived as documented (docs/errors.md has the table)."""

from __future__ import annotations

import builtins
import logging
import math
import re

import pytest
import torch

import hiremate
from hiremate import HRockmate
from hiremate.api import solve_graph
from hiremate.ir.budget import resolve_budget
from hiremate.config import load_config
from hiremate.errors import ConfigError, GraphCaptureError, InputMismatchError
from hiremate.runtime.executor import RematModule
from hiremate.testing.synthetic import random_graph

FAST = {"progress": False, "n_jobs": 1, "cache": False, "calibrate": 0,
        "solver_params": {"hilp": {"time_limit": 1.0}, "rk-rotor": {"slots": 100}}}


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return MLP().double(), torch.randn(3, 8, dtype=torch.float64)


# -- capture ----------------------------------------------------------------------------------------
class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.sum().item() > 0:  # Python control flow on a tensor's value
            return self.l(x)
        return 2 * self.l(x)


def test_branch_on_an_activation_names_the_op_and_line(mlp):
    _, x = mlp
    with pytest.raises(GraphCaptureError, match="could not capture DataDependent: every capture "
                       "path failed") as info:
        HRockmate(DataDependent().double(), x.clone().requires_grad_(), 1.0, **FAST)
    reason = info.value.attempts["make_fx"]
    assert "aten.sum.default" in reason and "an input that needs a gradient" in reason
    assert re.search(r"test_hostile.py:\d+ \(if x.sum\(\).item\(\) > 0:", reason)
    assert set(info.value.attempts) == {"make_fx", "export"}


def test_branch_on_an_input_is_specialised_and_guarded(mlp):
    """An input that needs no gradient: the capture follows the sample's branch and the module
    refuses (by default) a call whose input takes the other branch."""
    torch.manual_seed(0)
    model = DataDependent().double()
    _, x = mlp
    x = x.abs()
    graph = hiremate.build_graph(model, x, cost_model="flops")
    (guard,) = graph.meta["guards"]
    # .item() hands the exact sum to Python: the guard is on that value
    assert guard["value"] == x.sum().item() and "(if x.sum().item() > 0:" in guard["where"]
    remat = RematModule(model, graph, hiremate.autodiff_schedule(graph))
    torch.testing.assert_close(remat(x), model(x), rtol=0, atol=0)
    with pytest.raises(hiremate.InputMismatchError, match="for the sample the schedule was captured on"):
        remat(-x)


class NoParams(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) * x


def test_model_without_parameters_trains_its_inputs(mlp):
    _, x = mlp
    x1 = x.clone().requires_grad_()
    model = HRockmate(NoParams(), x1, 1.0, **FAST)
    model(x1).sum().backward()
    x2 = x.clone().requires_grad_()
    NoParams()(x2).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=0, atol=0)


def test_model_without_parameters_or_input_gradients(mlp):
    _, x = mlp
    with pytest.raises(GraphCaptureError, match="no output of NoParams needs a gradient: nothing "
                       "to train"):
        HRockmate(NoParams(), x, 1.0, **FAST)


class Detached(MLP):
    def forward(self, x):
        return super().forward(x).detach()


def test_outputs_that_need_no_gradient(mlp):
    _, x = mlp
    with pytest.raises(GraphCaptureError, match="no output of Detached needs a gradient"):
        HRockmate(Detached().double(), x, 1.0, **FAST)


def test_sample_on_another_device(mlp):
    model, x = mlp
    with pytest.raises(ConfigError, match=r"the model and the sample live on different devices "
                       r"\(\['cpu', 'meta'\]\); move them to one device"):
        HRockmate(model, x.to("meta"), 1.0, **FAST)


def test_a_model_that_is_not_a_module_or_has_no_values_is_refused_before_the_capture(mlp):
    """Before: a bare ``AttributeError`` ('function' object has no attribute 'named_modules'),
    and torch's ``RuntimeError: unsupported scalarType`` for a model on the meta device."""
    model, x = mlp
    with pytest.raises(ConfigError, match="HRockmate takes a torch.nn.Module, got function"):
        HRockmate(lambda t: model(t), x, 1.0, **FAST)
    with torch.device("meta"):
        empty = MLP().double()
    with pytest.raises(GraphCaptureError, match=r"is on the meta device: it has a shape but no "
                       r"values to run\. Materialise the model first"):
        HRockmate(empty, x.to("meta"), 1.0, **FAST)
    with pytest.raises(GraphCaptureError, match="on the meta device"):
        hiremate.build_graph(empty, x.to("meta"), cost_model="flops")


def test_saving_to_a_folder_that_does_not_exist_says_so(mlp, tmp_path):
    """Before: a bare ``FileNotFoundError`` from ``Path.write_text``."""
    from hiremate.errors import FileAccessError

    model, x = mlp
    wrapped = HRockmate(model, x, 1.0, cost_model="flops", **FAST)
    target = tmp_path / "missing" / "module.json"
    with pytest.raises(FileAccessError, match="cannot save the HRockmate to .*missing") as info:
        wrapped.save(target)
    assert isinstance(info.value, OSError) and isinstance(info.value, ConfigError)
    with pytest.raises(FileAccessError, match="cannot read a saved HRockmate"):
        HRockmate.load(model, target)


# -- budgets ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget, message", [
    (0, "budget 0 bytes must be positive"),
    (-5, "budget -5 bytes must be positive"),
    (float("nan"), r"budget nan: a float is a fraction of the autodiff peak and must lie in \(0, 1\]"),
    (2.5, r"must lie in \(0, 1\]"),
    (float("inf"), r"must lie in \(0, 1\]"),
    ("12 parsecs", "cannot read '12 parsecs' as a memory size; write a number with an optional unit"),
    ("-1MiB", "cannot read '-1MiB' as a memory size"),
    ("", "cannot read '' as a memory size"),
    (True, "budget True is not a memory size"),
    (None, "budget None is not a memory size"),
    ([1], "budget of type list is not understood"),
])
def test_bad_budgets(budget, message):
    with pytest.raises(ConfigError, match=message):
        resolve_budget(budget, random_graph(0, 5))


def test_bad_budget_through_hrockmate(mlp):
    model, x = mlp
    with pytest.raises(ConfigError, match="budget 0 bytes must be positive"):
        HRockmate(model, x, 0, **FAST)
    with pytest.raises(ConfigError, match="HRockmate needs a budget"):
        HRockmate(model, x, None, **FAST)


# -- calls --------------------------------------------------------------------------------------------
def test_call_with_new_shapes_or_dtypes_when_told_to_raise(mlp):
    model, x = mlp
    h = HRockmate(model, x, 1.0, on_new_inputs="raise", **FAST)
    with pytest.raises(InputMismatchError, match=r"has shape \(5, 8\) instead of \(3, 8\): the "
                       "schedule was made for the sample's shapes"):
        h(torch.randn(5, 8, dtype=torch.float64))
    with pytest.raises(InputMismatchError, match="has dtype float32 instead of float64"):
        h(x.float())
    assert h.recaptures == 0 and h.variants() == []


def test_call_with_a_dtype_the_model_cannot_take(mlp):
    """By default other inputs are captured again; when that capture fails too (float32 inputs
    into a float64 model), the error is still an InputMismatchError naming the difference."""
    model, x = mlp
    h = HRockmate(model, x, 1.0, **FAST)
    with pytest.raises(InputMismatchError, match="has dtype float32 instead of float64.*"
                       "Capturing the model again for these inputs failed as well.*"
                       "mat1 and mat2 must have the same dtype"):
        h(x.float())
    assert h.recaptures == 0


# -- configuration files ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("flat: [hilp]\nbogus_key: 3\n", "unknown configuration key\\(s\\) 'bogus_key'; valid keys:"),
    ("n_options: eight\n", "n_options must be a positive integer, got 'eight'"),
    ("cache: 'yes'\n", "cache must be a bool, got 'yes'"),
    ("flat_max_nodes: many\n", "flat_max_nodes must be a number >= 0, got 'many'"),
    ("solver_params: {hilp: 3}\n", "solver_params\\['hilp'\\] must be a mapping"),
    ("flat: 3\n", "config 'flat' must be a list of solver names, got 3"),
    ("flat: [gurobi-magic]\n", "unknown solver 'gurobi-magic' at level 'flat'; registered "
                               "solvers: autodiff"),
    ("partitioner: metis\n", "unknown partitioner 'metis'; registered:"),
    ("- a\n- list\n", "a configuration must be a mapping, got list"),
    ("flat: [hilp\n", "cannot read a configuration from"),
])
def test_bad_yaml_configs(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path))


def test_unknown_preset_and_bad_solver_parameters():
    with pytest.raises(ConfigError, match="unknown preset 'hiremat' \\(and no such file\\); presets:"):
        load_config("hiremat")
    with pytest.raises(ConfigError, match="bad parameters for solver 'hilp'"):
        solve_graph(random_graph(0, 6), 1.0, "hiremate",
                    **{**FAST, "solver_params": {"hilp": {"time_limitt": 1}}})


# -- menu cache -----------------------------------------------------------------------------------------
def _graph_and_cfg(**kw):
    g = random_graph(3, 14)
    return g, {**FAST, "flat_max_nodes": 0, "cache": True, **kw}


def test_unwritable_cache_directory_warns_and_solves(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    g, cfg = _graph_and_cfg(cache_dir=str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="hiremate.composer.menu_cache"):
        result = solve_graph(g, 0.95, "hiremate", **cfg)
    assert "cannot write hiremate cache entry" in caplog.text
    sim = hiremate.simulate(g, result.schedule)
    assert sim.valid and sim.peak <= result.report["budget"]


def test_corrupted_cache_file_warns_and_is_solved_again(tmp_path):
    g, cfg = _graph_and_cfg(cache_dir=str(tmp_path))
    first = solve_graph(g, 0.95, "hiremate", **cfg)
    files = sorted(tmp_path.rglob("*.json"))
    assert files
    for f in files:
        f.write_bytes(b"\x80\x04 this is not an entry")
    with pytest.warns(RuntimeWarning, match="is unreadable .*; it is removed and the result "
                      "solved again"):
        again = solve_graph(g, 0.95, "hiremate", **cfg)
    # nothing read from the corrupted files: as many hits as the first solve, on an empty
    # cache, had from its own entries (a whole-step re-solve at a lowered budget reuses them)
    assert again.report["cache_hits"] == first.report["cache_hits"]
    assert again.schedule == first.schedule
    assert hiremate.simulate(g, again.schedule).peak <= again.report["budget"]
    assert sorted(tmp_path.rglob("*.json"))  # written again


# -- solver backends ------------------------------------------------------------------------------------
def test_missing_milp_backend_is_an_error_not_a_substitute(monkeypatch):
    """The backend asked for is the one that runs: when it cannot be imported, a SolverError
    says so (no other backend stands in), and another backend asked for explicitly works."""
    real = builtins.__import__

    def no_highspy(name, *args, **kwargs):
        if name.split(".")[0] == "highspy":
            raise ImportError("No module named 'highspy' (simulated)")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_highspy)
    g = random_graph(1, 8)
    peak = hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak
    from hiremate.solvers.hilp.flat import HilpSolver

    with pytest.raises(hiremate.SolverError, match="backend 'highs'.*No module named 'highspy'"):
        HilpSolver(time_limit=5.0).schedule(g, int(0.9 * peak))
    sched = HilpSolver(time_limit=5.0, backend="pulp").schedule(g, int(0.9 * peak))
    sim = hiremate.simulate(g, sched)
    assert sim.valid and sim.peak <= int(0.9 * peak)


def test_ilp_timeout_without_incumbent_uses_the_next_solver(monkeypatch, caplog):
    from hiremate.solvers.hilp import flat as hilp
    from hiremate.solvers.hilp.backends import MilpResult

    def timed_out(milp, backend, time_limit, *args, **kwargs):
        return MilpResult("unknown", None, math.inf, -math.inf, time_limit, backend)

    monkeypatch.setattr(hilp, "solve_milp", timed_out)
    g = random_graph(2, 10)
    params = {"hilp": {"time_limit": 0.1, "warm_start": False}}
    # flat_gap null: the flat H-ILP runs (gated, it would be skipped here: at this budget the
    # flat heuristics reach autodiff's time, the bound)
    with caplog.at_level(logging.WARNING, logger="hiremate.composer.flat"):
        result = solve_graph(g, 1.0, "hiremate",
                             **{**FAST, "solver_params": params, "flat_gap": None})
    assert result.report["solver"] != "hilp"
    assert "found no schedule within its limits" in result.report["errors"]["flat:hilp"]
    assert "time_limit 0.1s" in result.report["errors"]["flat:hilp"]
    assert "flat solver hilp failed (SolverError" in caplog.text
    sim = hiremate.simulate(g, result.schedule)
    assert sim.valid and sim.peak <= result.report["budget"]


def test_a_whole_step_retry_reuses_its_menus_with_the_disk_cache_off(tmp_path, monkeypatch):
    """With ``cache=False`` nothing is written to disk, but a whole-step retry (the generator
    states of three random ops, counted from the loss on, leave no schedule within the
    budget, and the walk solves again without them) reuses the menus solved a moment before
    in the same call: the same schedule as solving them again, with cache hits and no file."""
    from hiremate.composer import menu_cache

    g, cfg = _graph_and_cfg(cache=False, cache_dir=str(tmp_path))
    # the two solves are compared: their MILPs stop at a work limit, not at FAST's wall clock,
    # which under load stopped them at other points (other menus, another schedule)
    cfg["solver_params"] = {**cfg["solver_params"], "hilp": {"work_limit": 2, "time_limit": 60.0}}
    cfg.update(menu_peaks=2, menu_saves=1)  # fewer leaf MILPs: the reuse is what is checked
    peak = hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak
    payload = g.to_dict()
    for node in [n for n in payload["nodes"] if n["kind"] == "fwd"][:3]:
        node["random"] = True
    payload["meta"]["rng_state_bytes"] = peak // 10
    g = hiremate.Graph.from_dict(payload)
    budget, loss_bytes = peak, 0
    reused = solve_graph(g, budget, "hiremate", loss_bytes, **cfg)
    assert reused.report["cache_hits"] > 0  # a retry happened and found its menus
    assert not list(tmp_path.rglob("*"))  # and nothing reached the disk
    monkeypatch.setattr(menu_cache, "CallCache", lambda: menu_cache.MenuCache(enabled=False))
    again = solve_graph(g, budget, "hiremate", loss_bytes, **cfg)
    assert again.report["cache_hits"] == 0
    assert again.schedule == reused.schedule
    assert reused.report["predicted_peak"] <= budget


def test_an_infeasible_fraction_names_the_fraction_that_fits():
    """The error gave the lowest budget in bytes only, where the caller passed a fraction; it
    now says which fraction of the autodiff peak that is, rounded up so that it fits."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 4, 3, padding=1)).double()
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    with pytest.raises(hiremate.errors.InfeasibleBudgetError) as info:
        HRockmate(model, x, 0.2, cost_model="flops", **FAST)
    fraction = float(re.search(r"of which that is ([0-9.]+)\)", str(info.value)).group(1))
    assert 0.2 < fraction <= 1
    HRockmate(model, x, fraction, cost_model="flops", **FAST)
