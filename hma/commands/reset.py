"""``hma reset [--all | CODE [COMPONENT]] --reason TEXT``: a human says the node was repaired.

It clears the node's remediation history, reboot counts and the hold for a human (a repeat
offender) for what it names, records who (the sudo caller) and why in the state store and in a
journald alert, and has the label field in Slurm written again (no count or label left behind).
The node is resumed only after a healthy observation. A running daemon gets the request the way
``hma ack`` hands it over (queued in the state store, SIGUSR1); without one, the state store is
changed directly and the label written at once (or by the agent's next start when Slurm cannot be
reached now). docs/remediation.md, "Repeat offenders".
"""

from __future__ import annotations

import re
import sys
import time
from typing import Optional

from hma.adapters.text import plain, printable
from hma.commands.common import operator, with_store
from hma.contracts.catalogue import suggest
from hma.contracts.cluster import BackendError
from hma.detection.setup import Setup
from hma.health import requests
from hma.health.pipeline import reporter_alerts
from hma.health.store import Store
from hma.remediation.engine import Remediator, reset_alert

MAX_REASON = 300
_COMPONENT = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")


def problem(code: Optional[str], component: Optional[str], reason: str, setup: Setup) -> str:
    """What is wrong with the arguments ("" nothing)."""
    if not reason.strip():
        return "--reason must say what was repaired"
    if len(reason) > MAX_REASON or not plain(reason):
        return f"--reason: at most {MAX_REASON} printable characters on one line"
    if code is not None and setup.catalogue.get(code) is None:
        maybe = suggest(setup.catalogue, code)
        return f"unknown code {printable(code)}" + (
            f" (did you mean {', '.join(maybe)}?)" if maybe else ""
        )
    if component is not None and not _COMPONENT.fullmatch(component):
        return f"not a component: {printable(component)}"
    return ""


def main(setup: Setup, code: Optional[str], component: Optional[str], reason: str) -> int:
    """Validate, record and deliver the reset (``code`` None: ``--all``); exit 0 done, 2
    misuse, 73 state store unusable (77 not root: hma.cli)."""
    why = problem(code, component, reason, setup)
    if why:
        print(f"hma reset: {why}", file=sys.stderr)
        return 2
    request = {"code": code, "component": component, "reason": reason.strip()}
    return with_store(setup, "hma reset", lambda store: _reset(setup, store, request))


def _reset(setup: Setup, store: Store, request: dict[str, Optional[str]]) -> int:
    code, component, text = request["code"], request["component"], str(request["reason"])
    what = f"{code}" + (f" on {component}" if component else "") if code else "everything"
    who, now = operator(), time.time()
    pid = requests.request_daemon(setup, store, requests.RESET, request, who, now)
    if pid is not None:
        print(f"reset {what}; daemon pid {pid} notified")
        return 0
    remediator = Remediator(setup, store, start=False)
    try:
        note = ""
        if remediator.enabled:
            try:
                remediator.refresh()  # the node's name, for the label written again
            except BackendError as exc:
                note = f"; Slurm: {exc}"
        done = remediator.release(code, component, who, text)
        reporter_alerts(setup, "hma reset")(reset_alert(request, who, done, now))
        if remediator.enabled:
            remediator.process_due()
        pending = remediator.status()["pending"]
    finally:
        remediator.close()
    held = ", released the hold for a human" if done["released"] else ""
    later = "; the label is written by the agent's next start" if pending else ""
    print(
        f"reset {what}: {done['cleared']} remediation(s), {done['reboots_cleared']} reboot(s)"
        f" cleared{held}; no daemon running{printable(note)}{later}"
    )
    return 0
