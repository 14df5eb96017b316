#!/usr/bin/env python3
"""What `hma watch` costs slurmctld as the cluster grows (needs root).

    .venv/bin/python bench/bench_watch.py [--sizes 100,2000] [--passes 10]

For each size a loopback Slurm (tests/slurmcluster.py) of 2 slurmd plus ``size - 2`` nodes without
slurmd (down and not responding: every client RPC pays for them, and the watcher's breaker holds
every action, as it would in a partition of that size) runs ``--passes`` passes of ``hma watch
--once`` (each a pass of the service: one node-table read, ``scontrol ping``, the reboot deadline
from ``scontrol show config`` once per process). Reported per pass: slurmctld's RPCs by type and
its time for them (``sdiag``, reset before the first pass), slurmctld's CPU (utime + stime of its
process, /proc), and the watcher's own wall time; from these the share of one slurmctld core at
the default interval of 30 s.
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
from common import machine  # noqa: E402

from hma.watch.options import WATCH  # noqa: E402
from tests.slurmcluster import SlurmCluster  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure(size: int, passes: int, tmp: Path) -> dict[str, object]:
    """One cluster of ``size`` nodes, ``passes`` watcher passes."""
    with SlurmCluster(2, placeholders=size - 2) as cluster:
        cfg = tmp / f"watch-{size}.toml"
        cfg.write_text(
            f'[slurm]\nconf = "{cluster.conf}"\n'
            f'[recovery]\nreboot_command = ["/bin/true"]\n'
            f'[watch]\nstate_dir = "{tmp}/state-{size}"\ndown_after = 1.0\n'
            "[reporters.journald]\nenabled = false\n"
        )
        argv = [sys.executable, "-m", "hma", "--config", str(cfg), "watch", "--once"]
        ctld = int((cluster.base / "run" / "slurmctld.pid").read_text())
        subprocess.run(argv, check=True, timeout=120, cwd=tmp, capture_output=True)  # warm up
        cluster.rpc_counts(reset=True)
        before, walls = cpu_s(ctld), []
        for _ in range(passes):
            started = time.monotonic()
            subprocess.run(argv, check=True, timeout=120, cwd=tmp, capture_output=True)
            walls.append(time.monotonic() - started)
        cpu = (cpu_s(ctld) - before) / passes
        counts = cluster.rpc_counts()
    rpc_us = sum(total for _count, total in counts.values()) / passes
    interval = float(WATCH["interval"].default)
    return {
        "size": size,
        "rpcs": {name: count / passes for name, (count, _t) in sorted(counts.items())},
        "rpc_ms": rpc_us / 1000,
        "ctld_cpu_ms": cpu * 1000,
        "share": cpu / interval,
        "wall_s": sorted(walls)[len(walls) // 2],
    }


def main() -> int:
    """Run the sizes and print one block per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,2000")
    parser.add_argument("--passes", type=int, default=10)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="hma-bench-watch-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            got = measure(size, args.passes, Path(tmp))
            rpcs = ", ".join(f"{name} {n:g}" for name, n in got["rpcs"].items())  # type: ignore[attr-defined]
            print(
                f"{size} nodes: per pass {rpcs}; slurmctld RPC time {got['rpc_ms']:.1f} ms, "
                f"slurmctld CPU {got['ctld_cpu_ms']:.1f} ms = {100 * got['share']:.3f}% of one "
                f"core at a pass every 30 s; watcher pass {got['wall_s']:.2f} s (median)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
