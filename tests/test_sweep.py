"""End-to-end tests of sweeps: the smoke sweep's files and their consistency, resumability,
failures as records, the dask backend, plots and the command line."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from hiremate import cli, measure, zoo
from hiremate.sweep import methods as sweep_methods, runner as sweep_runner
from hiremate.errors import ConfigError
from hiremate.sweep.driver import replot, run_sweep
from hiremate.sweep.plot import model_figure
from hiremate.sweep.runner import grid
from hiremate.sweep.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "sweeps" / "smoke.yaml"
TIMING_FIELDS = {"measured_time", "time_rel", "time_rel_unpaired", "eager_time", "solve_time",
                 "setup_time", "cell_time", "predicted_time", "extra", "message"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke sweep, run once for the tests of this module."""
    out = tmp_path_factory.mktemp("smoke")
    outcome = run_sweep(SMOKE, out, progress=False)
    return out, outcome


def test_smoke_writes_every_file(smoke):
    out, outcome = smoke
    spec = load_spec(SMOKE)
    for name in ("results.json", "results.csv", "results.md"):
        assert (out / name).is_file()
    pngs = sorted(out.glob("*.png"))
    assert [p.stem for p in pngs] == [m.label for m in spec.models]
    import matplotlib.image

    image = matplotlib.image.imread(pngs[0])
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    eager, rest = grid(spec)
    assert sorted(outcome.ran) == sorted(c.key for c in eager + rest)
    assert outcome.skipped == []


def test_hiremate_cells_share_a_presolved_graph_and_go_down_with_the_budget(smoke):
    """The presolve captured one graph per model and solved every budget first; each hiremate
    cell's solve time counts it, and the predicted peaks only go down with the budget."""
    out, _ = smoke
    spec = load_spec(SMOKE)
    cells = json.loads((out / "results.json").read_text())["cells"]
    for model in spec.models:
        assert (out / "graphs" / f"{model.label}.json").is_file()
        for method in spec.methods:
            recs = sorted((r for r in cells.values() if r["model"] == model.label
                           and r["method"] == method and r["kind"] == "hiremate"
                           and r["status"] == "ok"), key=lambda r: r["budget_bytes"])
            for r in recs:
                assert r["solve_time"] >= r["extra"]["presolve_time"] > 0
            peaks = [r["predicted_peak"] for r in recs]
            assert peaks == sorted(peaks)
    assert any((out / "cache").rglob("*.json"))


def test_smoke_json_is_consistent(smoke):
    out, _ = smoke
    payload = json.loads((out / "results.json").read_text())
    spec = load_spec(SMOKE)
    assert payload["spec"] == spec.to_dict()
    cells = payload["cells"]
    eager, rest = grid(spec)
    assert set(cells) == {c.key for c in eager + rest}
    tol = spec.tolerance
    for model in spec.models:
        ref = cells[f"{model.label}|-|eager"]
        assert ref["status"] == "ok" and ref["peak_rel"] == 1.0 and ref["time_rel"] == 1.0
        # an independent measurement of the same model: memory figures are deterministic
        m, sample = model.build(torch.float32)
        torch.set_num_threads(spec.threads or torch.get_num_threads())
        again = measure(m, sample, loss_fn=zoo.output_loss, repeats=1, warmup=0)
        assert again.peak == ref["measured_peak"]
        for key, rec in cells.items():
            if rec["model"] != model.label:
                continue
            assert rec["eager_peak"] == ref["measured_peak"]
            unbudgeted = rec["method"] in ("eager", "checkpoint", "checkpoint_sequential")
            assert (rec["budget"] == "-") == unbudgeted
            if not unbudgeted:
                frac = float(rec["budget"])
                assert rec["budget_bytes"] == math.floor(frac * ref["measured_peak"])
                assert rec["budget_fraction"] == frac
            if rec["status"] == "ok":
                assert rec["peak_rel"] == pytest.approx(rec["measured_peak"] / ref["measured_peak"])
                if unbudgeted and rec["method"] == "eager":
                    assert rec["time_rel"] == 1.0
                else:
                    # eager timed in alternation within the cell (paired_timing, the default)
                    ex = rec["extra"]
                    assert rec["time_rel"] == pytest.approx(
                        ex["paired_time"] / ex["paired_eager_time"])
                    assert rec["time_rel_unpaired"] == pytest.approx(
                        rec["measured_time"] / ref["measured_time"])
                    assert ex["paired_time"] > 0 and ex["paired_eager_time"] > 0
                if not unbudgeted:
                    assert rec["feasible"] == (rec["measured_peak"] <=
                                               rec["budget_bytes"] * (1 + tol))
                else:
                    assert rec["feasible"] is None
            if rec["kind"] == "hiremate" and rec["status"] == "ok":
                # the solver's schedule is within budget by the simulator's count
                assert rec["predicted_peak"] <= rec["budget_bytes"]
                assert rec["solve_time"] >= 0
            if rec["status"] == "infeasible":
                assert rec["feasible"] is False and rec["kind"] == "hiremate"
    methods = {rec["method"] for rec in cells.values()}
    assert methods == set(spec.methods)
    # the mlp is an nn.Sequential: checkpoint_sequential applies to it
    assert cells["mlp-L2-W32|-|checkpoint_sequential"]["status"] == "ok"
    assert cells["mlp-L2-W32|0.5|compile"]["extra"]["activation_memory_budget"] == 0.5


def test_smoke_csv_and_markdown_match_the_json(smoke):
    out, _ = smoke
    cells = json.loads((out / "results.json").read_text())["cells"]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["key"] for r in rows} == set(cells)
    for r in rows:
        rec = cells[r["key"]]
        assert r["status"] == rec["status"]
        if rec.get("measured_peak") is not None:
            assert int(r["measured_peak"]) == rec["measured_peak"]
    md = (out / "results.md").read_text()
    for rec in cells.values():
        row = next(line for line in md.splitlines()
                   if line.startswith(f"| {rec['method']} | {rec['budget']} |"))
        assert f"| {rec['status']} |" in row


def test_second_run_runs_no_cell_again(smoke, tmp_path):
    out, _ = smoke
    copy = tmp_path / "again"
    shutil.copytree(out, copy)
    before = json.loads((copy / "results.json").read_text())["cells"]
    outcome = run_sweep(SMOKE, copy, progress=False)
    assert outcome.ran == []
    assert sorted(outcome.skipped) == sorted(before)
    after = json.loads((copy / "results.json").read_text())["cells"]
    assert after == before
    # drop one finished cell: exactly that one runs again
    payload = json.loads((copy / "results.json").read_text())
    dropped = "mlp-L2-W32|-|checkpoint"
    del payload["cells"][dropped]
    (copy / "results.json").write_text(json.dumps(payload))
    outcome = run_sweep(SMOKE, copy, progress=False)
    assert outcome.ran == [dropped]


def test_the_smoke_plot_has_labelled_axes_and_legend(smoke):
    out, _ = smoke
    cells = json.loads((out / "results.json").read_text())["cells"]
    fig = model_figure("mlp-L2-W32", list(cells.values()))
    ax = fig.axes[0]
    assert "peak" in ax.get_xlabel() and "(" in ax.get_xlabel()
    assert "overhead" in ax.get_ylabel() and "%" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    ok_methods = {r["method"] for r in cells.values() if r["status"] == "ok"}
    assert ok_methods <= set(labels)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_replot_and_cli_plot_redraw_from_json(smoke, tmp_path, capsys):
    out, _ = smoke
    copy = tmp_path / "replot"
    shutil.copytree(out, copy)
    for name in ("results.md", "results.csv", "mlp-L2-W32.png"):
        (copy / name).unlink()
    files = replot(copy)
    assert all(Path(p).is_file() for p in files.values())
    (copy / "results.md").unlink()
    assert cli.main(["plot", str(copy)]) == 0
    assert (copy / "results.md").is_file()
    assert cli.main(["sweep", str(SMOKE), "--out", str(copy), "--no-progress"]) == 0
    assert "0 cells run" in capsys.readouterr().out
    assert cli.main(["plot", str(tmp_path / "nothing")]) == 2


def _tiny_spec(**over):
    data = {"name": "tiny", "models": [{"name": "mlp", "layers": 1, "width": 8}],
            "budgets": [0.5], "methods": ["eager", "checkpoint"], "repeats": 1, "warmup": 0}
    data.update(over)
    return parse_spec(data)


def test_a_failing_cell_is_recorded_and_retried_on_request(tmp_path, monkeypatch):
    def broken(model, sample, spec, twin=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(sweep_methods, "run_checkpoint", broken)
    outcome = run_sweep(_tiny_spec(), tmp_path, progress=False, plots=False)
    rec = outcome.store.cells["mlp-L1-W8|-|checkpoint"]
    assert rec["status"] == "error" and "RuntimeError: boom" in rec["message"]
    assert "boom" in (tmp_path / "results.md").read_text()
    assert run_sweep(_tiny_spec(), tmp_path, progress=False, plots=False).ran == []
    monkeypatch.undo()
    again = run_sweep(_tiny_spec(), tmp_path, progress=False, plots=False, retry_errors=True)
    assert again.ran == ["mlp-L1-W8|-|checkpoint"]
    assert again.store.cells["mlp-L1-W8|-|checkpoint"]["status"] == "ok"


def test_dask_backend_needs_distributed(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_runner, "dask_available", lambda: False)
    with pytest.raises(ConfigError, match="pip install dask distributed"):
        run_sweep(_tiny_spec(), tmp_path, backend="dask", progress=False)


def test_scheduler_needs_the_dask_backend(tmp_path):
    with pytest.raises(ConfigError, match="needs backend 'dask'"):
        run_sweep(_tiny_spec(), tmp_path, scheduler="tcp://127.0.0.1:8786", progress=False)


@pytest.mark.slow  # about a minute on 2 cores: a local cluster, compile in each worker
@pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                    reason="dask.distributed is not installed (pip install dask distributed)")
def test_dask_local_cluster_gives_the_same_table(smoke, tmp_path):
    out, _ = smoke
    outcome = run_sweep(SMOKE, tmp_path, backend="dask", n_jobs=2, progress=False, plots=False)
    ref = json.loads((out / "results.json").read_text())["cells"]
    got = outcome.store.cells
    assert set(got) == set(ref)
    for key, rec in ref.items():
        same = {k: v for k, v in rec.items() if k not in TIMING_FIELDS}
        assert {k: v for k, v in got[key].items() if k not in TIMING_FIELDS} == same, key


def test_equal_peak_comparison_picks_the_fastest_by_paired_ratio():
    """The peer cell at no higher peak is chosen by time relative to eager (paired in its
    cell), not by absolute time measured under another load."""
    from hiremate.sweep.results import best_time_within

    def rec(budget, peak, rel, ms):
        return {"method": "compile", "status": "ok", "budget": budget, "measured_peak": peak,
                "time_rel": rel, "measured_time": ms}

    cells = [rec("0.5", 900, 1.9, 40.0), rec("0.6", 950, 1.4, 60.0), rec("0.9", 2000, 1.0, 30.0)]
    assert best_time_within(cells, "compile", 1000)["budget"] == "0.6"
    assert best_time_within(cells, "compile", 920)["budget"] == "0.5"
    assert best_time_within(cells, "compile", 100) is None


@pytest.mark.parametrize("steps", [0, 6])
def test_floor_budget_is_the_lowest_the_first_preset_meets(tmp_path, steps):
    """``floor``: with ``floor_steps: 0`` the budget that the infeasibility error of a one-byte
    solve guarantees; with bisecting steps a budget at most that, which the preset meets, above
    the highest budget the search found infeasible. The cell at it runs and fits."""
    from hiremate.api import solve_graph
    from hiremate.errors import InfeasibleBudgetError
    from hiremate.ir.graph import Graph
    from hiremate.sweep.presolve import graph_path, loss_bytes_of

    spec = parse_spec({"name": "floor", "models": [{"name": "mlp", "layers": 2, "width": 32}],
                       "budgets": ["floor", 0.9], "methods": ["eager", "rotor"], "repeats": 1,
                       "warmup": 0, "threads": 1, "floor_steps": steps})
    outcome = run_sweep(spec, tmp_path, progress=False, plots=False)
    cell = outcome.store.cells["mlp-L2-W32|floor|rotor"]
    graph = Graph.load(graph_path(tmp_path, "mlp-L2-W32"))
    loss_bytes = loss_bytes_of(grid(spec)[1][0], spec, graph)
    assert loss_bytes > 0  # the zoo's loss keeps a weight and a product as large as the output
    with pytest.raises(InfeasibleBudgetError) as info:
        solve_graph(graph, 1, "rotor", loss_bytes, cache=False)
    guaranteed = info.value.min_budget
    assert cell["status"] == "ok" and cell["budget_bytes"] <= guaranteed
    assert cell["predicted_peak"] <= cell["budget_bytes"]
    assert cell["budget_fraction"] == pytest.approx(cell["budget_bytes"] / cell["eager_peak"])
    assert cell["budget_bytes"] < outcome.store.cells["mlp-L2-W32|0.9|rotor"]["budget_bytes"]
    below = cell["extra"]["floor_infeasible_bytes"]
    # rotor makes each gradient once: its floor is at least that of such schedules
    bound, once = cell["extra"]["floor_bound_bytes"], cell["extra"]["floor_once_bytes"]
    assert bound <= once <= cell["predicted_peak"]
    if steps == 0:
        assert cell["budget_bytes"] == guaranteed and below is None
        assert cell["extra"]["floor_solves"] == 1
    else:
        # the solvers see the whole step, so the error's budget is theirs: no reserve to shed
        assert cell["budget_bytes"] <= guaranteed
        assert below is not None and below < cell["budget_bytes"]
        with pytest.raises(InfeasibleBudgetError):
            solve_graph(graph, below, "rotor", loss_bytes, cache=False)
        assert solve_graph(graph, cell["budget_bytes"], "rotor", loss_bytes,
                           cache=False).report["predicted_peak"] <= cell["budget_bytes"]


def test_floor_budget_needs_a_preset():
    with pytest.raises(ConfigError, match="floor"):
        parse_spec({"models": ["mlp"], "budgets": ["floor"], "methods": ["eager", "compile"]})


def test_floor_budget_needs_a_preset_with_the_loss_outside():
    """The floor is searched on the model's own graph, which holds no loss."""
    with pytest.raises(ConfigError, match="floor"):
        parse_spec({"models": ["mlp"], "budgets": ["floor"], "methods": ["eager", "rotor+loss"]})
    with pytest.raises(ConfigError, match=r"\+loss"):
        parse_spec({"models": ["mlp"], "budgets": [0.5], "methods": ["eager", "nonsense+loss"]})


def test_a_preset_with_the_loss_captured_fits_where_the_loss_outside_cannot(tmp_path):
    """``<preset>+loss`` captures the sweep's loss into the graph: a language model's logits,
    the loss's weighted copy of them and their gradient are then the solvers' to free, so a
    budget that the loss held outside makes infeasible fits, measured with the same harness
    (the module returns the loss), and the cell is never presolved on the model's graph."""
    gpt2 = {"layers": 2, "width": 32, "heads": 2, "seq": 64, "batch": 2, "vocab": 1024}
    spec = _tiny_spec(name="loss", models=[{"factory": "hiremate.zoo.sized:gpt2",
                                             "kwargs": gpt2, "label": "lm"}],
                      budgets=[0.6], methods=["eager", "rotor", "rotor+loss"], threads=1)
    outcome = run_sweep(spec, tmp_path, progress=False, plots=False)
    outside = outcome.store.cells["lm|0.6|rotor"]
    captured = outcome.store.cells["lm|0.6|rotor+loss"]
    assert outside["status"] == "infeasible"
    assert captured["status"] == "ok" and captured["extra"]["loss_captured"] is True
    assert captured["measured_peak"] <= captured["budget_bytes"] * 1.02
    assert captured["predicted_peak"] <= captured["budget_bytes"]
    assert "presolve_time" not in captured["extra"]
