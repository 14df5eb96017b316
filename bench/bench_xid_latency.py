#!/usr/bin/env python3
"""Xid detection latency end to end: a kernel line written into the kmsg path of a running
``hma run`` until the fault shows in status.json.

    .venv/bin/python bench/bench_xid_latency.py [--events 60]

The daemon runs with a temporary configuration whose ``[sources.kernel_log] path`` is a FIFO (the
/dev/kmsg record format), every probe disabled. Each event is an Xid 79 line for another GPU (a new
fault, hence a new status.json); this process polls status.json every 0.5 ms until the component
appears. Prints min / median / p99 / max in milliseconds and describes the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, open_writer, stop  # noqa: E402


def components(status: Path) -> set[str]:
    """Components of the faults in status.json (empty while it is absent or mid-rename)."""
    try:
        doc = json.loads(status.read_text())
    except (OSError, ValueError):
        return set()
    return {f["component"] for f in doc.get("faults", [])}


def main() -> int:
    """Start the daemon, time the events, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60, help="events to time (>= 50)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hma-xid-bench-") as tmp:
        base = Path(tmp)
        fifo = base / "kmsg"
        os.mkfifo(fifo)
        config = base / "hma.toml"
        config.write_text(
            f'[agent]\nstate_dir = "{base}/state"\nrun_dir = "{base}/run"\n'
            f'probes_dir = "{base}/probes.d"\n'
            "[probes.system]\nenabled = false\n"
            f'[sources.kernel_log]\npath = "{fifo}"\nbackend = "kmsg"\n'
            f'rules_dir = "{base}/rules.d"\n'
        )
        status = base / "run" / "status.json"
        env = {**os.environ, "HMA_CONFIG": str(config)}
        log = open(base / "daemon.log", "w")  # noqa: SIM115 - closed in finally
        daemon = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        latencies: list[float] = []
        try:
            deadline = time.monotonic() + 60
            while not status.exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    print((base / "daemon.log").read_text(), file=sys.stderr)
                    print("bench: the daemon did not come up", file=sys.stderr)
                    return 1
                time.sleep(0.05)
            fd = open_writer(str(fifo), time.monotonic() + 30)
            for i in range(1, args.events + 1):
                comp = f"gpu:0000:{i:02x}:00"
                line = f"NVRM: Xid (PCI:0000:{i:02x}:00): 79, pid='<unknown>', name=<unknown>, x"
                record = f"4,{i},{i * 1000},-;{line}\n".encode()
                t0 = time.monotonic()
                os.write(fd, record)
                limit = t0 + 10
                while comp not in components(status):
                    if time.monotonic() > limit:
                        print(f"bench: event {i} not seen within 10 s", file=sys.stderr)
                        return 1
                    time.sleep(0.0005)
                latencies.append((time.monotonic() - t0) * 1000)
                time.sleep(random.uniform(0.05, 0.1))
            os.close(fd)
        finally:
            stop(daemon)
            log.close()
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
    print(f"machine: {machine()}")
    print(
        f"Xid line -> status.json over {len(latencies)} events: min {latencies[0]:.1f} ms,"
        f" median {statistics.median(latencies):.1f} ms, p99 {p99:.1f} ms,"
        f" max {latencies[-1]:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
