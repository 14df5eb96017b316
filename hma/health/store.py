"""The state store's engine: SQLite (standard library) in ``[agent] state_dir``.

The engine owns the file, the schema and how writes reach the file. Each table's SQL lives with
its owner, which reads through ``rows`` and writes inside ``transaction``: ``faults``,
``occurrences`` and ``boots`` in hma.health.records, ``history`` (findings, transitions and
operators' acts, bounded by ``[agent] history_days``) in hma.health.history, ``maintenance`` (the
window of ``hma maintenance``) in hma.health.maintenance_mode, ``actions`` (the remediation
outbox) in hma.remediation.outbox, ``remediations`` (the node's history of remediations: repeat
offenders, ``hma reset``) in hma.remediation.remediations, ``requests`` (operator requests such as
``hma ack`` for the daemon, read from the file through ``on_file``) in hma.health.requests. ``kv``
(cursors, probe baselines, remediation state) is the engine's own facility for the small JSON
values that many owners keep (``kv_get``, ``kv_set``).

The schema is versioned with ``PRAGMA user_version`` and migrated forward step by step. A corrupt
database is moved aside, a fresh one created and ``reset`` set, so that the daemon raises
``HMA_STATE_RESET`` and goes on. The database and its -wal/-shm files are 0600.

The daemon's store works from memory (``memory=True``): reads and writes go to an in-memory copy
loaded at start, and every write transaction is then replayed on the file at once. When the file
cannot be written (full disk, I/O error, another process's lock held past 0.5 s) nothing the
agent does fails: the writes queue, ``write_error`` names the path and the error, ``flush()``
retries with backoff (1 s doubling to 60 s) and until a retry is due no transaction touches the
file; once a retry succeeds the file holds everything again. When the file cannot even be opened
at start (it needs to create its -wal and -shm), the memory copy is read from it without writing
and the file is opened by a later retry. Past ``MAX_PENDING`` bytes of queued statements the queue
is dropped and the whole memory copy is written back instead.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

SCHEMA_VERSION = 5

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
    # 2 -> 3: the node's remediations (docs/remediation.md "Repeat offenders").
    """
    CREATE TABLE remediations (id INTEGER PRIMARY KEY, ts REAL NOT NULL, episode INTEGER,
                               code TEXT NOT NULL, component TEXT NOT NULL, action TEXT NOT NULL,
                               boot_id TEXT DEFAULT '', who TEXT DEFAULT '', note TEXT DEFAULT '');
    """,
    # 3 -> 4: occurrences of counted codes ([codes.X] after/within), per (scope, code).
    """
    CREATE TABLE occurrences (scope TEXT NOT NULL, code TEXT NOT NULL, data TEXT NOT NULL,
                              PRIMARY KEY (scope, code));
    """,
    # 4 -> 5: maintenance mode (hma maintenance): at most one row, the window.
    """
    CREATE TABLE maintenance (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL);
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION


class StateError(Exception):
    """The state folder itself is unusable (not the database file)."""


FILE_MODE = 0o600
SUFFIXES = ("", "-wal", "-shm")  # SQLite creates -wal/-shm with the database file's mode
MAX_PENDING = 8 << 20  # bytes of queued statements; beyond, the whole memory copy is written back
RETRY_MIN_S, RETRY_MAX_S = 1.0, 60.0
LOCKED_WAIT_S = 0.5
Statement = tuple[str, tuple[Any, ...]]


class _Recorder:
    """The connection a memory store's transaction hands out: runs statements in memory and
    notes the writes among them for the file."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.writes: list[Statement] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        """Run ``sql``; a statement other than SELECT is noted for the file."""
        cur = self._conn.execute(sql, params)
        if sql.lstrip()[:6].upper() != "SELECT":
            self.writes.append((sql, tuple(params)))
        return cur


class Store:
    """Thread-safe access to the state database (see the module doc for ``memory``)."""

    def __init__(
        self, path: str, memory: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self.reset_reason = ""  # set when a broken database was moved aside
        self.write_error = ""  # "" while the file holds every write
        self._lock = threading.RLock()
        self._clock = clock
        self._pending: list[Statement] = []
        self._pending_bytes = 0
        self._resync = False  # the queue overflowed: write the whole memory copy back
        self._retry_at = 0.0
        self._retry_s = RETRY_MIN_S
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"{self.path.parent}: {exc.strerror}") from None
        self.memory = memory
        self._disk: Optional[sqlite3.Connection] = None  # None: the file could not be opened
        try:
            self._disk = self._open()
        except sqlite3.OperationalError as exc:
            # full disk, I/O error, locked: the file may be fine, never move it aside
            if not memory:
                raise
            self._conn = self._read_only()
            self.write_error, self._resync = f"{type(exc).__name__}: {exc}", True
            self._retry_at = self._clock() + self._retry_s
            return
        except sqlite3.DatabaseError as exc:
            self.reset_reason = f"{type(exc).__name__}: {exc}"
            self._move_aside()
            self._disk = self._open()
        self._conn = self._disk
        if memory:
            self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self._disk.backup(self._conn)

    def _read_only(self) -> sqlite3.Connection:
        """A memory copy of what the file holds, read without writing anything (``immutable``:
        no -wal or -shm; what a crash left in the -wal only is not seen), else an empty one."""
        mem = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            uri = f"file:{urllib.parse.quote(str(self.path))}?immutable=1"
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as src:
                src.execute("PRAGMA quick_check").fetchone()
                src.backup(mem)
        except sqlite3.Error:
            mem.close()
            mem = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._migrate(mem)
        return mem

    def _open(self) -> sqlite3.Connection:
        try:
            _private(self.path, create=True)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS):
                raise sqlite3.OperationalError(f"{self.path}: {exc.strerror}") from None
            raise StateError(f"{self.path}: {exc.strerror}") from None
        # memory mode: another process's write lock (`hma ack`) is waited for briefly, then the
        # writes stay queued for the next retry
        timeout = LOCKED_WAIT_S if self.memory else 10.0
        conn = sqlite3.connect(
            str(self.path), timeout=timeout, check_same_thread=False, isolation_level=None
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
        for suffix in SUFFIXES[1:]:
            _private(Path(f"{self.path}{suffix}"))
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
        for suffix in SUFFIXES:
            src = Path(str(self.path) + suffix)
            if src.exists():
                dst = Path(f"{self.path}.corrupt-{stamp}{suffix}")
                os.replace(src, dst)
                _private(dst)

    def close(self) -> None:
        """Write what is queued (one last try) and close."""
        with self._lock:
            if self.memory:
                self.flush(force=True)
                self._conn.close()
            if self._disk is not None:
                self._disk.close()

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of a SELECT, read under the lock (from the memory copy in memory mode)."""
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """A connection inside BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error), under the lock.

        In memory mode it is a recorder: the writes are replayed on the file after the commit."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            conn: Any = _Recorder(self._conn) if self.memory else self._conn
            try:
                yield conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            if self.memory and conn.writes:
                self._queue(conn.writes)

    # --- writing the file (memory mode) ---------------------------------------------------------

    def _queue(self, writes: list[Statement]) -> None:
        if not self._resync:
            self._pending += writes
            self._pending_bytes += sum(len(sql) + len(repr(params)) for sql, params in writes)
            if self._pending_bytes > MAX_PENDING:
                self._pending, self._pending_bytes, self._resync = [], 0, True
        self.flush()

    def flush(self, force: bool = False) -> bool:
        """Write queued changes to the file when a retry is due (or ``force``); True when the
        file holds everything. Never raises: a failure sets ``write_error`` and the backoff."""
        with self._lock:
            if not self._pending and not self._resync:
                return True
            now = self._clock()
            if not force and now < self._retry_at:
                return False
            try:
                if self._resync:
                    self._write_back()
                else:
                    self._replay()
            except (sqlite3.Error, StateError, OSError) as exc:
                with contextlib.suppress(sqlite3.Error):
                    if self._disk is not None and self._disk.in_transaction:
                        self._disk.execute("ROLLBACK")
                self.write_error = f"{type(exc).__name__}: {exc}"
                self._retry_at = now + self._retry_s
                self._retry_s = min(self._retry_s * 2, RETRY_MAX_S)
                return False
            self._pending, self._pending_bytes, self._resync = [], 0, False
            self.write_error = ""
            self._retry_s = RETRY_MIN_S
            self._retry_at = 0.0
            return True

    def _file(self) -> sqlite3.Connection:
        """The file's connection, opened now if it could not be at start."""
        if self._disk is None:
            self._disk = self._open()
        return self._disk

    def _replay(self) -> None:
        disk = self._file()
        disk.execute("BEGIN IMMEDIATE")
        for sql, params in self._pending:
            disk.execute(sql, params)
        disk.execute("COMMIT")

    def _write_back(self) -> None:
        """The whole memory copy to the file, keeping the requests other processes wrote."""
        disk = self._file()
        rows = disk.execute("SELECT id, ts, kind, payload, who, done FROM requests")
        requests = rows.fetchall()
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.execute("DELETE FROM requests")
        self._conn.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?)", requests)
        self._conn.execute("COMMIT")
        self._conn.backup(disk)

    # --- key/value ------------------------------------------------------------------------------

    def kv_get(self, key: str, default: Any = None) -> Any:
        """JSON value stored under ``key``, or ``default``."""
        found = self.rows("SELECT value FROM kv WHERE key = ?", (key,))
        return json.loads(found[0][0]) if found else default

    def kv_set(self, key: str, value: Any) -> None:
        """Store a JSON-able value."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )

    @contextlib.contextmanager
    def on_file(self) -> Iterator[Optional[sqlite3.Connection]]:
        """The file's own connection, under the lock (None while the file could not be opened):
        for the rows other processes write there (operator requests, hma.health.requests)."""
        with self._lock:
            yield self._disk


def _private(path: Path, create: bool = False) -> None:
    """Make ``path`` 0600 (creating it empty, already 0600, when asked); absent: nothing."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))
    with contextlib.suppress(FileNotFoundError):
        if stat.S_IMODE(os.stat(path).st_mode) != FILE_MODE:
            os.chmod(path, FILE_MODE)
