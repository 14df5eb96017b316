"""`hma healthcheck` (as slurmd runs it) and `hma fleet` against the real Slurm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.remediation_helpers import (  # noqa: F401 (fixtures)
    back_in_service,
    cluster,
    fresh,
    write_config,
)
from tests.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = [sys.executable, "-m", "hma.commands.healthcheck"]


def site_probe(folder: Path, flag: Path) -> None:
    """An executable probe that is critical while ``flag`` exists."""
    folder.mkdir(mode=0o755)
    probe = folder / "gpucheck"
    probe.write_text(
        f"#!/bin/sh\nif [ -e {flag} ]; then echo 'GPU 3 missing'; exit 2; fi\n" "echo ok; exit 0\n"
    )
    probe.chmod(0o755)


def test_healthcheck_as_slurmd_runs_it(
    fresh: SlurmCluster, tmp_path: Path, trusted_dir: Path
) -> None:
    flag = tmp_path / "broken"
    site_probe(trusted_dir / "probes.d", flag)
    cfg = write_config(
        tmp_path / "hma.toml",
        fresh,
        "node3",
        {},
        {"node_name": "unused"},
        extra="[probes.system]\nenabled = false\n",
        agent={"probes_dir": str(trusted_dir / "probes.d")},
    )
    # slurmd gives the program nothing but SLURMD_NODENAME (HMA_CONFIG only because the test
    # cannot use /etc/hma/hma.toml): no PATH, no SLURM_CONF.
    env = {"SLURMD_NODENAME": "node3", "HMA_CONFIG": str(cfg)}
    flag.touch()
    bad = subprocess.run(
        HEALTHCHECK, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 2, bad.stderr
    node = fresh.node("node3")
    assert node["reason"].startswith("HMA: SITE_PROBE_CRITICAL ")
    assert "DRAIN" in node["state_flags"] and "hma=unhealthy:SITE_PROBE_CRITICAL" in node["extra"]
    assert "CRITICAL" in bad.stdout
    flag.unlink()
    good = subprocess.run(
        HEALTHCHECK, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert good.returncode == 0, good.stderr
    node = fresh.node("node3")  # (it may show idle* for a second after RESUME)
    assert back_in_service(fresh, node)
    assert "hma=" not in node["extra"]


def test_fleet_lists_hma_nodes_and_breaker(fresh: SlurmCluster, tmp_path: Path) -> None:
    fresh.scontrol(
        "update",
        "NodeName=node1",
        "State=DRAIN",
        "Reason=HMA: GPU_XID_79 gpu:0000:3b:00",
        "Extra=hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t=1764410040,r=1,j=17+18",
    )
    fresh.scontrol(
        "update",
        "NodeName=node2",
        "Extra=rack=4 hma=unhealthy:EFA_LINK_DOWN:reboot,c=efa:rdmap16s27,t=1764410050,h=breaker",
    )
    fresh.scontrol("update", "NodeName=node4", "State=DRAIN", "Reason=bob: bios update")
    cfg = write_config(tmp_path / "hma.toml", fresh, "node1", {"max_drained_percent": 25.0})
    env = {"PATH": "/usr/bin:/bin", "HMA_CONFIG": str(cfg)}
    out = subprocess.run(
        [sys.executable, "-m", "hma", "fleet", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = {r["node"]: r for r in doc["nodes"]}
    assert set(rows) == {"node1", "node2"}  # bob's drain is not hma's
    assert rows["node1"]["code"] == "GPU_XID_79" and rows["node1"]["reboots"] == 1
    assert rows["node1"]["jobs"] == ["17", "18"] and rows["node1"]["held_by_hma"]
    assert rows["node2"]["held"] == "breaker" and not rows["node2"]["held_by_hma"]
    assert doc["partitions"] == [
        {"partition": "batch", "nodes": 4, "held_by_hma": 1, "limit": 1, "breaker": "open"}
    ]
    text = subprocess.run(
        [sys.executable, "-m", "hma", "fleet"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    assert "GPU_XID_79" in text and "held: breaker" in text and "open" in text


def test_daemon_xid_line_drains_through_the_outbox(fresh: SlurmCluster, tmp_path: Path) -> None:
    import os
    import signal
    import time

    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    cfg = write_config(
        tmp_path / "hma.toml",
        fresh,
        "node2",
        {},
        {},
        extra=(
            "[probes.system]\nenabled = false\n"
            f'[sources.kernel_log]\npath = "{fifo}"\nbackend = "kmsg"\n'
            f'rules_dir = "{tmp_path}/rules.d"\n[codes.GPU_XID_79]\naction = "none"\n'
        ),
    )
    env = {**os.environ, "HMA_CONFIG": str(cfg)}
    with open(tmp_path / "daemon.log", "w") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()
                time.sleep(0.05)
        line = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU off bus"
        os.write(fd, f"4,1,1000,-;{line}\n".encode())
        fresh.wait(lambda: "DRAIN" in fresh.node("node2")["state_flags"], 30, "drain")
        assert fresh.node("node2")["reason"] == "HMA: GPU_XID_79 gpu:0000:3b:00"
        status = tmp_path / "run-node2" / "status.json"

        def remediated() -> bool:
            doc = json.loads(status.read_text())["remediation"]
            return [(a["kind"], a["state"]) for a in doc["actions"]] == [("drain", "done")]

        fresh.wait(remediated, 30, "status.json shows the drain done")
        os.close(fd)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
