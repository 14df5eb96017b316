"""GPU reset tool stand-in for the kill -9 test: runs the real one (the stand-in nvidia-smi),
logs the run, and once kills the agent that called it right after the reset, before the agent
reads its outcome.

    gpu_reset_command = [python, reset_wrapper.py, LOGFILE, python, tests/standin/nvidia-smi]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main() -> int:
    """Reset, log, kill the parent the first time."""
    logfile, real = sys.argv[1], sys.argv[2:]
    rc = subprocess.run(real, check=False, timeout=60).returncode
    with open(logfile, "a") as fh:
        fh.write(f"ran rc={rc} " + " ".join(real[2:]) + "\n")
    marker = logfile + ".killed"
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getppid(), signal.SIGKILL)
    return rc


if __name__ == "__main__":
    sys.exit(main())
