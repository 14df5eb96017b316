"""`hma run` with the GPU parts: the gpu probe in its worker over the stand-in NVML library, the
nvml_events source, and the kernel_log source on a FIFO. One Xid seen through NVML and through
the kernel log is one fault in status.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import Env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standin"))
import nvmlstub  # noqa: E402


def _faults(env: Env) -> list[dict[str, Any]]:
    try:
        return [f for f in env.status().get("faults", []) if f["active"]]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def _wait(cond: Callable[[], bool], proc: subprocess.Popen, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.timeout(120)
def test_gpu_probe_and_one_xid_through_two_sources(hma_env: Env, tmp_path: Path) -> None:
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) to build the stand-in NVML library")
    lib = nvmlstub.build(tmp_path / "lib")
    scenario = nvmlstub.Scenario(tmp_path / "scenario.txt")
    for i in range(8):
        scenario.drop(i, "fabric")  # no NVSwitch fabric: no fabric manager expected
    scenario.dev(5, remap="0 1 1 0")
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    kmsg = os.open(fifo, os.O_RDWR)  # keeps the FIFO open without blocking
    hma_env.write(
        f'[probes.gpu]\nlibrary = "{lib}"\nexpected_gpus = 8\n'
        "[probes.nvidia_smi]\nenabled = false\n"
        "[probes.system]\nfilesystems = []\n"
        f'[sources.nvml_events]\nlibrary = "{lib}"\nwait_ms = 50\n'
        f'[sources.kernel_log]\npath = "{fifo}"\nbackend = "kmsg"\n'
        f'rules_dir = "{tmp_path / "rules.d"}"\n'
    )
    environ = hma_env.env()
    environ[nvmlstub.ENV] = str(scenario.path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hma", "run"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # the gpu probe ran in its worker: row remap pending on GPU 5 is an active fault
        _wait(lambda: any(f["code"] == "GPU_ROW_REMAP_PENDING" for f in _faults(hma_env)), proc)
        (remap,) = [f for f in _faults(hma_env) if f["code"] == "GPU_ROW_REMAP_PENDING"]
        assert remap["component"] == "gpu:0000:ab:00" and remap["action"] == "reboot"

        # the event set only sees events made after it: repeat until the NVML source listens
        def nvml_xid_seen() -> bool:
            scenario.push_xid(6, 79)
            time.sleep(0.2)
            return any(f["code"] == "GPU_XID_79" for f in _faults(hma_env))

        _wait(nvml_xid_seen, proc)
        line = (
            "NVRM: Xid (PCI:0000:ba:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus."
        )
        os.write(kmsg, f"3,1001,{int(time.monotonic() * 1e6)},-;{line}\n".encode())
        _wait(
            lambda: any(
                f["code"] == "GPU_XID_79" and f["probe"] == "kernel_log" for f in _faults(hma_env)
            ),
            proc,
            timeout=10,
        )
        xids = [f for f in _faults(hma_env) if f["code"].startswith("GPU_XID_")]
        # one fault, seen first through NVML, then updated by the kernel line
        assert [(f["code"], f["component"]) for f in xids] == [("GPU_XID_79", "gpu:0000:ba:00")]
        assert xids[0]["count"] >= 2 and xids[0]["details"]["source"] == "kernel_log"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out = proc.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        os.close(kmsg)
    assert proc.returncode == 0, out


@pytest.mark.timeout(120)
def test_the_daemon_judges_against_what_genconf_recorded(hma_env: Env, tmp_path: Path) -> None:
    """`hma genconf` records the 8 GPUs; the running daemon, reading that drop-in, makes a GPU
    gone later a critical fault (without the drop-in nothing says how many there should be)."""
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) to build the stand-in NVML library")
    lib = nvmlstub.build(tmp_path / "lib")
    scenario = nvmlstub.Scenario(tmp_path / "scenario.txt")
    for i in range(8):
        scenario.drop(i, "fabric")  # no NVSwitch fabric: no fabric manager expected
    off = ("nvidia_smi", "system", "efa", "efa_mesh", "infiniband", "neuron", "slurm")
    hma_env.write(
        f'[probes.gpu]\nlibrary = "{lib}"\ninterval = 0.5\n'
        + "".join(f"[probes.{name}]\nenabled = false\n" for name in off)
        + "[slurm]\nenabled = false\n"
    )
    environ = hma_env.env()
    environ[nvmlstub.ENV] = str(scenario.path)
    done = subprocess.run(
        [sys.executable, "-m", "hma", "genconf"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    recorded = hma_env.base / "hma.d" / "50-genconf.toml"
    assert "expected_gpus = 8" in recorded.read_text()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hma", "run"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def gpu_ran() -> bool:
            try:
                probes = hma_env.status().get("probes", [])
            except (FileNotFoundError, json.JSONDecodeError):
                return False
            return any(p.get("name") == "gpu" and p.get("status") == "ran" for p in probes)

        _wait(gpu_ran, proc)
        assert _faults(hma_env) == []
        scenario.devices.pop(7)  # a GPU gone
        scenario.write()
        _wait(lambda: any(f["code"] == "GPU_COUNT_MISMATCH" for f in _faults(hma_env)), proc)
        (fault,) = _faults(hma_env)
        assert fault["severity"] == "critical" and fault["details"]["expected"] == 8
        assert hma_env.hma("status").returncode == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out = proc.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
    assert proc.returncode == 0, out
