"""scontrol stand-in for the kill -9 tests: logs every call, and once kills the agent that
called it around the drain (``before``: the drain never reaches Slurm; ``after``: it does;
``log``: never, only the log).

    scontrol = [python, scontrol_wrapper.py, MODE, LOGFILE, /usr/bin/scontrol]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main() -> int:
    """Log, maybe kill the parent, pass the call on."""
    mode, logfile, real, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    drain = "update" in args and "State=DRAIN" in args
    marker = logfile + ".killed"
    kill = drain and mode != "log" and not os.path.exists(marker)
    if kill and mode == "before":
        open(marker, "w").close()
        with open(logfile, "a") as fh:
            fh.write("killed-before " + " ".join(args) + "\n")
        os.kill(os.getppid(), signal.SIGKILL)
        return 1
    rc = subprocess.run([real, *args], check=False, timeout=60).returncode
    with open(logfile, "a") as fh:
        fh.write(f"ran rc={rc} " + " ".join(args) + "\n")
    if kill and mode == "after":
        open(marker, "w").close()
        os.kill(os.getppid(), signal.SIGKILL)
    return rc


if __name__ == "__main__":
    sys.exit(main())
