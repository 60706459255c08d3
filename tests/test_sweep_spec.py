"""Tests of sweep files: parsing, budgets, models, and errors that list the valid choices."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hiremate.errors import ConfigError
from hiremate.sweep.spec import (
    PEERS,
    Budget,
    import_factory,
    load_spec,
    method_names,
    parse_budget,
    parse_model,
    parse_spec,
    preset_names,
    spec_from_dict,
)

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "configs" / "sweeps"


def _base(**over):
    data = {"name": "t", "models": [{"name": "mlp", "layers": 1, "width": 8}],
            "budgets": [0.5], "methods": ["eager"]}
    data.update(over)
    return data


def test_every_shipped_sweep_file_parses():
    files = sorted(SWEEPS.glob("*.yaml"))
    assert {f.stem for f in files} >= {"smoke", "gpt2", "transformer", "unet", "resnet"}
    for f in files:
        spec = load_spec(f)
        assert spec.methods[0] == "eager"
        assert spec.models and spec.budgets


def test_methods_are_peers_and_presets():
    names = method_names()
    assert names[: len(PEERS)] == list(PEERS)
    assert set(preset_names()) <= set(names)
    # the presets are the configs/*.yaml files
    assert set(preset_names()) == {p.stem for p in (ROOT / "configs").glob("*.yaml")}


@pytest.mark.parametrize("value, fraction, nbytes, label", [
    (0.5, 0.5, None, "0.5"), (1.0, 1.0, None, "1"), ("0.25", 0.25, None, "0.25"),
    ("2MiB", None, 2 * 2**20, "2MiB"), ("1.5 KiB", None, 1536, "1.5KiB"),
    (4096, None, 4096, "4096"),
])
def test_budget_parsing(value, fraction, nbytes, label):
    b = parse_budget(value)
    assert (b.fraction, b.nbytes, b.label) == (fraction, nbytes, label)


@pytest.mark.parametrize("value", [0.0, 1.5, -3, "lots", None, True, "0MiB"])
def test_bad_budgets_raise(value):
    with pytest.raises(ConfigError):
        parse_budget(value)


def test_budget_resolution_against_the_eager_peak():
    assert Budget("0.3", fraction=0.3).resolve(1000) == (300, 0.3)
    assert Budget("0.3", fraction=0.3).resolve(1001) == (300, 0.3)  # floor: never above
    assert Budget("500", nbytes=500).resolve(2000) == (500, 0.25)


def test_zoo_model_labels_and_defaults():
    m = parse_model({"name": "gpt2", "layers": 4, "width": 64})
    assert (m.label, m.zoo, m.layers, m.width, m.batch) == ("gpt2-L4-W64", "gpt2", 4, 64, None)
    assert parse_model("mlp").label == "mlp"
    assert parse_model({"name": "mlp", "label": "tiny"}).label == "tiny"
    r = parse_model({"name": "resnet", "layers": [1, 1, 2, 1], "width": 8})
    assert r.layers == (1, 1, 2, 1) and r.label == "resnet-L1x1x2x1-W8"


def test_unknown_zoo_model_lists_the_names():
    with pytest.raises(ConfigError, match="valid names are: .*gpt2.*mlp"):
        parse_model({"name": "gtp2"})


def test_bad_zoo_size_raises():
    with pytest.raises(ConfigError, match="width must be a multiple"):
        parse_model({"name": "gpt2", "width": 66})


def test_unknown_model_key_lists_the_valid_keys():
    with pytest.raises(ConfigError, match="valid keys: name, layers, width, batch, label"):
        parse_model({"name": "mlp", "depth": 3})


def test_factory_model_builds_through_importlib():
    m = parse_model({"factory": "hiremate.zoo:get", "kwargs": {"name": "mlp", "layers": 1},
                     "label": "f"})
    assert (m.label, m.factory) == ("f", "hiremate.zoo:get")
    model, sample = m.build()
    assert sum(p.numel() for p in model.parameters()) > 0 and sample.shape[0] == 8
    assert parse_model("hiremate.zoo:get").label == "hiremate.zoo:get"


@pytest.mark.parametrize("text, match", [
    ("no_such_module_xyz:f", "cannot import module"),
    ("hiremate.zoo:nothing_here", "has no attribute"),
    ("os.path; import os:x", "must read"),
    ("hiremate.zoo:__doc__", "not callable"),
])
def test_bad_factories_raise(text, match):
    with pytest.raises(ConfigError, match=match):
        import_factory(text)


def test_unknown_sweep_key_lists_the_valid_keys():
    with pytest.raises(ConfigError, match="unknown sweep key.*'bugdets'.*valid keys: name"):
        parse_spec(_base(bugdets=[0.5]))


def test_unknown_method_lists_peers_and_presets():
    with pytest.raises(ConfigError, match="unknown method 'checkpointing'.*eager, checkpoint"):
        parse_spec(_base(methods=["checkpointing"]))


def test_eager_is_always_measured_first_and_methods_dedupe():
    spec = parse_spec(_base(methods=["compile", "checkpoint", "compile"]))
    assert spec.methods == ["eager", "compile", "checkpoint"]
    assert spec.budgeted_methods == ["compile"]


@pytest.mark.parametrize("over, match", [
    ({"models": []}, "non-empty list"), ({"budgets": [0.5, "0.5"]}, "repeat"),
    ({"repeats": 0}, "repeats"), ({"n_jobs": 0}, "n_jobs"), ({"dtype": "int8"}, "dtype"),
    ({"backend": "ray"}, "backend"), ({"tolerance": -1}, "tolerance"),
    ({"models": ["mlp", {"name": "mlp"}]}, "appear twice"),
])
def test_bad_values_raise(over, match):
    with pytest.raises(ConfigError, match=match):
        parse_spec(_base(**over))


def test_spec_round_trips_through_its_dict(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_base(budgets=[0.5, "1MiB"], repeats=2, threads=1,
                                         models=[{"name": "resnet", "layers": [1, 1, 1, 1]}])))
    spec = load_spec(path)
    again = spec_from_dict(spec.to_dict())
    assert again == spec


def test_unreadable_file_raises(tmp_path):
    with pytest.raises(ConfigError, match="cannot read sweep file"):
        load_spec(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("models: [unclosed")
    with pytest.raises(ConfigError, match="cannot read sweep file"):
        load_spec(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_spec(tmp_path / "list.yaml")
