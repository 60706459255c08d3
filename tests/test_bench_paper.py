"""The paper benchmarks' helpers (bench/paper_common.py): ``--set`` parsing, the configuration
they solve with, the lower bound's kinds and the gap."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

import hiremate
from hiremate.errors import ConfigError
from hiremate.testing.synthetic import random_graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import paper_common  # noqa: E402


def test_parse_sets_nests_dotted_keys_and_reads_yaml():
    sets = paper_common.parse_sets(["flat_max_nodes=0", "solver_params.hilp-top.time_limit=5",
                                    "top=[hilp-top]", "partitioner_params={max_top: 8}"])
    assert sets == {"flat_max_nodes": 0, "solver_params": {"hilp-top": {"time_limit": 5}},
                    "top": ["hilp-top"], "partitioner_params": {"max_top": 8}}
    with pytest.raises(ValueError):
        paper_common.parse_sets(["no-equals"])
    with pytest.raises(ValueError):
        paper_common.parse_sets(["a=1", "a.b=2"])


def test_make_config_merges_defaults_then_overrides_into_the_preset():
    cfg = paper_common.make_config("hiremate", ["solver_params.hilp-top.time_limit=5",
                                                "calibrate=1"], cache=False, calibrate=0)
    preset = hiremate.load_config("hiremate")
    assert cfg.cache is False and cfg.calibrate == 1
    # dotted keys merge into the preset's mapping (its other hilp-top keys stay)
    assert cfg.solver_params["hilp-top"] == {**preset.solver_params["hilp-top"], "time_limit": 5}
    # the other solvers' parameters are the preset's
    assert cfg.solver_params["hilp"] == preset.solver_params["hilp"]
    with pytest.raises(ConfigError):
        paper_common.make_config("hiremate", ["no_such_key=1"])


def test_lower_bound_kinds_and_gap():
    from hiremate.solvers.hilp.moment_bound import moment_time_bound

    g = random_graph(3, 8)
    ad = hiremate.simulate(g, hiremate.autodiff_schedule(g))
    from hiremate.ir.tracker import memory_floor

    half = (memory_floor(g) + ad.peak) // 2
    cut, kind, _ = paper_common.lower_bound(g, half, max_nodes=0, time_limit=10)
    assert kind == "moment" and cut == moment_time_bound(g, half) > ad.time
    none, kind, _ = paper_common.lower_bound(g, memory_floor(g) - 1, 0, 10)
    assert kind == "memory floor" and none == math.inf
    free, kind, _ = paper_common.lower_bound(g, ad.peak, max_nodes=10 ** 6, time_limit=10)
    assert kind in ("LP", "moment") and free == pytest.approx(ad.time)
    tight, kind, _ = paper_common.lower_bound(g, half, 10 ** 6, 10)
    assert kind in ("LP", "moment", "LP infeasible") and tight >= cut
    assert paper_common.gap(1.1, 1.0) == pytest.approx(0.1)
    assert math.isnan(paper_common.gap(1.0, math.inf))


@pytest.mark.slow  # three subprocesses, each importing torch, and a solve (29 s)
def test_paper_gpu_phases_round_trip_through_the_cache(tmp_path):
    """``bench/paper_gpu.py``'s capture, solve and execute (here on the CPU, FLOP costs, a
    small size): the schedule solved in one process is read back from the cache in another
    (no second solve), runs within its budget and gives eager's gradients."""
    import json
    import subprocess

    script = Path(__file__).resolve().parents[1] / "bench" / "paper_gpu.py"
    common = ["--out", str(tmp_path), "--device", "cpu", "--scale", "unet=8,2",
              "--set", "polish=[]", "--set", "menu_peaks=3", "--set", "menu_saves=1"]
    # budget 0.8 of the autodiff peak: the round trip is what is tested, and there the solve
    # takes half the time it takes at the default 0.5
    for phase, extra in (("capture", ["--cost", "flops", "--rounds", "1"]),
                         ("solve", ["--budget", "0.8"]),
                         ("execute", ["--rounds", "1", "--budget", "0.8"])):
        # the model's name before the options, and after them (as bench/paper_gpu_all.sh has it)
        args = [phase, "unet", *common, *extra] if phase != "execute" else [
            phase, *common, *extra, "unet"]
        subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True,
                       timeout=600)
    rows = {name: json.loads((tmp_path / f"{name}.jsonl").read_text().splitlines()[-1])
            for name in ("capture", "solve", "execute")}
    assert all("error" not in row for row in rows.values()), rows
    assert rows["capture"]["cost"] == "flops" and rows["capture"]["compute_nodes"] > 0
    run = rows["execute"]
    assert run["cache_hits"] >= 1 and run["solver"] == rows["solve"]["solver"]
    assert run["predicted_relative_time"] == rows["solve"]["relative_time"]
    assert run["measured_peak_over_budget"] <= 1.02
    assert run["max_grad_diff_relative"] < 1e-5


@pytest.mark.slow  # two solves of a paper-size model in subprocesses (26 s)
def test_paper_table_solves_a_saved_build_again(tmp_path):
    """``--save-graphs`` keeps a measured-cost build that ``--graphs`` solves again: the same
    graph (no build) and, the solve being deterministic, the same figures, where a rebuild's
    timings would move them."""
    import json
    import subprocess

    script = Path(__file__).resolve().parents[1] / "bench" / "paper_table.py"
    light = ["fno1d", "--json", "--lp-max-nodes", "0", "--n-jobs", "1", "--set", "polish=[]",
             "--set", "menu_peaks=2", "--set", "menu_saves=1"]
    rows = []
    for extra in (["--cost", "measured", "--save-graphs", str(tmp_path)],
                  ["--graphs", str(tmp_path)]):
        done = subprocess.run([sys.executable, str(script), *light, *extra], check=True,
                              capture_output=True, text=True, timeout=600)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    built, again = rows
    assert (tmp_path / "fno1d.graph").exists() and "error" not in built, built
    assert built["build_s"] > 0 and again["build_s"] == 0
    assert again["cost"] == built["cost"] == "measured"
    for key in ("compute_nodes", "budget", "solver", "relative_time", "lower_bound"):
        assert again[key] == built[key], key
