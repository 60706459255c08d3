"""Cache entries and schedule pools are data: JSON written and read back field by field, never
a pickle, so a file planted in a shared cache directory cannot run code in a reader."""

from __future__ import annotations

import json
import logging
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

import hiremate
from hiremate.api import solve_graph
from hiremate.composer import menu_cache as mc
from hiremate.composer.menu_cache import (
    CACHE_VERSION, MenuCache, decode_menu, decode_pool, decode_solve, encode_menu, encode_pool,
    encode_solve,
)
from hiremate.composer.pool import SchedulePool, pool_key
from hiremate.config import load_config
from hiremate.errors import FormatError, InvalidScheduleError
from hiremate.ir.graph import graph_key
from hiremate.ir.option import Option, option_from_dict, option_to_dict
from hiremate.ir.schedule import Compute, Delete, schedule_from_list, schedule_to_list
from hiremate.solvers.menu import option_from_schedule
from hiremate.testing.synthetic import chain_graph, random_graph
from test_registry import residual_chain

FAST = {"progress": False, "n_jobs": 1,
        "solver_params": {"hilp": {"time_limit": 2.0}, "rk-rotor": {"slots": 100}}}


def hier(cache_dir: Path, **kw):
    """The default preset on its hierarchical path (menus, pool and top entry all cached)."""
    return load_config("hiremate", flat_max_nodes=0, cache=True, cache_dir=str(cache_dir),
                       **{**FAST, **kw})


class Payload:
    """Unpickling this creates ``marker``: the stand-in for code an attacker would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def malicious_pickle(marker: Path) -> bytes:
    data = pickle.dumps(Payload(marker))
    probe = marker.with_name(marker.name + ".probe")  # the payload is live: loading runs it
    pickle.loads(pickle.dumps(Payload(probe))).close()
    assert probe.exists()
    probe.unlink()
    return data


class KeyRecorder(MenuCache):
    """A cache that remembers the keys looked up (to plant files where entries would be)."""

    keys: list = []

    def get(self, key, decode=None):
        KeyRecorder.keys.append(key)
        return super().get(key, decode)


# -- round trips -----------------------------------------------------------------------------------
def _options() -> list[Option]:
    g = random_graph(4, 12)
    opts = [option_from_schedule(g, hiremate.autodiff_schedule(g), "autodiff")]
    from hiremate.solvers.twremat import TWRemat

    return opts + TWRemat().menu(g)[:3]


def test_schedule_round_trip_and_malformed_steps():
    sched = (Compute(0), Compute(3, 1), Delete(2), Compute(7, None))
    assert schedule_from_list(json.loads(json.dumps(schedule_to_list(sched)))) == sched
    for bad, step in (([["C", 0, None], ["X", 1]], 1), ([["C", -1, None]], 0),
                      ([["D", "3"]], 0), ([["C", 1]], 0), ([["D", True]], 0)):
        with pytest.raises(InvalidScheduleError, match=f"step {step}") as info:
            schedule_from_list(bad)
        assert info.value.step == step
    with pytest.raises(InvalidScheduleError):
        schedule_from_list("C0 D1")


def test_option_round_trip():
    opts = _options()
    assert len(opts) >= 2 and any(o.fwd_profile for o in opts)
    for o in opts:
        data = option_to_dict(o)
        back = option_from_dict(json.loads(json.dumps(data)))
        assert back == o and isinstance(back.fwd, tuple) and isinstance(back.fwd_profile, tuple)
    # numpy figures (as a solver may compute them) become plain numbers
    o = opts[0]
    np_opt = Option(o.fwd, o.bwd, np.float64(o.fwd_time), o.bwd_time, np.int64(o.fwd_peak),
                    o.bwd_peak, o.phantom, tuple(np.int64(v) for v in o.fwd_profile),
                    o.bwd_profile, o.solver)
    assert option_from_dict(json.loads(json.dumps(option_to_dict(np_opt)))) == o


@pytest.mark.parametrize("change", [
    lambda d: d.pop("phantom"), lambda d: d.update(extra=1), lambda d: d.update(fwd_peak=1.5),
    lambda d: d.update(fwd_peak="7"), lambda d: d.update(bwd_time="fast"),
    lambda d: d.update(fwd_profile=[1, None]), lambda d: d.update(fwd=[["E", 1]]),
    lambda d: d.update(solver=3), lambda d: d.update(bwd_peak=True),
])
def test_option_from_dict_rejects_malformed_fields(change):
    data = option_to_dict(_options()[0])
    change(data)
    with pytest.raises(FormatError):
        option_from_dict(data)
    with pytest.raises(FormatError):
        option_from_dict([data])


def test_every_stored_kind_round_trips_through_the_cache(tmp_path):
    cache = MenuCache(tmp_path)
    opts = _options()
    cache.put({"kind": "menu", "n": 1}, encode_menu(opts, ""))
    cache.put({"kind": "menu", "n": 2}, encode_menu([], "not applicable"))
    assert cache.get({"kind": "menu", "n": 1}, decode=decode_menu) == (opts, "")
    assert cache.get({"kind": "menu", "n": 2}, decode=decode_menu) == ([], "not applicable")

    g = residual_chain(3)
    res = solve_graph(g, 0.7, load_config("hiremate", cache=False, **FAST))
    cache.put({"kind": "solve"}, encode_solve(res.schedule, res.report))
    sched, report = cache.get({"kind": "solve"}, decode=decode_solve)
    assert sched == res.schedule and report == res.report  # JSON keeps every report field

    sims = [(s, hiremate.simulate(g, s)) for s in (res.schedule, hiremate.autodiff_schedule(g))]
    cache.put({"kind": "pool"}, encode_pool([(s, sim.peak, sim.time, f"src{i}")
                                             for i, (s, sim) in enumerate(sims)]))
    assert cache.get({"kind": "pool"}, decode=decode_pool) == [
        (s, f"src{i}") for i, (s, _) in enumerate(sims)]
    files = sorted(tmp_path.rglob("*"))
    assert [f for f in files if f.is_file()] and all(
        f.suffix == ".json" for f in files if f.is_file())
    entry = json.loads(next(f for f in files if f.is_file()).read_text())
    assert entry["format"] == mc.FORMAT and entry["version"] == CACHE_VERSION == 3


def test_pool_round_trip(tmp_path):
    g = chain_graph([100] * 6, [1.0] * 6)
    pool = SchedulePool(g, MenuCache(tmp_path), pool_key(graph_key(g), {"x": 1}))
    ad = hiremate.autodiff_schedule(g)
    sim = hiremate.simulate(g, ad)
    assert pool.record([(ad, sim, "autodiff")]) == 1
    again = SchedulePool(g, MenuCache(tmp_path), pool_key(graph_key(g), {"x": 1}))
    (sched, sim2, src), = again.fitting(sim.peak)
    assert sched == ad and sim2.peak == sim.peak and src == "autodiff"


# -- what is not data is neither stored nor read --------------------------------------------------
def test_value_that_is_not_data_is_not_stored(tmp_path, caplog):
    cache = MenuCache(tmp_path)
    with caplog.at_level(logging.WARNING, logger=mc.__name__):
        cache.put({"k": 1}, {"obj": object()})
    assert "not plain data" in caplog.text and not list(tmp_path.rglob("*.json"))
    assert cache.get({"k": 1}) is None


@pytest.mark.parametrize("content", [
    b"\x80\x04not json", b'{"format": "hiremate-cache", "version": 2, "key": "", "value": 1}',
    b'{"format": "other", "version": 3}', b"[1, 2]",
])
def test_foreign_or_old_file_is_a_miss_with_a_warning(tmp_path, content):
    cache = MenuCache(tmp_path)
    path = cache.path({"k": 1})
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert cache.get({"k": 1}) is None
    assert not path.exists() and cache.misses == 1


def test_entry_failing_its_decoder_is_a_miss(tmp_path):
    cache = MenuCache(tmp_path)
    cache.put({"k": 1}, {"options": [{"fwd": "rm -rf"}], "error": ""})
    with pytest.warns(RuntimeWarning, match="stored option"):
        assert cache.get({"k": 1}, decode=decode_menu) is None
    assert not cache.path({"k": 1}).exists()


def test_planted_pickle_is_never_loaded_by_a_lookup(tmp_path):
    marker = tmp_path / "pwned"
    cache = MenuCache(tmp_path / "cache")
    key = {"kind": "menu", "graph": "g"}
    for path in (cache.path(key), cache.legacy_path(key)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(malicious_pickle(marker))
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert cache.get(key, decode=decode_menu) is None
    with pytest.warns(RuntimeWarning, match="pickle format of an earlier version"):
        assert cache.get(key, decode=decode_menu) is None  # now the legacy file is reported
    assert not marker.exists()
    assert not cache.path(key).exists() and not cache.legacy_path(key).exists()


@pytest.mark.parametrize("where", ["entries", "legacy"])
def test_planted_pickles_never_run_in_a_full_solve(tmp_path, monkeypatch, where):
    """Every entry a solve reads (menus, schedule pool, solved schedule) replaced by a pickle
    whose loading would create a marker file, at the entry's own path or at the path an
    earlier, pickle-based version read: the solve runs nothing and returns what a solve with
    an empty cache returns."""
    g = residual_chain(4)
    marker = tmp_path / "pwned"
    payload = malicious_pickle(marker)
    monkeypatch.setattr(mc, "MenuCache", KeyRecorder)  # solve_graph imports it at each call
    KeyRecorder.keys = []
    planted_dir = tmp_path / "planted"
    # a solve with an empty cache: the reference, and the keys a solve looks up
    reference = solve_graph(g, 0.6, hier(tmp_path / "probe"))
    keys = list(KeyRecorder.keys)
    kinds = {k.get("kind") for k in keys}
    assert {"menu", "solve", "schedule-pool"} <= kinds
    probe = KeyRecorder(planted_dir)
    for key in keys:
        path = probe.path(key) if where == "entries" else probe.legacy_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = solve_graph(g, 0.6, hier(planted_dir))
    assert not marker.exists()
    assert result.schedule == reference.schedule and not result.report["cached"]
    sim = hiremate.simulate(g, result.schedule)
    assert sim.valid and sim.peak <= result.report["budget"]
    expected = "unreadable" if where == "entries" else "pickle format"
    assert sum(expected in str(w.message) for w in caught) >= len({json.dumps(k, sort_keys=True)
                                                                  for k in keys})
    assert not list(planted_dir.rglob("*.pkl"))
    for f in planted_dir.rglob("*.json"):  # what the solve wrote back is data
        assert json.loads(f.read_text())["version"] == CACHE_VERSION


def test_no_pickle_reads_files_in_the_library():
    """pickle appears only where a process exchanges its own values with a child it started
    (the H-ILP backend's subprocess); nothing read from disk is unpickled."""
    root = Path(__file__).resolve().parents[1]
    users = sorted(p.relative_to(root).as_posix()
                   for top in ("hiremate", "graphbuilder", "partition", "solvers")
                   for p in (root / top).rglob("*.py")
                   if "import pickle" in p.read_text(encoding="utf-8"))
    assert users == ["solvers/hilp/backends.py"]


def test_entries_of_other_solver_code_are_misses(tmp_path, monkeypatch):
    """A menu or schedule cached by other solver code (an upgrade, an edited solver) is not
    reused: the key holds a digest of the solving packages' source, so the entry is a miss,
    and the same code finds its own entries again."""
    g = residual_chain(4)
    first = solve_graph(g, 0.6, hier(tmp_path))
    again = solve_graph(g, 0.6, hier(tmp_path))
    assert again.report["cached"] and again.schedule == first.schedule
    revision = mc.solving_code_revision()
    assert len(revision) == 16 and revision == mc.solving_code_revision()
    monkeypatch.setattr(mc, "solving_code_revision", lambda: "other-solver-code")
    other = solve_graph(g, 0.6, hier(tmp_path))
    # only the hits a cold solve has (identical subgraphs within it) remain
    assert not other.report["cached"]
    assert (other.report["cache_hits"], other.report["cache_misses"]) == \
        (first.report["cache_hits"], first.report["cache_misses"])
    assert other.schedule == first.schedule
