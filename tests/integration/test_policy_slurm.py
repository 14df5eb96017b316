"""Per-code policy end to end: `hma run` with Xid lines on a kmsg FIFO, the real Slurm on
loopback, a private journald. Xid 13 set to promote after 3 within an hour drains only when one
GPU repeats it; a code in observe mode alerts "would reboot" and never drains (docs/policy.md)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from conftest import journald_usable, read_back

from tests.integration.remediation_helpers import (  # noqa: F401 (fixtures)
    cluster,
    fresh,
    write_config,
)
from tests.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
GPU3, GPU4, GPU5 = "0000:3b:00", "0000:5d:00", "0000:86:00"


def xid_line(pci: str, xid: int, text: str) -> str:
    return f"NVRM: Xid (PCI:{pci}): {xid}, pid=4242, name=python3, {text}"


class Agent:
    """`hma run` for one node of the cluster, its kernel log a FIFO in kmsg format."""

    def __init__(
        self,
        tmp: Path,
        cluster: SlurmCluster,
        node: str,
        extra: str,
        system: str = "enabled = false\n",
        paths: Optional[dict[str, Any]] = None,
    ) -> None:
        self.tmp, self.node = tmp, node
        self.status = tmp / f"run-{node}" / "status.json"
        fifo = tmp / "kmsg"
        os.mkfifo(fifo)
        cfg = write_config(
            tmp / "hma.toml",
            cluster,
            node,
            paths=paths,
            extra=(
                f"[probes.system]\n{system}"
                f'[sources.kernel_log]\npath = "{fifo}"\nbackend = "kmsg"\n'
                f'rules_dir = "{tmp}/rules.d"\ndedupe_s = 0.01\n' + extra
            ),
        )
        self.env = {**os.environ, "HMA_CONFIG": str(cfg)}
        self.log = open(tmp / "daemon.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"],
            env=self.env,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.seq = 0
        try:
            self.wait(lambda: self._open(fifo), "the daemon to open its kernel log")
        except BaseException:
            self.stop()
            raise

    def _open(self, fifo: Path) -> bool:
        try:
            self.fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return False
        return True

    def write(self, line: str) -> None:
        self.seq += 1
        os.write(self.fd, f"3,{self.seq},{self.seq * 1000},-;{line}\n".encode())

    def doc(self) -> dict[str, Any]:
        try:
            return json.loads(self.status.read_text())
        except (OSError, ValueError):
            return {}

    def faults(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(f["code"], f["component"]): f for f in self.doc().get("faults", [])}

    def actions(self) -> list[tuple[str, str]]:
        rem = self.doc().get("remediation") or {}
        return [(a["kind"], a["state"]) for a in rem.get("actions", [])]

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert self.proc.poll() is None, (self.tmp / "daemon.log").read_text()
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def stop(self) -> None:
        if hasattr(self, "fd"):
            os.close(self.fd)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def drained(cluster: SlurmCluster, node: str) -> bool:
    return "DRAIN" in cluster.node(node)["state_flags"]


def test_xid13_drains_only_when_one_gpu_repeats_it(fresh: SlurmCluster, tmp_path: Path) -> None:
    codes = '[codes.GPU_XID_13]\nafter = 3\nwithin = "1h"\naction = "none"\n'
    agent = Agent(tmp_path, fresh, "node2", codes)
    try:
        xid13 = "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
        agent.write(xid_line(GPU3, 13, xid13))
        key3 = ("GPU_XID_13", "gpu:0000:3b:00")
        agent.wait(lambda: key3 in agent.faults(), "the first Xid 13 in status.json")
        # the status file is written after remediation took the verdict: no drain was queued
        first = agent.faults()[key3]
        assert first["severity"] == "warning" and first["threshold"]["occurrences"] == 1
        assert agent.actions() == [] and not drained(fresh, "node2")

        agent.write(xid_line(GPU4, 13, xid13))
        agent.write(xid_line(GPU5, 13, xid13))
        three = [key3, ("GPU_XID_13", "gpu:0000:5d:00"), ("GPU_XID_13", "gpu:0000:86:00")]
        agent.wait(lambda: all(k in agent.faults() for k in three), "Xid 13 on three GPUs")
        assert {agent.faults()[k]["severity"] for k in three} == {"warning"}
        assert agent.actions() == [] and not drained(fresh, "node2")

        agent.write(xid_line(GPU3, 13, xid13))
        # one at a time: lines closer than the source's dedupe_s would be one event
        agent.wait(lambda: agent.faults()[key3]["count"] == 2, "the second Xid 13 on GPU 3")
        assert agent.actions() == [] and not drained(fresh, "node2")
        agent.write(xid_line(GPU3, 13, xid13))
        fresh.wait(lambda: drained(fresh, "node2"), 30, "the drain of node2")
        assert fresh.node("node2")["reason"] == "HMA: GPU_XID_13 gpu:0000:3b:00"
        agent.wait(lambda: agent.faults()[key3]["severity"] == "critical", "the promotion")
        promoted = agent.faults()[key3]
        assert promoted["threshold"]["reached"] and promoted["count"] == 3
        # the other GPUs are still below their own count
        assert {agent.faults()[k]["severity"] for k in three[1:]} == {"warning"}
    finally:
        agent.stop()


@pytest.mark.skipif(not journald_usable(), reason="needs root, systemd-journald, journalctl")
def test_observe_mode_alerts_would_reboot_and_never_drains(
    fresh: SlurmCluster, tmp_path: Path, journald: tuple[str, str]
) -> None:
    ns, sock = journald
    textfile = tmp_path / "hma.prom"
    extra = (
        '[codes.GPU_XID_79]\nmode = "observe"\n[codes.GPU_XID_48]\naction = "none"\n'
        f'[reporters.journald]\nsocket = "{sock}"\n'
        f'[reporters.prometheus]\nenabled = true\ntextfile = "{textfile}"\n'
    )
    agent = Agent(tmp_path, fresh, "node3", extra)
    try:
        agent.write(xid_line(GPU3, 79, "GPU has fallen off the bus."))
        (entry,) = read_back(ns, "HMA_CODE=GPU_XID_79", "HMA_KIND=raised")
        assert entry["HMA_MODE"] == "observe" and entry["HMA_WOULD"] == "reboot"
        assert "observe mode, would reboot" in entry["MESSAGE"]
        assert entry["HMA_SEVERITY"] == "warning" and entry["HMA_ACTION"] == "none"
        assert entry["PRIORITY"] == "4"

        key = ("GPU_XID_79", "gpu:0000:3b:00")
        agent.wait(lambda: key in agent.faults(), "the fault in status.json")
        fault = agent.faults()[key]
        assert fault["observe"] is True and fault["would"] == "reboot"
        assert agent.doc()["severity"] == "warning" and agent.doc()["action"] == "none"
        assert agent.actions() == [] and not drained(fresh, "node3")

        shown = subprocess.run(
            [sys.executable, "-m", "hma", "status"],
            env=agent.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 1, shown.stdout + shown.stderr
        assert "observe mode: would reboot, never acted on" in shown.stdout
        want = 'hma_findings_observed{code="GPU_XID_79",component="gpu:0000:3b:00",would="reboot"}'
        agent.wait(lambda: textfile.exists() and want in textfile.read_text(), "the metric")

        # a second, act-mode fault on another GPU still drains: observe mode is per code
        agent.write(xid_line(GPU4, 48, "An uncorrectable double bit error (DBE) has been detected"))
        fresh.wait(lambda: drained(fresh, "node3"), 30, "the drain for Xid 48")
        assert fresh.node("node3")["reason"] == "HMA: GPU_XID_48 gpu:0000:5d:00"
    finally:
        agent.stop()


def test_two_read_only_mounts_are_two_faults_and_the_drain_names_one(
    fresh: SlurmCluster, tmp_path: Path
) -> None:
    # the system probe's injectable procfs root: the node's own (its boot id) plus a mount table
    # in which two disks went read-only (the superblock says ro), one with a blank in its name
    procfs = tmp_path / "procfs"
    shutil.copytree(fresh.procfs("node1"), procfs)
    scratch, data = tmp_path / "scratch", tmp_path / "my data"
    for folder in (scratch / "jobs", data):
        folder.mkdir(parents=True)
    (procfs / "self").mkdir(exist_ok=True)
    (procfs / "self/mountinfo").write_text(
        "25 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"
        f"40 25 259:2 / {scratch} rw,relatime shared:2 - xfs /dev/nvme1n1 ro\n"
        f"41 25 259:3 / {str(data).replace(' ', chr(92) + '040')} rw shared:3 - ext4 /dev/sdb ro\n"
    )
    system = (
        f"filesystems = {json.dumps([str(scratch / 'jobs'), str(data)])}\n"
        "processes = []\nmin_free_percent = 0.0\nmin_free_inodes_percent = 0.0\ninterval = 0.5\n"
    )
    agent = Agent(tmp_path, fresh, "node1", "", system=system, paths={"procfs": str(procfs)})
    try:
        keys = [
            ("SYS_FS_READONLY", f"fs:{scratch}"),
            ("SYS_FS_READONLY", f"fs:{str(data).replace(' ', chr(92) + '040')}"),
        ]

        def both_active() -> bool:
            faults = agent.faults()
            return all(k in faults and faults[k]["active"] for k in keys)

        agent.wait(both_active, "two active read-only faults, one per mount")
        fresh.wait(lambda: drained(fresh, "node1"), 30, "the drain of node1")
        # an idle node's reboot may already be issued: Slurm then appends " : reboot issued"
        reason = fresh.node("node1")["reason"].split(" : ", 1)[0]
        assert reason in {f"HMA: {code} {component}" for code, component in keys}, reason
    finally:
        agent.stop()
