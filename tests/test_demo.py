"""The README's first command ends with ``hiremate demo``, installed without optional extras:
the demo's default model must not need ``transformers``."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys
sys.modules["transformers"] = None  # importing it now raises ImportError, as where it is absent
from hiremate.cli import main
raise SystemExit(main(["demo"]))
"""


def test_demo_runs_without_transformers():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "hiremate demo on the zoo's 'mlp'" in done.stdout
    assert "peak activation memory (measured)" in done.stdout
