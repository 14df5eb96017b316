"""`hma topology` confined the way systemd/hma-topology.service confines it, as far as a machine
without systemd as PID 1 allows, against a real Slurm 22.05 controller (2 slurmd on loopback).

In a private mount namespace: every file system read-only (ProtectSystem=strict) but the folder
of slurm.conf (ReadWritePaths=), /dev holding only the pseudo devices (PrivateDevices=), /proc
with other users' processes hidden (ProtectProc=invisible); then no capability at all
(CapabilityBoundingSet=, AmbientCapabilities=) and no new privileges (NoNewPrivileges=). The
syscall, address-family and W^X filters need systemd itself (`systemd-analyze security` scores
them: tests/install/test_unit.py). The same run with the folder left read-only must fail: the
confinement is real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.remediation_helpers import write_config
from tests.integration.topology_helpers import topology_section
from tests.slurmcluster import SlurmCluster, available

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "hma-topology.service"
BOOT = "SwitchName=all Nodes=node[1-2]\n"
SANDBOX = r"""set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs "$DEV"
for d in null zero full random urandom; do touch "$DEV/$d"; mount --bind "/dev/$d" "$DEV/$d"; done
mount --move "$DEV" /dev
mount -t proc -o hidepid=invisible proc /proc
for point in $(awk '{print $2}' /proc/self/mounts | sort -u); do
  case $point in /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) continue ;; esac
  mount -o remount,bind,ro "$point"
done
if [ -n "$WRITABLE" ]; then
  mount --bind "$WRITABLE" "$WRITABLE"
  mount -o remount,bind,rw "$WRITABLE"
fi
exec setpriv --bounding-set=-all --inh-caps=-all --ambient-caps=-all --no-new-privs "$@"
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    why = available("22.05")
    if why:
        pytest.skip(f"Slurm 22.05: {why}")
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        pytest.skip("needs root, unshare and setpriv (a private mount namespace)")
    cluster = SlurmCluster(
        2, extra_conf="TopologyPlugin=topology/tree", conf_files={"topology.conf": BOOT}
    )
    cluster.start(timeout=60)
    try:
        yield cluster
    finally:
        cluster.stop()


def confined(
    cluster: SlurmCluster, folder: Path, writable: bool, *argv: str
) -> subprocess.CompletedProcess:
    """``argv`` (default: `hma topology`, tree form, no spares) in the sandbox; the topology
    file next to slurm.conf, whose folder is writable when ``writable``."""
    etc = cluster.base / "etc"
    extra = topology_section(0, "tree", etc / "topology.conf")
    cfg = write_config(folder / "hma-topology.toml", cluster, "node1", extra=extra)
    (folder / "dev").mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "DEV": str(folder / "dev"),
        "WRITABLE": str(etc) if writable else "",
    }
    argv = argv or (sys.executable, "-m", "hma", "topology", "--config", str(cfg))
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", SANDBOX, "sandbox", *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_unit_names_what_the_sandbox_emulates() -> None:
    lines = UNIT.read_text().splitlines()
    for line in (
        "ProtectSystem=strict",
        "ReadWritePaths=-/etc/slurm",
        "PrivateDevices=yes",
        "ProtectProc=invisible",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "NoNewPrivileges=yes",
    ):
        assert line in lines, line


def test_topology_runs_confined(cluster: SlurmCluster, tmp_path: Path) -> None:
    topology = cluster.base / "etc" / "topology.conf"
    refused = confined(cluster, tmp_path, writable=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused
    assert topology.read_text() == BOOT
    res = confined(cluster, tmp_path, writable=True)
    assert res.returncode == 0, res.stderr
    assert "written" in res.stdout and "scontrol reconfigure: done" in res.stdout, res.stdout
    assert topology.read_text() != BOOT and "node1" in topology.read_text()
    with open("/proc/self/mounts") as mounts:  # the sandbox's mounts died with its namespace
        assert not [m for m in mounts if m.split()[1] == str(tmp_path / "dev")]


def test_the_sandbox_holds_no_privilege(cluster: SlurmCluster, tmp_path: Path) -> None:
    res = confined(
        cluster,
        tmp_path,
        True,
        "sh",
        "-c",
        "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; ls /dev",
    )
    assert res.returncode == 0, res.stderr
    status = dict(line.split(":\t") for line in res.stdout.splitlines() if ":\t" in line)
    assert status == {"CapEff": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1"}
    devices = sorted(line for line in res.stdout.splitlines() if ":\t" not in line)
    assert devices == ["full", "null", "random", "urandom", "zero"], res.stdout
