"""`make demo` end to end (scripts/demo.py): every step of the timeline happens, in order, and
everything is torn down; a step that does not happen fails the demo, naming the step."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import simnode
from tests.slurmcluster import _pids_naming, available
from tests.standin import nvmlstub

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.py"
STEPS = [
    "slurm",
    "node",
    "agent-started",
    "detected",
    "drained",
    "reboot-issued",
    "rebooted",
    "healthy",
    "resumed",
    "done",
]
STEP_LINE = re.compile(r"^\[\+\s*[\d.]+s\] STEP ([a-z-]+): ", re.M)


@pytest.fixture(autouse=True)
def _needs() -> None:
    why = available()
    if why:
        pytest.skip(why)
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) for the stand-in NVML library")


def assert_torn_down(output: str) -> None:
    """The demo's folder (Slurm and the simulated node) is gone, and every process naming it."""
    (folder,) = re.findall(r"files under (/\S+)\)", output)
    assert not Path(folder).exists(), f"{folder} left behind"
    assert _pids_naming(folder) == [], f"processes of {folder} left running"


@pytest.mark.timeout(150)
def test_demo_runs_every_step_and_cleans_up() -> None:
    proc = subprocess.run(
        [sys.executable, str(DEMO)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert STEP_LINE.findall(proc.stdout) == STEPS, out
    detected = proc.stdout.split("STEP detected:", 1)[1].splitlines()[0]
    assert "GPU_XID_79 on gpu:0000:5d:00" in detected and "GPU_LOST on gpu:0000:5d:00" in detected
    assert "HMA: GPU_XID_79 gpu:0000:5d:00 : reboot issued" in proc.stdout  # sinfo -R
    resumed = proc.stdout.split("STEP resumed:", 1)[1]
    assert "(actions: drain, reboot, resume; 1 reboot)" in resumed.splitlines()[0]
    assert "resume done" in resumed and "HMA: GPU_XID_79" not in resumed.split("$ sinfo", 1)[1]
    assert_torn_down(proc.stdout)


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hma_demo_script", DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(90)
def test_a_step_that_does_not_happen_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = load_demo()
    monkeypatch.setattr(demo, "STEP_TIMEOUT", 5.0)
    monkeypatch.setitem(simnode.RECOVERY, "policy", "none")  # labels only: never drains
    assert demo.main() == 1
    out = capsys.readouterr().out
    assert STEP_LINE.findall(out) == STEPS[:4], out
    assert "demo: FAILED at step drained: no p5-002 drained with an HMA: reason" in out
    assert_torn_down(out)
