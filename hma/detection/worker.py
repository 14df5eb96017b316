"""Worker process for ``isolation = "process"`` probes: JSON request lines in, answers out.

Started by ``hma.detection.runner.ProcessSlot`` as ``python -m hma.detection.worker PROBE``; it
loads the probe through
the entry point group (never by module name) and serves requests until its stdin closes or it
answers "unsupported" (a probe that does not apply keeps no process).
"""

from __future__ import annotations

import json
import os
import sys

from hma.contracts.model import RunStatus
from hma.contracts.probe import ProbeContext
from hma.detection.registry import discover
from hma.detection.runner import DEBUG_ENV, Collected, collect_guarded, encode_answer


def main(argv: list[str]) -> int:
    """Serve collect requests for the probe named in ``argv[0]``."""
    _restore_pythonpath()
    if os.environ.pop(DEBUG_ENV, ""):  # its caller logs at debug: reads and commands too
        from hma.adapters import logs

        logs.configure("debug")
    name = argv[0] if argv else ""
    classes, broken = discover(names=[name])  # this probe's module only, not every probe's
    cls = classes.get(name)
    for line in sys.stdin:
        if cls is None:
            why = next((b.error for b in broken if b.name == name), f"no probe named {name!r}")
            answer = Collected(RunStatus.FAILED, error=why)
        else:
            try:
                ctx = ProbeContext.from_wire(json.loads(line))
                answer = collect_guarded(cls(), ctx)
            except (ValueError, KeyError, TypeError) as exc:
                answer = Collected(RunStatus.FAILED, error=f"bad request: {exc}")
        try:
            sys.stdout.write(encode_answer(answer) + "\n")
        except (TypeError, ValueError) as exc:
            sys.stdout.write(
                encode_answer(Collected(RunStatus.FAILED, error=f"snapshot not JSON: {exc}")) + "\n"
            )
        sys.stdout.flush()
        if answer.status is RunStatus.UNSUPPORTED:
            break  # nothing to do here: the slot starts a worker again only when things change
    return 0


def _restore_pythonpath() -> None:
    """Give the probe's own subprocesses the caller's PYTHONPATH, not the one that found hma."""
    if "WORKER_CALLER_PYTHONPATH" in os.environ:
        caller = os.environ.pop("WORKER_CALLER_PYTHONPATH")
        if caller:
            os.environ["PYTHONPATH"] = caller
        else:
            os.environ.pop("PYTHONPATH", None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
