"""Wall time of `hma status` against a bare interpreter start (median of 20 runs each).

Runs the real console script of this environment against a fresh status.json written by
hma.commands.statusfile.write_atomic (pid = this process, so the file counts as live). Prints the
machine too.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from hma.reporters import statusfile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median_ms, time_command  # noqa: E402

RUNS = 20
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    python = sys.executable  # the interpreter the console script runs on (its shebang)
    hma = str(Path(sys.executable).with_name("hma"))
    with tempfile.TemporaryDirectory() as tmp:
        doc = json.loads((ROOT / "tests/fixtures/status/sample.json").read_text())
        doc.update(pid=os.getpid(), boot_id=statusfile.current_boot_id(), generated=time.time())
        statusfile.write_atomic(statusfile.status_path(tmp), doc)
        cfg = Path(tmp) / "hma.toml"
        cfg.write_text(f'[agent]\nrun_dir = "{tmp}"\n')
        env = {**os.environ, "HMA_CONFIG": str(cfg)}
        bare = median_ms(time_command([python, "-c", "pass"], RUNS, env))
        ours = median_ms(time_command([hma, "status"], RUNS, env))
        ours_json = median_ms(time_command([hma, "status", "--json"], RUNS, env))
    print(machine())
    print(f"python3 -c pass    median of {RUNS}: {bare:7.1f} ms")
    for label, value in (("hma status", ours), ("hma status --json", ours_json)):
        print(f"{label:<18} median of {RUNS}: {value:7.1f} ms  ({value / bare:.2f}x bare)")


if __name__ == "__main__":
    main()
