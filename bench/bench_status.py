"""Wall time of `hma status` against a bare interpreter start (median of 20 runs each).

Runs the real console script of this environment against a fresh status.json written by
hma.status.write_atomic (pid = this process, so the file counts as live). Prints the machine too.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hma import status

RUNS = 20
ROOT = Path(__file__).resolve().parent.parent


def median_wall(argv: list[str], env: dict[str, str]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=False, timeout=60)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def main() -> None:
    python = os.path.realpath(sys.executable)
    hma = str(Path(sys.executable).with_name("hma"))
    with tempfile.TemporaryDirectory() as tmp:
        doc = json.loads((ROOT / "tests/fixtures/status/sample.json").read_text())
        doc.update(pid=os.getpid(), boot_id=status.current_boot_id(), generated=time.time())
        status.write_atomic(status.status_path(tmp), doc)
        cfg = Path(tmp) / "hma.toml"
        cfg.write_text(f'[agent]\nrun_dir = "{tmp}"\n')
        env = {**os.environ, "HMA_CONFIG": str(cfg)}
        bare = median_wall([python, "-c", "pass"], env)
        ours = median_wall([hma, "status"], env)
        ours_json = median_wall([hma, "status", "--json"], env)
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}")
    print(f"interpreter: {python}")
    print(f"python3 -c pass    median of {RUNS}: {bare * 1000:7.1f} ms")
    for label, value in (("hma status", ours), ("hma status --json", ours_json)):
        print(f"{label:<18} median of {RUNS}: {value * 1000:7.1f} ms  ({value / bare:.2f}x bare)")


if __name__ == "__main__":
    main()
