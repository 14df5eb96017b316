"""``hma deep-check run`` on a real loopback Slurm: reservation, one job per node, the
connectivity job and its pair bisection, labels, busy nodes skipped, a second run refused.

Stand-ins only where hardware is needed: dcgmi replays DCGM's real JSON (a failure on node2),
all_reduce_perf replays a real nccl-tests table with the bus bandwidth of the slowest node of its
job (node3 is slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.integration.test_deepcheck_node import deep_check, faults
from tests.slurmcluster import SlurmCluster, available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(available() is not None, reason=available() or ""),
]
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "deepcheck"
NODES = ["node1", "node2", "node3", "node4", "node5"]
SPEEDS = {"node3": 95.0}  # GB/s; the others 330

ALL_REDUCE = """#!{python}
import json, os, subprocess, sys
nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                       capture_output=True, text=True, check=True).stdout.split()
speed = min(json.load(open("{speeds}")).get(n, 330.0) for n in nodes)
lines = open("{fixture}").read().splitlines()
last = [i for i, l in enumerate(lines) if not l.startswith("#")][-1]
cols = lines[last].split()
cols[7] = cols[11] = "%.2f" % speed
lines[last] = "  ".join(cols)
print("\\n".join(lines))
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with SlurmCluster(nodes=NODES) as cluster:
        yield cluster


def setup_files(tmp: Path, cluster: SlurmCluster, busy_wait: float = 30.0) -> Path:
    """Per-node agent configurations (own state store), the stand-ins and the login config."""
    (tmp / "speeds.json").write_text(json.dumps(SPEEDS))
    bin_ = tmp / "bin"
    bin_.mkdir()
    passing = tmp / "dcgm-pass.json"
    passing.write_text((FIX / "dcgmi-diag-sm-stress-fail.json").read_text().replace("FAIL", "PASS"))
    for node in NODES:
        (tmp / node / "state").mkdir(parents=True)
        (tmp / node / "run").mkdir()
        replay = FIX / "dcgmi-diag-sm-stress-fail.json" if node == "node2" else passing
        dcgmi = tmp / node / "dcgmi"
        dcgmi.write_text(f"#!/bin/sh\ncat {replay}\n")
        dcgmi.chmod(0o755)
        (tmp / f"{node}.toml").write_text(
            f'[agent]\nstate_dir = "{tmp}/{node}/state"\nrun_dir = "{tmp}/{node}/run"\n'
            f'node_name = "{node}"\ninstance_type = "p5.48xlarge"\n'
            f'[deep_check]\ndcgmi_command = ["{dcgmi}"]\n'
        )
    node_cmd = bin_ / "hma-node"
    node_cmd.write_text(
        f'#!/bin/sh\nexec {sys.executable} -m hma --config {tmp}/"$SLURMD_NODENAME".toml'
        ' deep-check --json "$@"\n'
    )
    node_cmd.chmod(0o755)
    all_reduce = bin_ / "all_reduce_perf"
    all_reduce.write_text(
        ALL_REDUCE.format(
            python=sys.executable,
            speeds=tmp / "speeds.json",
            fixture=FIX / "all_reduce_perf-2x8-h100.txt",
        )
    )
    all_reduce.chmod(0o755)
    login = tmp / "login.toml"
    login.write_text(
        f'[agent]\ninstance_type = "p5.48xlarge"\n[slurm]\nconf = "{cluster.conf}"\n'
        f'[deep_check]\nnode_command = ["{node_cmd}"]\nall_reduce_command = ["{all_reduce}"]\n'
        f"busy_wait = {busy_wait}\n"
    )
    return login


def run(login: Path, *nodes: str, stages: str = "dcgm,connectivity") -> tuple[int, Any]:
    return deep_check(login, "run", *nodes, "--stages", stages, timeout=150)


def node_faults(tmp: Path, node: str) -> set[tuple[str, str]]:
    return set(faults(tmp / node))


def test_run_blames_the_failed_and_the_slow_node_and_releases(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    slurm.reset()
    login = setup_files(tmp_path, slurm, busy_wait=2.0)
    job = slurm.submit("node5")  # busy: waited on for 2 s, then skipped
    try:
        rc, doc = run(login, "node[1-5]")
    finally:
        slurm.run("scancel", job)
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert rc == 2 and doc["verdict"] == "fail"
    assert nodes["node1"]["verdict"] == "pass" and nodes["node1"]["connectivity"] == "pass"
    assert nodes["node4"]["verdict"] == "pass"
    assert nodes["node2"]["verdict"] == "fail" and nodes["node2"]["stages"] == {"dcgm": "fail"}
    assert nodes["node2"]["connectivity"] is None  # failed its node stages: not in the group
    assert nodes["node3"]["verdict"] == "fail" and nodes["node3"]["connectivity"] == "fail"
    assert nodes["node5"]["verdict"] == "skipped" and "still running jobs" in nodes["node5"]["note"]
    conn = doc["connectivity"]
    assert conn["blamed"] == ["node3"] and conn["minimum_gbps"] == 200.0
    assert conn["group_gbps"] == 95.0
    # each node's agent got its own verdicts
    assert ("DEEP_DCGM_FAIL", "gpu:1") in node_faults(tmp_path, "node2")
    assert node_faults(tmp_path, "node3") == {("DEEP_BUSBW_LOW", "node")}
    assert node_faults(tmp_path, "node1") == set()
    # labels, and the reservation is gone (nodes back in service)
    assert "hma-deep=pass:" in slurm.node("node1")["extra"]
    assert "hma-deep=fail:" in slurm.node("node3")["extra"]
    assert "hma-deep" not in slurm.node("node5")["extra"]
    shown = slurm.run("scontrol", "show", "reservation", "hma-deep-check")
    assert "ReservationName=hma-deep-check" not in shown.stdout


def test_second_run_is_refused_while_one_is_active(slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm.reset()
    login = setup_files(tmp_path, slurm)
    slurm.scontrol(
        "create",
        "reservation",
        "ReservationName=hma-deep-check",
        "StartTime=now",
        "Duration=10",
        "Users=root",
        "Nodes=node1",
        "Flags=IGNORE_JOBS",
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "hma", "--config", str(login), "deep-check", "run", "node1"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 75
        assert "another deep check is running" in proc.stderr
    finally:
        slurm.scontrol("delete", "ReservationName=hma-deep-check")


def test_connectivity_alone_blames_only_the_slow_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm.reset()
    login = setup_files(tmp_path, slurm)
    rc, doc = run(login, "node1,node3,node4", stages="connectivity")
    verdicts = {n["node"]: (n["verdict"], n["connectivity"]) for n in doc["nodes"]}
    assert verdicts == {
        "node1": ("pass", "pass"),
        "node3": ("fail", "fail"),
        "node4": ("pass", "pass"),
    }
    assert rc == 2 and doc["connectivity"]["instance_type"] == "p5.48xlarge"
    assert node_faults(tmp_path, "node3") == {("DEEP_BUSBW_LOW", "node")}
    # the slow node is fixed: the next run passes and clears its fault
    (tmp_path / "speeds.json").write_text("{}")
    rc, doc = run(login, "node1,node3,node4", stages="connectivity")
    assert rc == 0 and doc["connectivity"]["group_gbps"] == 330.0
    assert node_faults(tmp_path, "node3") == set()
