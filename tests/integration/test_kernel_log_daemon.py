"""kernel_log inside `hma run`: an Xid line fed through the kmsg path reaches status.json, and a
daemon restart in the same boot (cursor in the SQLite state store) does not count it again."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def faults(status: Path) -> dict[tuple[str, str], Any]:
    try:
        doc = json.loads(status.read_text())
    except (OSError, ValueError):
        return {}
    return {(f["code"], f["component"]): f for f in doc.get("faults", [])}


class Daemon:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.status = base / "run" / "status.json"
        self.log = open(base / "daemon.log", "a")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "HMA_CONFIG": str(base / "hma.toml")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"], env=env, stdout=self.log, stderr=self.log
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.fd = os.open(base / "kmsg", os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                assert exc.errno == errno.ENXIO, exc
                assert self.proc.poll() is None, (base / "daemon.log").read_text()
                assert time.monotonic() < deadline, "daemon did not open the kmsg path"
                time.sleep(0.05)

    def write(self, seq: int, text: str) -> None:
        os.write(self.fd, f"4,{seq},{seq * 1000},-;{text}\n".encode())

    def wait_for(self, key: tuple[str, str]) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        while key not in faults(self.status):
            assert self.proc.poll() is None, (self.base / "daemon.log").read_text()
            assert time.monotonic() < deadline, f"{key} not in status.json"
            time.sleep(0.02)
        return faults(self.status)[key]

    def stop(self) -> None:
        os.close(self.fd)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()


@pytest.mark.timeout(90)
def test_xid_reaches_status_and_is_not_recounted_after_a_restart(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "kmsg")
    (tmp_path / "hma.toml").write_text(
        f'[agent]\nstate_dir = "{tmp_path}/state"\nrun_dir = "{tmp_path}/run"\n'
        f'probes_dir = "{tmp_path}/probes.d"\n[probes.system]\nenabled = false\n'
        f'[sources.kernel_log]\npath = "{tmp_path}/kmsg"\nbackend = "kmsg"\n'
        f'rules_dir = "{tmp_path}/rules.d"\n'
    )
    xid79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, off the bus"
    first = Daemon(tmp_path)
    try:
        first.write(1, "eth0: link up")
        first.write(2, xid79)
        fault = first.wait_for(("GPU_XID_79", "gpu:0000:3b:00"))
    finally:
        first.stop()
    assert fault["severity"] == "critical" and fault["probe"] == "kernel_log"
    assert fault["count"] == 1 and fault["details"]["line"] == xid79
    second = Daemon(tmp_path)
    try:
        # The ring buffer is replayed from its start after a restart: 1 and 2 must be skipped.
        second.write(1, "eth0: link up")
        second.write(2, xid79)
        second.write(3, "NVRM: Xid (PCI:0000:5d:00): 48, pid=1, name=python3, DBE")
        second.wait_for(("GPU_XID_48", "gpu:0000:5d:00"))
        again = faults(second.status)[("GPU_XID_79", "gpu:0000:3b:00")]
    finally:
        second.stop()
    assert again["count"] == 1


def gpu_sysfs(root: Path) -> Path:
    """A sysfs root with one NVIDIA GPU (PCI vendor 0x10de, 3D controller) and nothing else."""
    dev = root / "bus" / "pci" / "devices" / "0000:3b:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    return root


@pytest.mark.timeout(90)
def test_a_kernel_log_that_cannot_be_read_is_shown_and_warned_on_a_gpu_node(
    tmp_path: Path,
) -> None:
    """``backend = "kmsg"`` where the path cannot be read, on a node with a GPU: status.json
    and ``hma status`` show the source not applicable and why (in the backend's words, not
    "systemd-python is not installed"), the metric says so and the verdict has the warning."""
    prom = tmp_path / "hma.prom"
    (tmp_path / "hma.toml").write_text(
        f'[agent]\nstate_dir = "{tmp_path}/state"\nrun_dir = "{tmp_path}/run"\n'
        f'probes_dir = "{tmp_path}/probes.d"\n[probes.system]\nenabled = false\n'
        f'[paths]\nsysfs = "{gpu_sysfs(tmp_path / "sys")}"\n'
        f'[sources.kernel_log]\npath = "{tmp_path}/no-kmsg"\nbackend = "kmsg"\n'
        f'rules_dir = "{tmp_path}/rules.d"\n'
        f'[reporters.prometheus]\nenabled = true\ntextfile = "{prom}"\n'
    )
    env = {**os.environ, "HMA_CONFIG": str(tmp_path / "hma.toml")}
    log = open(tmp_path / "daemon.log", "a")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "hma", "run"], env=env, stdout=log, stderr=log)
    try:
        key = ("HMA_KERNEL_LOG_BLIND", "source:kernel_log")
        deadline = time.monotonic() + 30
        while key not in faults(tmp_path / "run" / "status.json"):
            assert proc.poll() is None, (tmp_path / "daemon.log").read_text()
            assert time.monotonic() < deadline, "no HMA_KERNEL_LOG_BLIND in status.json"
            time.sleep(0.05)
        # the warning is in the verdict (the node's own severity also counts the GPU probes,
        # unknown on this driverless root, and whatever a probe slowed by load says)
        assert faults(tmp_path / "run" / "status.json")[key]["severity"] == "warning"
        doc = json.loads((tmp_path / "run" / "status.json").read_text())
        [source] = [s for s in doc["sources"] if s["name"] == "kernel_log"]
        assert source["state"] == "not-applicable"
        assert source["reason"].startswith(f"backend = kmsg, but {tmp_path}/no-kmsg cannot be")
        assert "systemd-python" not in source["reason"]
        shown = subprocess.run(
            [sys.executable, "-m", "hma", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        assert "Event sources" in shown and "not-applicable" in shown, shown
        deadline = time.monotonic() + 20
        wanted = 'hma_source_state{source="kernel_log",state="not-applicable"} 1.0'
        while not (prom.exists() and wanted in prom.read_text()):
            assert time.monotonic() < deadline, prom.read_text() if prom.exists() else "no .prom"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
