"""A one-node agent stand-in for the kill -9 tests: decide a drain, wait until it is applied.

    python -m tests.integration.remediate_child CONFIG STATE_DB [xid46]

``xid46``: the fault is an Xid 46 on stand-in GPU 3 (a reset code: drain, GPU reset, then the
reboot if the reset did not repair) in this boot, instead of a fault that only drains. Prints the
outbox rows as JSON when nothing is left to do (with ``xid46``: once the reboot's row is final).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hma import assembly
from hma.contracts.model import Action
from hma.health.store import Store
from hma.remediation.engine import Remediator
from tests.integration.remediation_helpers import fault, verdict


def boot_id(procfs: str) -> str:
    """The node's boot id under its procfs root (what the RebootProgram stand-in changes)."""
    return (Path(procfs) / "sys/kernel/random/boot_id").read_text().strip()


def main() -> int:
    """Run until every action is final."""
    setup = assembly.load(sys.argv[1])
    store = Store(sys.argv[2])
    rem = Remediator(setup, store)
    reset_code = sys.argv[3:] == ["xid46"]
    if reset_code:
        boot = boot_id(setup.config.section("paths")["procfs"])
        found = fault("GPU_XID_46", "gpu:0000:5d:00", message="Xid 46: GPU stopped processing")
        rem.update(verdict(found, boot=boot), boot)
    else:
        rem.update(verdict(fault(action=Action.NONE)), "boot-1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = rem.status()["actions"]
        final = rows and all(r["state"] in ("done", "held", "skipped") for r in rows)
        # a reset code: the reset's row is final before the planner adds the reboot's
        if final and (not reset_code or any(r["kind"] == "reboot" for r in rows)):
            break
        time.sleep(0.05)
    print(json.dumps(rem.status()["actions"]))
    rem.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
