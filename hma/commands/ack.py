"""``hma ack CODE [COMPONENT]``: an operator clears a fault that clears by operator.

The request is recorded (who, when) in the state store; a running daemon is told with SIGUSR1
and applies it at once (alerting through journald). Without a daemon it is applied to the state
store directly, as the daemon would (hma.health.pipeline: history and alerts), and the next start
finds the fault gone.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

from hma.adapters.text import printable
from hma.commands.common import operator, with_store
from hma.contracts.catalogue import Entry, clears_text
from hma.contracts.model import Clears
from hma.detection.setup import Setup
from hma.health import requests
from hma.health.pipeline import command_pipeline
from hma.health.store import Store


def main(setup: Setup, code: str, component: Optional[str]) -> int:
    """Validate, record and deliver the acknowledgement; exit 0 on success, 1 nothing to ack,
    2 on misuse, 77 not root, 73 state store unusable (docs/cli.md)."""
    entry: Optional[Entry] = setup.catalogue.get(code)
    if entry is None:
        print(f"hma ack: unknown code {printable(code)}", file=sys.stderr)
        return 2
    if entry.clears is not Clears.OPERATOR:
        print(
            f"hma ack: {code} is not acknowledged by an operator: it clears {clears_text(entry)}."
            " Nothing to do.",
            file=sys.stderr,
        )
        return 2
    return with_store(setup, "hma ack", lambda store: _ack(setup, store, code, component))


def _ack(setup: Setup, store: Store, code: str, component: Optional[str]) -> int:
    pipeline = command_pipeline(setup, store, "hma ack")
    matching = [
        r
        for r in pipeline.model.records()
        if r.code == code and (component is None or r.component == component)
    ]
    if not matching:
        shown = printable(code) + (f" on {printable(component)}" if component else "")
        print(f"hma ack: no active {shown}", file=sys.stderr)
        return 1
    who, now, shown = operator(), time.time(), printable(code)
    pid = requests.request_daemon(
        setup, store, requests.ACK, {"code": code, "component": component}, who, now
    )
    if pid is not None:
        print(f"acknowledged {shown} ({len(matching)} fault(s)); daemon pid {pid} notified")
    else:
        pipeline.start(now)  # as the daemon would have: a new boot first, ...
        pipeline.ack(code, component, who, now)
        print(f"acknowledged {shown} ({len(matching)} fault(s)); no daemon running")
    return 0
