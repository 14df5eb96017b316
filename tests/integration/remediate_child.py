"""A one-node agent stand-in for the kill -9 tests: decide a drain, wait until it is applied.

    python -m tests.integration.remediate_child CONFIG STATE_DB

Prints the outbox rows as JSON when nothing is left to do.
"""

from __future__ import annotations

import json
import sys
import time

from hma import assembly
from hma.contracts.model import Action
from hma.health.store import Store
from hma.remediation.engine import Remediator
from tests.integration.remediation_helpers import fault, verdict


def main() -> int:
    """Run until every action is final."""
    setup = assembly.load(sys.argv[1])
    store = Store(sys.argv[2])
    rem = Remediator(setup, store)
    rem.update(verdict(fault(action=Action.NONE)), "boot-1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = rem.status()["actions"]
        if rows and all(r["state"] in ("done", "held", "skipped") for r in rows):
            break
        time.sleep(0.05)
    print(json.dumps(rem.status()["actions"]))
    rem.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
