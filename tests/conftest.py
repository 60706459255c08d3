"""The test run's machine.

- Its own machine cache: ``$HIREMATE_CACHE`` points at a directory made for this run, so no
  test reads menus or a roofline fit that an earlier run (or the user) left in
  ``~/.cache/hiremate``, and none writes there. The xdist workers inherit it from the
  controller, so the run fits the roofline once per dtype, not once per test (the fit's lock
  makes a second worker wait for the first's); tests that check fitting name their own.
- Its cores shared out: each xdist worker gets its share of the cores as torch's intra-op
  threads (two workers on two cores: one each), not all of them; four threads on two cores
  slowed every test, and the thread count is part of the roofline fit's key, so the run's
  workers (and the interpreters their tests start) also share one fit per dtype.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller's directory, inherited
        import torch

        workers = int(config.workerinput.get("workercount", 1))
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the interpreters tests start, likewise
        return
    directory = tempfile.mkdtemp(prefix="hiremate-test-cache-")
    config.stash[_CACHE] = (directory, os.environ.get("HIREMATE_CACHE"))
    os.environ["HIREMATE_CACHE"] = directory


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE not in config.stash:
        return
    directory, before = config.stash[_CACHE]
    if before is None:
        os.environ.pop("HIREMATE_CACHE", None)
    else:
        os.environ["HIREMATE_CACHE"] = before
    shutil.rmtree(directory, ignore_errors=True)


_CACHE = pytest.StashKey[tuple[str, "str | None"]]()
