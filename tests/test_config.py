"""Configurations and budgets: presets, round trips, and errors that name the valid choices."""

from __future__ import annotations

import math

import pytest
import yaml

import hiremate
from hiremate.ir.budget import autodiff_peak, resolve_budget
from hiremate.config import Config, load_config, preset_names
from hiremate.errors import ConfigError
from hiremate.testing.synthetic import chain_graph

PRESETS = ["checkmate", "fastsa", "hilp", "hiremate", "noremat", "rockmate", "rotor", "twremat"]


def test_every_preset_exists_and_round_trips(tmp_path):
    assert sorted(preset_names()) == sorted(PRESETS)
    for name in PRESETS:
        cfg = load_config(name)
        assert cfg.name == name
        path = tmp_path / f"{name}.yaml"
        cfg.save(path)
        again = load_config(str(path))
        assert again == cfg
        assert load_config(cfg.to_dict()) == cfg
        assert load_config(cfg) == cfg


def test_default_preset_is_the_papers_combination():
    cfg = load_config()
    assert cfg.name == "hiremate"
    assert "hilp" in cfg.flat and "twremat" in cfg.flat
    assert cfg.bottom == ["hilp", "twremat"] and cfg.top == ["hilp-top", "rk-rotor"]


def test_overrides_apply_and_validate():
    cfg = load_config("hiremate", n_jobs=1, bottom=["twremat"])
    assert cfg.n_jobs == 1 and cfg.bottom == ["twremat"]
    with pytest.raises(ConfigError, match="n_jobs"):
        load_config("hiremate", n_jobs=0)


def test_solver_params_overrides_merge_into_the_presets():
    """Raising one H-ILP limit keeps the preset's other H-ILP parameters and every other
    solver's (replacing the dict dropped the default's ``max_nodes`` and ``large_above``, so
    the whole-graph MILP ran on graphs the preset keeps it off); a whole configuration given
    as a dict still says everything itself."""
    preset = load_config("hiremate")
    cfg = load_config("hiremate", solver_params={"hilp": {"work_limit": 1000},
                                                 "fastsa": {"seed": 3}})
    assert cfg.solver_params["hilp"] == {**preset.solver_params["hilp"], "work_limit": 1000}
    assert cfg.solver_params["fastsa"] == {"seed": 3}
    for name in set(preset.solver_params) - {"hilp"}:
        assert cfg.solver_params[name] == preset.solver_params[name]
    assert preset.solver_params == load_config("hiremate").solver_params  # the base untouched
    whole = {**preset.to_dict(), "solver_params": {"hilp": {"work_limit": 1000}}}
    assert load_config(whole).solver_params == {"hilp": {"work_limit": 1000}}
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config("hiremate", solver_params={"hilp": 3})


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown configuration key.*'flavour'.*valid keys:.*bottom"):
        load_config({"flavour": 1})
    with pytest.raises(ConfigError, match="valid keys"):
        load_config("hiremate", flavour=1)


def test_unknown_solver_lists_registered_solvers():
    with pytest.raises(ConfigError, match=r"unknown solver 'magic'.*registered solvers:.*hilp"):
        load_config("hiremate", bottom=["magic"])
    with pytest.raises(ConfigError, match="unknown solver 'magic'"):
        Config(solver_params={"magic": {}})
    with pytest.raises(ConfigError, match="unknown partitioner 'nope'.*sequence"):
        load_config("hiremate", partitioner="nope")


def test_unknown_preset_and_unsafe_yaml(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'nonesuch'.*hiremate"):
        load_config("nonesuch")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(bad))
    with pytest.raises(ConfigError):
        load_config(42)


def test_saved_file_is_plain_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    load_config("rockmate").save(path)
    data = yaml.safe_load(path.read_text())
    assert data["bottom"] == ["checkmate"] and data["top"] == ["rk-rotor"]


# -- budgets -----------------------------------------------------------------------------------------
def graph():
    return chain_graph([100, 200, 300, 400], [1.0, 2.0, 3.0, 4.0])


def test_budget_forms():
    g = graph()
    peak = hiremate.simulate(g, hiremate.autodiff_schedule(g)).peak
    assert autodiff_peak(g) == peak
    assert resolve_budget(1234, g) == 1234
    assert resolve_budget("512MiB") == 512 * 2**20
    assert resolve_budget("2GB") == 2 * 10**9
    assert resolve_budget(0.5, g) == math.floor(0.5 * peak)
    assert resolve_budget(1.0, g) == peak
    assert resolve_budget("0.25", g) == math.floor(0.25 * peak)


@pytest.mark.parametrize("bad", [0, -5, float("nan"), 1.5, -0.1, 0.0, "lots", "-3MiB", True,
                                 None, [1]])
def test_bad_budgets_raise_config_error(bad):
    with pytest.raises(ConfigError):
        resolve_budget(bad, graph())


def test_a_dict_that_chooses_no_solvers_changes_the_default_preset():
    """``config={"cost_model": "flops"}`` used to be Config's bare defaults under that key:
    another set of solvers (the sequence partition, a flat H-ILP on graphs of up to 250 nodes)
    that took 175 s on a three-layer DistilBERT at 0.8, where the default preset takes
    seconds. A dict that chooses solvers, or names every key, is still a configuration of its
    own; ``base`` says which explicitly."""
    assert load_config({"cost_model": "flops"}) == load_config("hiremate", cost_model="flops")
    assert load_config({"base": "rockmate", "calibrate": 0}) == load_config("rockmate",
                                                                             calibrate=0)
    bare = load_config({"cost_model": "flops", "base": None})
    assert bare == Config(cost_model="flops")
    own = load_config({"flat": [], "bottom": ["hilp"], "top": ["rk-rotor"]})
    assert own == Config(flat=[], bottom=["hilp"], top=["rk-rotor"])
    for preset in ("hiremate", "rockmate"):
        whole = load_config(preset).to_dict()
        assert load_config(whole) == load_config(preset)
    with pytest.raises(ConfigError, match="base must be a preset name or None"):
        load_config({"base": "fastest", "calibrate": 0})


def test_a_yaml_file_is_read_by_the_dict_rule(tmp_path):
    tweaks = tmp_path / "tweaks.yaml"
    tweaks.write_text("cost_model: flops\ncalibrate: 0\n")
    assert load_config(str(tweaks)) == load_config("hiremate", cost_model="flops", calibrate=0)
    own = tmp_path / "own.yaml"
    own.write_text("flat: [twremat]\nbottom: []\ntop: []\n")
    assert load_config(str(own)) == Config(flat=["twremat"], bottom=[], top=[])
    saved = tmp_path / "saved.yaml"
    load_config("rockmate").save(saved)
    assert load_config(str(saved)) == load_config("rockmate")
