#!/usr/bin/env python3
"""Core figures: `hma check system` wall time, daemon CPU share and memory (bench_status.py
has `hma status` against a bare interpreter).

    bench/bench_core.py [--daemon-seconds 300]

The interpreter is the real one (sys.executable of the venv, not a pyenv shim). The daemon runs
with the default intervals and an isolated config; CPU is user+system time of the whole process
tree over the window, memory the summed PSS of the tree (smaps_rollup) at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median_ms, pss_kib, time_command, tree, tree_cpu  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--daemon-seconds", type=float, default=300.0)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        config = base / "hma.toml"
        config.write_text(
            f'[agent]\nstate_dir = "{base}/state"\nrun_dir = "{base}/run"\n'
            f'probes_dir = "{base}/probes.d"\n'
        )
        env = {**os.environ, "HMA_CONFIG": str(config)}
        daemon = subprocess.Popen(
            [py, "-m", "hma", "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            while not (base / "run" / "status.json").exists():
                time.sleep(0.1)
            bare = time_command([py, "-c", "pass"], args.runs)
            check = time_command([py, "-m", "hma", "check", "system"], args.runs, env)
            print(machine())
            print(f"python3 -c pass      median {median_ms(bare):7.1f} ms  (n={args.runs})")
            print(f"hma check system     median {median_ms(check):7.1f} ms  (n={args.runs})")
            time.sleep(2)
            cpu0, t0 = tree_cpu(daemon.pid), time.monotonic()
            time.sleep(args.daemon_seconds)
            cpu1, t1 = tree_cpu(daemon.pid), time.monotonic()
            share = 100.0 * (cpu1 - cpu0) / (t1 - t0)
            procs = tree(daemon.pid)
            pss = sum(pss_kib(pid) for pid in procs) / 1024
            print(
                f"daemon over {t1 - t0:.0f} s at default intervals: CPU {share:.3f}% of one core, "
                f"PSS {pss:.1f} MiB ({len(procs)} processes)"
            )
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
