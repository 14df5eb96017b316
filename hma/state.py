"""The state store: SQLite (standard library) in ``[agent] state_dir``.

Tables: ``faults`` (health-model records), ``history`` (findings and transitions, bounded by
``[agent] history_days``), ``boots``, ``kv`` (counters, cursors, probe baselines), ``actions``
(the remediation outbox) and ``requests`` (operator requests such as ``hma ack`` for the daemon).
The schema is versioned with ``PRAGMA user_version`` and migrated forward step by step. A corrupt
or unreadable database is moved aside, a fresh one created and ``reset`` set, so that the daemon
raises ``HMA_STATE_RESET`` and goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from hma.health import Record

SCHEMA_VERSION = 2

# MIGRATIONS[n] takes a database from version n to n + 1.
MIGRATIONS: list[str] = [
    # 0 -> 1: the first schema.
    """
    CREATE TABLE faults (component TEXT NOT NULL, code TEXT NOT NULL, data TEXT NOT NULL,
                         PRIMARY KEY (component, code));
    CREATE TABLE history (id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL,
                          code TEXT, component TEXT, severity TEXT, message TEXT, details TEXT);
    CREATE TABLE boots (boot_id TEXT PRIMARY KEY, first_seen REAL NOT NULL);
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE actions (id INTEGER PRIMARY KEY, key TEXT UNIQUE, kind TEXT, node TEXT,
                          reason TEXT, payload TEXT, state TEXT, attempts INTEGER DEFAULT 0,
                          last_error TEXT DEFAULT '', created REAL, updated REAL, next_try REAL);
    """,
    # 1 -> 2: who did what (acks), operator requests to the daemon, history index for retention.
    """
    ALTER TABLE history ADD COLUMN who TEXT DEFAULT '';
    CREATE INDEX history_ts ON history (ts);
    CREATE TABLE requests (id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL,
                           payload TEXT NOT NULL, who TEXT DEFAULT '', done REAL);
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION


class StateError(Exception):
    """The state folder itself is unusable (not the database file)."""


class Store:
    """Thread-safe access to the state database."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.reset_reason = ""  # set when a broken database was moved aside
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"{self.path.parent}: {exc.strerror}") from None
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError as exc:
            self.reset_reason = f"{type(exc).__name__}: {exc}"
            self._move_aside()
            self._conn = self._open()

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(self.path), timeout=10, check_same_thread=False, isolation_level=None
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            row = conn.execute("PRAGMA quick_check").fetchone()
            if row is None or row[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {row[0] if row else 'no answer'}")
            self._migrate(conn)
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {version} is newer than {SCHEMA_VERSION}")
        while version < SCHEMA_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version + 1}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            version += 1

    def _move_aside(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                os.replace(src, Path(f"{self.path}.corrupt-{stamp}{suffix}"))

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A connection inside BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error), under the lock."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # --- key/value ------------------------------------------------------------------------------

    def kv_get(self, key: str, default: Any = None) -> Any:
        """JSON value stored under ``key``, or ``default``."""
        with self._lock:
            row = self._conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def kv_set(self, key: str, value: Any) -> None:
        """Store a JSON-able value."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )

    # --- health records -------------------------------------------------------------------------

    def load_records(self) -> tuple[list[Record], list[str]]:
        """Stored health records, and a note per row that could not be read (dropped)."""
        records, bad = [], []
        with self._lock:
            rows = self._conn.execute("SELECT component, code, data FROM faults").fetchall()
        for component, code, data in rows:
            try:
                records.append(Record.from_json(json.loads(data)))
            except (ValueError, KeyError, TypeError) as exc:
                bad.append(f"{component} {code}: {exc}")
        return records, bad

    def save_records(
        self, changed: list[tuple[str, str]], present: dict[tuple[str, str], Record]
    ) -> None:
        """Write the changed keys: upsert those still present, delete the others."""
        with self.transaction() as conn:
            for key in changed:
                rec = present.get(key)
                if rec is None:
                    conn.execute("DELETE FROM faults WHERE component = ? AND code = ?", key)
                else:
                    conn.execute(
                        "INSERT INTO faults (component, code, data) VALUES (?, ?, ?) "
                        "ON CONFLICT(component, code) DO UPDATE SET data = excluded.data",
                        (*key, json.dumps(rec.to_json())),
                    )

    # --- history, boots, requests ---------------------------------------------------------------

    def add_history(
        self,
        ts: float,
        kind: str,
        code: str = "",
        component: str = "",
        severity: str = "",
        message: str = "",
        details: Optional[dict[str, Any]] = None,
        who: str = "",
    ) -> None:
        """Append one history row."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO history (ts, kind, code, component, severity, message, details, who)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (ts, kind, code, component, severity, message, json.dumps(details or {}), who),
            )

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        """Newest history rows first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT ts, kind, code, component, severity, message, details, who FROM history "
                "ORDER BY id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        keys = ("ts", "kind", "code", "component", "severity", "message", "details", "who")
        return [dict(zip(keys, row)) for row in rows]

    def prune_history(self, older_than: float) -> int:
        """Delete history rows before ``older_than``; returns how many."""
        with self.transaction() as conn:
            return conn.execute("DELETE FROM history WHERE ts < ?", (older_than,)).rowcount

    def note_boot(self, boot_id: str, now: float) -> bool:
        """Record a boot id; True when it was not known (the node rebooted)."""
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO boots (boot_id, first_seen) VALUES (?, ?)", (boot_id, now)
            )
            return cur.rowcount == 1

    def boot_count(self) -> int:
        """How many distinct boots were seen."""
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM boots").fetchone()[0])

    def add_request(self, kind: str, payload: dict[str, Any], who: str, now: float) -> int:
        """Queue an operator request for the daemon; returns its id."""
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO requests (ts, kind, payload, who) VALUES (?, ?, ?, ?)",
                (now, kind, json.dumps(payload), who),
            )
            return int(cur.lastrowid or 0)

    def take_requests(self, now: float) -> list[dict[str, Any]]:
        """Pending requests, marked done."""
        with self.transaction() as conn:
            rows = conn.execute(
                "SELECT id, ts, kind, payload, who FROM requests WHERE done IS NULL ORDER BY id"
            ).fetchall()
            conn.execute("UPDATE requests SET done = ? WHERE done IS NULL", (now,))
        return [
            {"id": r[0], "ts": r[1], "kind": r[2], "payload": json.loads(r[3]), "who": r[4]}
            for r in rows
        ]
