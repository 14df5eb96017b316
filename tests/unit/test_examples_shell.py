"""The example job scripts in docs/examples/ (docs/auto-resume.md): valid bash, shellcheck-clean
where shellcheck is installed (scripts/apt-packages.txt lists it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "docs" / "examples").glob("*.sh"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_script_is_clean(script: Path) -> None:
    proc = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed")
    proc = subprocess.run(
        ["shellcheck", str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout
