"""The fault the remediation tests act on, built once for the unit and integration suites."""

from __future__ import annotations

import time
from typing import Optional

from hma.contracts.model import Action, Clears, Severity
from hma.health.model import Fault


def fault(
    code: str = "GPU_XID_79",
    component: str = "gpu:0000:3b:00",
    action: Action = Action.REBOOT,
    clears: Clears = Clears.REBOOT,
    message: str = "Xid 79: GPU has fallen off the bus",
    first: Optional[float] = None,
    last: Optional[float] = None,
) -> Fault:
    """An active, draining, critical fault, first and last seen now unless given."""
    now = time.time()
    return Fault(
        code,
        component,
        Severity.CRITICAL,
        action,
        message,
        {},
        "test",
        now if first is None else first,
        now if last is None else last,
        1,
        True,
        clears,
        True,
    )
