#!/usr/bin/env python3
"""Drain latency on the loopback Slurm cluster (tests/slurmcluster.py; needs root).

    .venv/bin/python bench/bench_drain.py [--runs 40] [--xid-runs 30]

1. finding -> DRAIN: a Remediator gets a verdict with a draining fault (``update()``, as the
   daemon calls it) until ``scontrol show node`` shows DRAIN; the node is resumed between runs.
2. Xid line -> DRAIN (``--xid-runs``, 0 to skip): a real ``hma run`` daemon whose
   ``[sources.kernel_log]`` reads a FIFO (the /dev/kmsg record format); the time from writing an
   Xid 79 line until ``scontrol show node`` shows DRAIN. A fresh daemon (and state) per run.
   Also timed to the moment slurmctld set the drain (its log's millisecond timestamps), which
   leaves out the poller; ``--warm`` writes an Xid 13 line first (the daemon's first Xid line
   loads the catalogue).
3. The floor: one ``scontrol update State=DRAIN`` call.

The poller runs ``sinfo -n NODE`` back to back (about 7 ms a call), so figures include up to one
poll of delay. Prints min / median / p99 / max in milliseconds and describes the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import machine, median_ms, open_writer, p99_ms, stop  # noqa: E402

from tests.slurmcluster import SlurmCluster  # noqa: E402


def drained(cluster: SlurmCluster, node: str) -> Callable[[], bool]:
    """A predicate: Slurm shows DRAIN (``sinfo -n NODE``: a single-node query, where ``scontrol
    show node`` would read the whole node table of a big cluster at every poll)."""

    def check() -> bool:
        proc = cluster.run("sinfo", "-h", "-N", "-n", node, "-O", "StateComplete:0")
        return "drain" in proc.stdout.strip().split("+")[1:]

    return check


def spin(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("no DRAIN within the timeout")


def resume(cluster: SlurmCluster, node: str) -> None:
    cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", "Extra=")
    cluster.wait(lambda: cluster.state(node) == "IDLE", 30, f"{node} idle")


def summary(name: str, samples: list[float]) -> str:
    s = sorted(samples)
    return (
        f"{name} over {len(s)} runs: min {s[0] * 1000:.1f} ms, median {median_ms(s):.1f} ms, "
        f"p99 {p99_ms(s):.1f} ms, max {s[-1] * 1000:.1f} ms"
    )


def bench_remediator(cluster: SlurmCluster, tmp: Path, runs: int) -> list[float]:
    from hma.contracts.model import Action, Clears
    from tests.integration.remediation_helpers import fault, make, verdict

    # every run is one remediation: without a high limit the 4th drain within the window is a
    # repeat offender's, held for a human, and never resumed
    options = {"resume_after": 0.0, "max_remediations": runs + 1}
    rem, _store = make(tmp, cluster, "node1", options)
    out = []
    try:
        f = fault(action=Action.NONE, clears=Clears.OBSERVATION)
        for _ in range(runs):
            t0 = time.perf_counter()
            rem.update(verdict(f), "boot-1")
            spin(drained(cluster, "node1"), 30)
            out.append(time.perf_counter() - t0)
            rem.update(verdict(), "boot-1")  # healthy: the agent resumes its own drain
            cluster.wait(lambda: cluster.state("node1") == "IDLE", 30, "resumed")
            cluster.wait(lambda: rem.status()["episode"] is None, 30, "episode closed")
    finally:
        rem.close()
    return out


def applied_at(cluster: SlurmCluster, node: str, after: float) -> float:
    """When slurmctld set hma's drain reason on ``node`` (its log, millisecond timestamps; the
    first such line at or after ``after``, a wall-clock time), or NaN when there is none."""
    marker = f"update_node: node {node} reason set to: HMA:"
    for line in (cluster.base / "log" / "slurmctld.log").read_text().splitlines():
        if marker in line and line.startswith("["):
            when = datetime.datetime.strptime(line[1:24], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
            if when >= after - 0.0005:  # the log rounds down to the millisecond
                return when
    return float("nan")


def bench_xid(
    cluster: SlurmCluster, tmp: Path, runs: int, node: str = "node2", warm: bool = False
) -> tuple[list[float], list[float]]:
    """(Xid line -> the poller sees DRAIN, Xid line -> slurmctld sets the drain) per run.

    ``warm``: an Xid 13 line (a warning, no drain) first, so that the measured line is not the
    daemon's first (the first kernel line that names an Xid loads the catalogue)."""
    from tests.integration.remediation_helpers import write_config

    out, controller = [], []
    for i in range(runs):
        base = tmp / f"xid-{node}-{i}"
        base.mkdir()
        fifo = base / "kmsg"
        os.mkfifo(fifo)
        extra = (
            "[probes.system]\nenabled = false\n"
            f'[sources.kernel_log]\npath = "{fifo}"\nbackend = "kmsg"\n'
            f'rules_dir = "{base}/rules.d"\n'
            '[codes.GPU_XID_79]\naction = "none"\n'  # drain only: no reboot between runs
        )
        cfg = write_config(base / "hma.toml", cluster, node, {}, {}, extra=extra)
        env = {**os.environ, "HMA_CONFIG": str(cfg)}
        log = open(base / "daemon.log", "w")  # noqa: SIM115 - closed in finally
        daemon = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            fd = open_writer(str(fifo), time.monotonic() + 60)
            settled(base / f"run-{node}" / "status.json", 60)
            if warm:
                first = "NVRM: Xid (PCI:0000:3c:00): 13, pid=1, name=app, Graphics Exception"
                os.write(fd, f"4,1,1000,-;{first}\n".encode())
                time.sleep(1.0)
            line = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU off bus"
            wall, t0 = time.time(), time.perf_counter()
            os.write(fd, f"4,{i + 2},{(i + 2) * 1000},-;{line}\n".encode())
            spin(drained(cluster, node), 30)
            out.append(time.perf_counter() - t0)
            controller.append(applied_at(cluster, node, wall) - wall)
            os.close(fd)
        finally:
            stop(daemon)
            log.close()
        cluster.run("scontrol", "cancel_reboot", node)
        resume(cluster, node)
    return out, controller


def settled(status: Path, timeout: float) -> None:
    """Wait until the daemon's status.json shows Slurm reached, then one second for the
    probes' first runs (a drain measured during start-up measures the start-up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(status.read_text())["remediation"]["slurm"]["reachable"]:
                time.sleep(1.0)
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{status}: Slurm never reached")


def bench_floor(cluster: SlurmCluster, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        cluster.scontrol("update", "NodeName=node3", "State=DRAIN", "Reason=HMA: bench floor")
        out.append(time.perf_counter() - t0)
        resume(cluster, "node3")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="finding -> DRAIN runs (>= 30)")
    parser.add_argument("--xid-runs", type=int, default=30, help="Xid line -> DRAIN runs")
    parser.add_argument("--warm", action="store_true", help="an Xid 13 line before each run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hma-drain-bench-") as tmp, SlurmCluster(4) as cluster:
        floor = bench_floor(cluster, 20)
        finding = bench_remediator(cluster, Path(tmp), args.runs)
        xid, applied = bench_xid(cluster, Path(tmp), args.xid_runs, warm=args.warm)
        version = cluster.run("sinfo", "-V").stdout.strip()
    print(f"machine: {machine()}")
    print(f"slurm: {version}, 4 slurmd on loopback")
    print(summary("scontrol update State=DRAIN (floor)", floor))
    print(summary("finding -> scontrol show node DRAIN", finding))
    if xid:
        print(summary("Xid kernel line -> sinfo shows DRAIN (hma run)", xid))
        print(summary("Xid kernel line -> slurmctld sets the drain (its log)", applied))
    return 0


if __name__ == "__main__":
    sys.exit(main())
