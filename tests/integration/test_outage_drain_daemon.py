"""slurmctld down for a minute during a drain (issue 28, part 7), with `hma run` on a simulated
GPU node (tests/simnode.py) of the real (loopback) Slurm and a reboot hook (``reboot_mode =
"command"``): an Xid 79 arrives while slurmctld is stopped; the drain fails, is retried with
backoff while the daemon goes on (its status.json keeps being written, `hma status` says the
drain failed and when it is tried next), and when slurmctld is back the drain lands exactly once
and the hook is called exactly once."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.simnode import SimNode
from tests.slurmcluster import SlurmCluster, available
from tests.standin import nvmlstub

OUTAGE_S = float(os.environ.get("HMA_TEST_OUTAGE_S", "60"))
pytestmark = [pytest.mark.integration, pytest.mark.timeout(OUTAGE_S + 240)]

NODE = "node1"
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 90.0


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimNode]:
    why = available()
    if why:
        pytest.skip(why)
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) for the stand-in NVML library")
    cluster = SlurmCluster(2)
    node = None
    try:
        cluster.start()
        hook = tmp_path / "reboot-hook"
        hook.write_text(f'#!/bin/sh\necho "$HMA_ACTION $HMA_ACTION_ID" >> {tmp_path}/hook.log\n')
        hook.chmod(0o755)
        wrapper = [
            sys.executable,
            str(ROOT / "tests/integration/scontrol_wrapper.py"),
            "log",
            str(tmp_path / "scontrol.log"),
            cluster.client("scontrol"),
        ]
        recovery = {
            "reboot_mode": "command",
            "reboot_command": [str(hook)],
            "retry_min": 2.0,
            "retry_max": 10.0,
        }
        node = SimNode(cluster, NODE).build(recovery=recovery, slurm={"scontrol": wrapper})
        yield node
    finally:
        if node is not None:
            node.close()
        cluster.stop()


def drain_row(sim: SimNode) -> dict:
    rows = (sim.status().get("remediation") or {}).get("actions") or []
    return next((r for r in rows if r.get("kind") == "drain"), {})


def test_drain_waits_out_a_slurmctld_outage_and_lands_once(sim: SimNode, tmp_path: Path) -> None:
    cluster = sim.cluster
    sim.start_agent()
    sim.wait(sim.healthy, TIMEOUT, "a first healthy verdict")
    cluster.stop_controller()
    started = time.monotonic()
    res = sim.hma(
        "inject", "xid", "--gpu", sim.gpu_pci(3), "--xid", "79", "--yes-really-drain",
        "--kmsg", str(sim.dev_kmsg),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    sim.wait(lambda: drain_row(sim).get("state") == "failed", TIMEOUT, "a failed drain attempt")
    text = sim.hma("status").stdout
    assert "drain failed" in text and "next try" in text, text
    assert "slurm" in drain_row(sim).get("last_error", "").lower()
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - started)))
    assert sim.agent is not None and sim.agent.poll() is None  # the daemon stayed up
    before = float(sim.status().get("generated") or 0)
    sim.wait(lambda: float(sim.status().get("generated") or 0) > before, 30, "status written")
    attempts = int(drain_row(sim).get("attempts") or 0)
    assert attempts >= 2, drain_row(sim)  # retried during the outage, with backoff
    assert attempts < OUTAGE_S / 2.0 + 2  # backoff: never a retry per second
    assert not (tmp_path / "hook.log").exists()  # nothing after the drain before it lands

    cluster.start_controller()
    sim.wait(lambda: drain_row(sim).get("state") == "done", TIMEOUT, "the drain after the outage")
    sim.wait(lambda: ("reboot", "done") in sim.actions(), TIMEOUT, "the reboot hook")
    assert cluster.node(NODE)["reason"].startswith("HMA: GPU_XID_79 gpu:0000:5d:00")
    time.sleep(3.0)  # a few rechecks later it is still one of each
    log = (tmp_path / "scontrol.log").read_text().splitlines()
    landed = [line for line in log if line.startswith("ran rc=0") and "State=DRAIN" in line]
    assert len(landed) == 1, log
    calls = (tmp_path / "hook.log").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("reboot "), calls
    assert sim.agent.poll() is None
    assert "Traceback" not in sim.log.read_text()
