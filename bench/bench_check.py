"""Wall time of `hma check system` against a bare interpreter start (median of 20 runs each).

Runs the real console script of this environment (the `system` probe reads this machine's
/proc and /sys) and `python -c pass` on the same interpreter, alternately so that a change of
load hits both, after one warm-up run of each. Byte code is cached (``__pycache__``, ignored by
git) as an installed package's is, whatever PYTHONDONTWRITEBYTECODE says here.
Prints the machine too (issue 14: under 2x the bare start).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median_ms, time_command  # noqa: E402

RUNS = 20


def main() -> None:
    python = sys.executable  # the interpreter the console script runs on (its shebang)
    hma = str(Path(sys.executable).with_name("hma"))
    commands = {
        "python -c pass": [python, "-c", "pass"],
        "hma check system": [hma, "check", "system"],
        "hma check system --json": [hma, "check", "system", "--json"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "hma.toml"
        cfg.write_text(f'[agent]\nrun_dir = "{tmp}"\nstate_dir = "{tmp}"\n')
        env = {**os.environ, "HMA_CONFIG": str(cfg)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        samples: dict[str, list[float]] = {label: [] for label in commands}
        for argv in commands.values():
            time_command(argv, 1, env)
        for _ in range(RUNS):
            for label, argv in commands.items():
                samples[label] += time_command(argv, 1, env)
    print(machine())
    bare = median_ms(samples["python -c pass"])
    for label, values in samples.items():
        ms = median_ms(values)
        print(f"{label:<24} median of {RUNS}: {ms:7.1f} ms  ({ms / bare:.2f}x bare)")


if __name__ == "__main__":
    main()
