"""``hma maintenance on|off|status``: planned work on a node without hma acting on it.

While on, hma detects, records and alerts but takes no action on this node (the remediation
engine holds every action, hma.remediation.engine); it ends by itself after ``--for``. The window
is kept in the state store (it survives restarts): a running daemon gets it as a request (like
``hma ack``), otherwise it is written directly. The node's label field in Slurm gets an
``hma-maint=<until>`` word, so ``hma fleet`` lists the node (hma.contracts.maintenance).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

from hma.adapters.text import printable
from hma.commands import common
from hma.config.files import ConfigError
from hma.contracts import label
from hma.contracts.cluster import BackendError
from hma.contracts.maintenance import (
    REQUEST_KIND,
    TOKEN_PREFIX,
    Maintenance,
    clean_reason,
    parse_duration,
)
from hma.detection.setup import Setup
from hma.health import maintenance_mode
from hma.health.requests import request_daemon
from hma.health.store import Store

EX_USAGE = 2


def mark_in_slurm(setup: Setup, window: Optional[Maintenance]) -> str:
    """Write (or remove) the node's ``hma-maint=`` word in its Slurm label field through the
    configured backend: one node read and at most one update. Returns what happened, for the
    operator."""
    try:
        backend = common.scheduler(setup)
    except ConfigError as exc:
        return f"not marked in Slurm ({printable('; '.join(exc.errors))})"
    if not backend.enabled:
        return "not marked in Slurm (Slurm is not used here)"
    try:
        name = backend.node_name_configured() or backend.find_node_name()
        if not name:
            return "not marked in Slurm: this host is not a Slurm node"
        node = backend.node(name)
        field = str(setup.config.section("recovery")["label_field"])
        old = node.field(field)
        new = label.edit_token(old, TOKEN_PREFIX, window.token() if window else None)
        if new != old:
            backend.label(name, new)
    except BackendError as exc:
        return f"not marked in Slurm ({printable(str(exc))}): `hma fleet` will not list it"
    return f"marked in Slurm ({name} {field})"


def status_lines(window: Optional[Maintenance], now: float) -> list[str]:
    """``hma maintenance status`` (and the line of ``hma status``)."""
    if window is None or not window.active(now):
        return ["maintenance: off"]
    return [
        f"maintenance: ON since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(window.since))}"
        f", {printable(window.describe())}",
        "  hma detects, records and alerts; it takes no action on this node",
    ]


def main(setup: Setup, action: str, duration: Optional[str], reason: str, as_json: bool) -> int:
    """Exit 0; 2 on a bad duration or option; 77 when on/off is not run as root; 73 when the
    state store cannot be opened; 3 when a user other than root asks for the status and no
    daemon's status file says it (docs/cli.md)."""
    now = time.time()
    window: Optional[Maintenance] = None
    if action == "on":
        try:
            seconds = parse_duration(duration) if duration is not None else None
        except ValueError as exc:
            print(f"hma maintenance: --for: {exc}", file=sys.stderr)
            return EX_USAGE
        until = now + seconds if seconds is not None else None
        window = Maintenance(now, until, clean_reason(reason), common.operator())
    elif duration is not None or reason:
        print(f"hma maintenance {action}: --for and --reason go with `on`", file=sys.stderr)
        return EX_USAGE
    if action != "status" and common.needs_root("hma maintenance"):
        return common.EX_NOPERM
    if action == "status" and os.geteuid() != 0:  # the store is root's: the daemon's status
        return _status_from_file(setup, now, as_json)
    if action == "status":
        return common.with_store(
            setup,
            "hma maintenance",
            lambda store: _status(maintenance_mode.load(store), now, as_json),
            "maintenance" if as_json else "",
        )
    return common.with_store(
        setup, "hma maintenance", lambda store: _change(setup, store, window, now)
    )


def _change(setup: Setup, store: Store, window: Optional[Maintenance], now: float) -> int:
    """Turn maintenance on (``window``) or off: the daemon's request, else the store; then the
    mark in Slurm."""
    who = common.operator()
    payload: dict[str, Any] = {"window": window.to_json() if window else None}
    pid = request_daemon(setup, store, REQUEST_KIND, payload, who, now)
    if pid is None:
        maintenance_mode.save(store, window, who, now)
    slurm = mark_in_slurm(setup, window)
    told = f"daemon pid {pid} notified" if pid is not None else "no daemon running"
    if window is not None:
        print(f"maintenance on, {printable(window.describe())}; {told}; {slurm}")
    else:
        print(f"maintenance off; {told}; {slurm}")
    return 0


def _status_from_file(setup: Setup, now: float, as_json: bool) -> int:
    """``status`` for a user who cannot read the state store: the running daemon's status.json
    (3 with the problem when there is no usable one)."""
    from hma.reporters import statusfile

    doc, problem = statusfile.read(setup.config.section("agent")["run_dir"])
    try:
        raw = (doc or {}).get("maintenance")
        window = Maintenance.from_json(raw) if isinstance(raw, dict) else None
    except ValueError as exc:
        doc, problem = None, f"status file: maintenance unreadable: {exc}"
    if doc is None or problem:
        print(f"hma maintenance: {printable(problem)}", file=sys.stderr)
        if as_json:
            common.dump(common.problem("maintenance", problem))
        return 3
    return _status(window, now, as_json)


def _status(window: Optional[Maintenance], now: float, as_json: bool) -> int:
    if as_json:
        doc = window.to_json(now) if window is not None else {"active": False}
        common.dump({"command": "maintenance", **doc})
    else:
        print("\n".join(status_lines(window, now)))
    return 0
