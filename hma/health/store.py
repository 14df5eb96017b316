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

The schema is versioned with ``PRAGMA user_version`` and migrated forward step by step; at open
the file's tables are checked against it (hma.health.schema). A missing table is created and a
wrong ``user_version`` set to its tables' (``repaired`` says so); a corrupt database, or one
whose tables are not hma's, is moved aside and a fresh one created (``reset_reason`` says why).
Either is logged and noted in the file (``DAMAGE_KEY``) until the pipeline raises
``HMA_STATE_RESET`` for it, so that a command's open is said too. The database and its -wal/-shm
files are 0600. A file that cannot be opened or written (a read-only or immutable folder) is a
``StateError`` to the commands (memory mode: see below).

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
import logging
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from hma.health import schema

log = logging.getLogger("hma")


class StateError(Exception):
    """The state folder itself is unusable (not the database file)."""


FILE_MODE = 0o600
SUFFIXES = ("", "-wal", "-shm")  # SQLite creates -wal/-shm with the database file's mode
MAX_PENDING = 8 << 20  # bytes of queued statements; beyond, the whole memory copy is written back
RETRY_MIN_S, RETRY_MAX_S = 1.0, 60.0
LOCKED_WAIT_S = 0.5
Statement = tuple[str, tuple[Any, ...]]
_KV_SET = (
    "INSERT INTO kv (key, value) VALUES (?, ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
DAMAGE_KEY = "state_damage"  # kv: what was moved aside or repaired, until HMA_STATE_RESET is raised


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
        self.repaired = ""  # what was repaired: a missing table, a wrong user_version (schema)
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
            self._disk = self._open_or_replace()
        except sqlite3.OperationalError as exc:
            # full disk, I/O error, locked, read-only: the file may be fine, never move it aside
            if not memory:
                raise StateError(f"{self.path}: {exc}") from None
            self._conn = self._read_only()
            self._note_damage(self._conn)  # written with the whole copy
            self.write_error, self._resync = f"{type(exc).__name__}: {exc}", True
            self._retry_at = self._clock() + self._retry_s
            return
        self._note_damage(self._disk)
        self._conn = self._disk
        if memory:
            self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self._disk.backup(self._conn)

    def _note_damage(self, conn: sqlite3.Connection) -> None:
        """Log what was moved aside or repaired, and note it under ``DAMAGE_KEY`` in ``conn``
        (the pipeline raises ``HMA_STATE_RESET`` for it); a note that cannot be written is only
        logged."""
        said = "; ".join(
            f"{verb}: {why}"
            for verb, why in (("moved aside", self.reset_reason), ("repaired", self.repaired))
            if why
        )
        if said:
            log.warning("state database %s %s", self.path, said)
            with contextlib.suppress(sqlite3.Error):
                conn.execute(_KV_SET, (DAMAGE_KEY, json.dumps(said)))

    def _open_or_replace(self) -> sqlite3.Connection:
        """The file opened; a corrupt one, or one whose tables are not hma's, moved aside and a
        fresh one opened (``reset_reason`` says why)."""
        try:
            return self._open()
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as exc:
            self.reset_reason = f"{type(exc).__name__}: {exc}"
            self._move_aside()
            return self._open()

    def _read_only(self) -> sqlite3.Connection:
        """A memory copy of what the file holds, read without writing anything (``immutable``:
        no -wal or -shm; what a crash left in the -wal only is not seen), else an empty one."""
        mem = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        try:
            uri = f"file:{urllib.parse.quote(str(self.path))}?immutable=1"
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as src:
                src.execute("PRAGMA quick_check").fetchone()
                src.backup(mem)
            self.repaired = schema.settle(mem)
        except sqlite3.Error:
            mem.close()
            mem = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            schema.migrate(mem, 0)
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
            self.repaired = schema.settle(conn)
        except sqlite3.DatabaseError:
            conn.close()
            raise
        for suffix in SUFFIXES[1:]:
            _private(Path(f"{self.path}{suffix}"))
        return conn

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
            self._disk = self._open_or_replace()
            self._note_damage(self._conn)  # the memory copy: written back whole (``_resync``)
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
            conn.execute(_KV_SET, (key, json.dumps(value)))

    def kv_delete(self, key: str) -> None:
        """Remove ``key`` (absent: nothing)."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM kv WHERE key = ?", (key,))

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
