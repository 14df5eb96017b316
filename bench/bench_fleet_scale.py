#!/usr/bin/env python3
"""The agent's cost to slurmctld and to its node as the cluster grows (needs root).

    .venv/bin/python bench/bench_fleet_scale.py [--sizes 100,2000,5000] [--seconds 60]
        [--cpu-seconds 120] [--held-jobs 3000] [--xid-runs 30] [--xid-size 2000]
        [--heartbeat 600] [--window-heartbeat 10]

For each size a loopback Slurm (tests/slurmcluster.py) of 2 slurmd plus ``size - 2`` nodes without
slurmd (every client RPC pays for them) and ``--held-jobs`` held jobs runs one real ``hma run``
daemon on node1 at default settings, with a job running on node1, twice (each measured after
``--settle`` seconds):

- with a heartbeat of ``--window-heartbeat`` for ``--seconds``: controller RPCs by type (``sdiag``,
  reset at the start of the window) per node-hour, scaled to ``--heartbeat`` (the default of
  ``[slurm] heartbeat``; the healthy agent asks slurmctld once a heartbeat, so its rate goes with
  1/heartbeat), and slurmctld's time for them (``sdiag`` total_time), from which 10,000 agents as a
  share of one slurmctld core;
- with the default heartbeat for ``--cpu-seconds``: the agent's CPU share of one core (daemon,
  workers and every Slurm client it ran: utime + stime of the process tree).

Then Xid kernel line -> DRAIN at ``--xid-size`` nodes, median and p99, as in bench/bench_drain.py
(a fresh daemon per run; the poller adds up to one ``scontrol`` call).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_drain import bench_xid, summary  # noqa: E402
from common import machine, stop  # noqa: E402

from hma.remediation.options import RECOVERY  # noqa: E402
from tests.integration.remediation_helpers import FAST, write_config  # noqa: E402
from tests.slurmcluster import SlurmCluster  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` (with its reaped children) and of its live descendants."""
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stats[int(entry)] = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    children: dict[int, list[int]] = {}
    for child, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(child)
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        fields = stats.get(current)
        if fields is not None:  # utime stime cutime cstime: fields 14-17 of stat
            total += sum(int(v) for v in fields[11:15])
            todo += children.get(current, [])
    return total / TICKS


def agent(cluster: SlurmCluster, base: Path, heartbeat: float) -> subprocess.Popen:
    """A real ``hma run`` daemon for node1 at default settings (kernel log from a FIFO, the host's
    /proc for the system probe)."""
    base.mkdir(parents=True, exist_ok=True)
    fifo = base / "kmsg"
    os.mkfifo(fifo)
    extra = (
        f'[sources.kernel_log]\npath = "{fifo}"\nbackend = "kmsg"\nrules_dir = "{base}/rules.d"\n'
    )
    cfg = write_config(
        base / "hma.toml",
        cluster,
        "node1",
        {key: RECOVERY[key].default for key in FAST},  # the defaults, not the tests' fast timings
        {"heartbeat": heartbeat, "facts_interval": 10.0, "timeout": 20.0},
        extra=extra,
        paths={"procfs": "/proc"},  # the real host (slurmd runs), not the node's fake boot id
    )
    env = {**os.environ, "HMA_CONFIG": str(cfg)}
    log = open(base / "daemon.log", "w")  # noqa: SIM115 - the daemon's stdout, closed with it
    return subprocess.Popen(
        [sys.executable, "-m", "hma", "run"], env=env, stdout=log, stderr=subprocess.STDOUT
    )


def window(
    cluster: SlurmCluster, base: Path, heartbeat: float, settle: float, seconds: float
) -> tuple[dict[str, tuple[int, int]], float, float]:
    """One daemon: RPCs by type (count, µs), its CPU seconds and the window's length."""
    daemon = agent(cluster, base, heartbeat)
    try:
        time.sleep(settle)  # start-up reads, the probes' first runs
        cluster.rpc_counts(reset=True)
        cpu0, t0 = tree_cpu(daemon.pid), time.monotonic()
        time.sleep(seconds)
        counts = cluster.rpc_counts()
        return counts, tree_cpu(daemon.pid) - cpu0, time.monotonic() - t0
    finally:
        stop(daemon)


def measure(size: int, args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    """RPCs at a short heartbeat (scaled to the default), CPU at the default heartbeat."""
    with SlurmCluster(2, placeholders=size - 2, held_jobs=args.held_jobs) as cluster:
        job = cluster.submit("node1", seconds=int(args.seconds + args.cpu_seconds) + 600)
        try:
            counts, _cpu, seconds = window(
                cluster, tmp / f"rpc{size}", args.window_heartbeat, args.settle, args.seconds
            )
            _counts, cpu, cpu_seconds = window(
                cluster, tmp / f"cpu{size}", args.heartbeat, args.settle, args.cpu_seconds
            )
        finally:
            cluster.run("scancel", job)
        version = cluster.run("sinfo", "-V").stdout.strip()
    scale = 3600.0 / seconds * (args.window_heartbeat / args.heartbeat)
    return {
        "size": size,
        "rpcs": {k: c * scale for k, (c, _t) in sorted(counts.items())},
        "usec": sum(t for _c, t in counts.values()) * scale,  # controller µs per node-hour
        "cpu": cpu / cpu_seconds * 100.0,
        "version": version,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,2000,5000", help="cluster sizes (nodes)")
    parser.add_argument("--seconds", type=float, default=60.0, help="RPC window per size")
    parser.add_argument("--cpu-seconds", type=float, default=120.0, help="CPU window per size")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds before the window")
    parser.add_argument("--held-jobs", type=int, default=3000, help="held jobs queued")
    parser.add_argument("--heartbeat", type=float, default=600.0, help="heartbeat reported")
    parser.add_argument("--window-heartbeat", type=float, default=10.0, help="heartbeat run")
    parser.add_argument("--xid-runs", type=int, default=30, help="Xid -> DRAIN runs (0: none)")
    parser.add_argument("--xid-size", type=int, default=2000, help="cluster size for Xid runs")
    parser.add_argument("--warm", action="store_true", help="an Xid 13 line before each Xid run")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="hma-scale-bench-") as tmp:
        rows = [measure(size, args, Path(tmp)) for size in sizes]
        xid: list[float] = []
        applied: list[float] = []
        if args.xid_runs:
            with SlurmCluster(
                2, placeholders=args.xid_size - 2, held_jobs=args.held_jobs
            ) as cluster:
                xid, applied = bench_xid(
                    cluster, Path(tmp), args.xid_runs, node="node2", warm=args.warm
                )
    print(f"machine: {machine()}")
    print(
        f"slurm: {rows[0]['version'] if rows else '?'}; 2 slurmd + placeholder nodes, "
        f"{args.held_jobs} held jobs; one hma run on node1 with a running job. RPCs: "
        f"{args.seconds:g} s at heartbeat {args.window_heartbeat:g} s, scaled to heartbeat "
        f"{args.heartbeat:g} s; CPU: {args.cpu_seconds:g} s at heartbeat {args.heartbeat:g} s"
    )
    for row in rows:
        rpcs = row["rpcs"]
        assert isinstance(rpcs, dict)
        total = sum(rpcs.values())
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in rpcs.items()) or "none"
        usec = float(row["usec"])  # type: ignore[arg-type]
        share = usec * 10000 / 3600 / 1e6 * 100  # 10,000 agents, % of one core
        print(
            f"{row['size']:>6} nodes: {total:.1f} controller RPCs per node-hour ({kinds}); "
            f"slurmctld {usec / 1000:.2f} ms per node-hour -> 10,000 agents {share:.3f}% of a "
            f"core; agent CPU {row['cpu']:.3f}% of a core"
        )
    if xid:
        print(summary(f"Xid kernel line -> DRAIN at {args.xid_size} nodes (hma run)", xid))
        print(summary("Xid kernel line -> slurmctld sets the drain (its log)", applied))
    return 0


if __name__ == "__main__":
    sys.exit(main())
