"""Fixtures for the GPU tests: the stand-in NVML library (built once per session with cc), a
scenario file per test, the stand-in nvidia-smi, and a real process named like the fabric manager.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

STANDIN = Path(__file__).resolve().parents[2] / "standin"
sys.path.insert(0, str(STANDIN))

import nvmlstub  # noqa: E402


@pytest.fixture(scope="session")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of the compiled stand-in libnvidia-ml.so.1 (skips without a C compiler)."""
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) to build the stand-in NVML library")
    return nvmlstub.build(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvml_lib: Path) -> Any:
    """A healthy 8x H100 scenario, named by $HMA_NVML_SCENARIO for this test."""
    sc = nvmlstub.Scenario(tmp_path / "scenario.txt")
    monkeypatch.setenv(nvmlstub.ENV, str(sc.path))
    return sc


def _wait_for_comm(pid: int, comm: str) -> None:
    """Wait until the process's comm is ``comm``: Popen returns once the exec closed its
    close-on-exec pipe, which the kernel does before it renames the task."""
    deadline = time.monotonic() + 10.0
    path = Path(f"/proc/{pid}/comm")
    while path.read_text().rstrip("\n") != comm:
        assert time.monotonic() < deadline, f"process {pid} never became {comm}"
        time.sleep(0.01)


@pytest.fixture
def fabricmanager(tmp_path: Path) -> Iterator[int]:
    """A real process whose comm is nv-fabricmanage(r): a copy of sleep under that name."""
    exe = tmp_path / "nv-fabricmanager"
    sleep = shutil.which("sleep")
    assert sleep is not None
    shutil.copy(sleep, exe)
    proc = subprocess.Popen([str(exe), "300"])
    try:
        _wait_for_comm(proc.pid, "nv-fabricmanage")
        yield proc.pid
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
