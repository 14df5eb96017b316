"""Operator requests to the running daemon: the state store's ``requests`` table.

A command (``hma ack``, ``hma reset``, ``hma maintenance``, deep-check results) queues a request
in the state file and wakes the daemon with SIGUSR1 (``request_daemon``); the daemon takes the
pending ones from the file (``Inbox``) and applies them (hma.daemon.operator).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
from typing import Any, Optional

from hma.detection.setup import Setup
from hma.health.store import Store
from hma.reporters import statusfile

ACK = "ack"  # the kinds of request hma's own commands queue (maintenance: its contract's)
RESET = "reset"


def add(store: Store, kind: str, payload: dict[str, Any], who: str, now: float) -> int:
    """Queue an operator request for the daemon; returns its id."""
    with store.transaction() as conn:
        cur = conn.execute(
            "INSERT INTO requests (ts, kind, payload, who) VALUES (?, ?, ?, ?)",
            (now, kind, json.dumps(payload), who),
        )
        return int(cur.lastrowid or 0)


def request_daemon(
    setup: Setup, store: Store, kind: str, payload: dict[str, Any], who: str, now: float
) -> Optional[int]:
    """Queue an operator request for the running daemon and wake it (SIGUSR1); the daemon's
    pid, or None (nothing queued) when no daemon of this boot runs."""
    paths, agent = setup.config.section("paths"), setup.config.section("agent")
    pid = statusfile.daemon_pid(agent["run_dir"], paths["procfs"])
    if pid is not None:
        add(store, kind, payload, who, now)
        os.kill(pid, signal.SIGUSR1)
    return pid


class Inbox:
    """The daemon's side of the table: the pending requests, each taken once."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._taken: set[int] = set()  # requests handled but not yet marked done in the file

    def take(self, now: float) -> list[dict[str, Any]]:
        """Pending requests, marked done. Other processes (``hma ack``) write them to the file,
        so they are read there; one that cannot be marked done in the file is still taken once."""
        with self.store.on_file() as disk:
            if disk is None:
                return []  # the file could not be opened yet: taken once it can
            try:
                rows = disk.execute(
                    "SELECT id, ts, kind, payload, who FROM requests WHERE done IS NULL ORDER BY id"
                ).fetchall()
            except sqlite3.Error:
                return []  # unreadable now: taken with a later request
            rows = [r for r in rows if r[0] not in self._taken]
            self._taken.update(r[0] for r in rows)
            try:
                disk.execute("BEGIN IMMEDIATE")
                disk.execute("UPDATE requests SET done = ? WHERE done IS NULL", (now,))
                disk.execute("COMMIT")
                self._taken.clear()
            except sqlite3.Error:  # tried again with the next request; write_error comes from
                with contextlib.suppress(sqlite3.Error):  # the store's own writes
                    disk.execute("ROLLBACK")
        return [
            {"id": r[0], "ts": r[1], "kind": r[2], "payload": json.loads(r[3]), "who": r[4]}
            for r in rows
        ]
