"""`make compat` fails, saying how to get one, when a Python it tests under is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_missing_interpreter_fails_the_target() -> None:
    res = subprocess.run(
        ["make", "-s", "compat", "COMPAT_PYTHONS=2.1 2.2"],  # no machine has them
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode != 0
    assert "find-python: no Python 2.1 found" in res.stderr
    assert "pyenv install 2.1" in res.stderr
    assert "make compat: Python 2.1 2.2 missing" in res.stderr
    assert "bootstrap" not in res.stderr + res.stdout  # checked before anything is built
