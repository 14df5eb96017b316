"""State store: persistence, corrupt-database recovery, migration from the previous schema."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Finding
from hma.health import history, requests
from hma.health import store as state
from hma.health.model import HealthModel
from hma.health.records import load_records, save_records
from hma.health.schema import MIGRATIONS, SCHEMA_VERSION
from hma.health.store import Store


def test_records_survive_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    store = Store(path)
    model = HealthModel(load_builtin(), "b1")
    model.observe_event(Finding("SYS_MEM_ECC_UE", "node:edac/mc0", "ue", probe="system"), 1.0)
    save_records(store, sorted(model.changed), {(r.component, r.code): r for r in model.records()})
    store.kv_set("counter", {"reboots": 2})
    store.close()
    again = Store(path)
    records, bad = load_records(again)
    assert bad == [] and [(r.code, r.active) for r in records] == [("SYS_MEM_ECC_UE", True)]
    assert again.kv_get("counter") == {"reboots": 2} and again.reset_reason == ""


def test_corrupt_database_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not sqlite" * 100)
    store = Store(str(path))
    assert "DatabaseError" in store.reset_reason
    aside = list(tmp_path.glob("state.db.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not sqlite")
    store.kv_set("k", 1)
    assert store.kv_get("k") == 1


def test_unreadable_row_is_dropped_not_fatal(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "s.db"))
    with store.transaction() as conn:
        conn.execute("INSERT INTO faults VALUES ('node', 'SYS_X', '{not json')")
    records, bad = load_records(store)
    assert records == [] and len(bad) == 1 and "SYS_X" in bad[0]


def test_newer_schema_is_reset(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    assert "newer" in Store(str(path)).reset_reason


def test_migration_from_previous_version_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0].split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO kv VALUES ('keep', '42')")
    conn.execute("INSERT INTO history (ts, kind) VALUES (1.0, 'raised')")
    conn.close()
    store = Store(str(path))
    assert store.reset_reason == ""
    assert store.kv_get("keep") == 42
    [row] = history.rows(store)
    assert row["kind"] == "raised" and row["who"] == ""
    rid = requests.add(store, "ack", {"code": "X"}, "alice", 2.0)
    inbox = requests.Inbox(store)
    assert [r["id"] for r in inbox.take(3.0)] == [rid]
    assert inbox.take(4.0) == []
    with store.transaction() as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_database_and_its_wal_and_shm_are_0600(tmp_path: Path) -> None:
    path = tmp_path / "state" / "state.db"
    store = Store(str(path))
    store.kv_set("k", 1)  # the write creates the -wal and -shm files
    files = [Path(f"{path}{s}") for s in ("", "-wal", "-shm")]
    assert all(f.exists() for f in files)
    assert [_mode(f) for f in files] == [0o600] * 3
    assert _mode(path.parent) == 0o700
    store.close()


def test_existing_world_readable_files_are_made_0600(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Store(str(path)).close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").touch()
        os.chmod(f"{path}{suffix}", 0o644)
    store = Store(str(path))
    assert [_mode(Path(f"{path}{s}")) for s in ("", "-wal", "-shm")] == [0o600] * 3
    store.close()


def test_moved_aside_database_is_0600_and_the_new_one_too(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not sqlite" * 100)
    os.chmod(path, 0o644)
    Store(str(path)).close()
    (aside,) = tmp_path.glob("state.db.corrupt-*")
    assert _mode(aside) == 0o600 and _mode(path) == 0o600


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fill(store: Store) -> None:
    """Make the file unable to grow: SQLite then fails writes with 'database or disk is full'."""
    pages = store._disk.execute("PRAGMA page_count").fetchone()[0]
    store._disk.execute(f"PRAGMA max_page_count = {pages}")


def _free(store: Store) -> None:
    store._disk.execute("PRAGMA max_page_count = 1073741823")


def test_memory_store_keeps_working_when_the_file_is_full_and_catches_up(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    clock = Clock()
    store = Store(path, memory=True, clock=clock)
    store.kv_set("before", 1)
    assert store.write_error == ""
    _fill(store)
    big = "x" * 20000  # needs new pages
    store.kv_set("during", big)
    history.add(store, 1.0, "raised", "GPU_XID_79", "gpu:0000:01:00", "critical", "m")
    assert "full" in store.write_error
    assert store.kv_get("during") == big and history.rows(store, 1)[0]["code"] == "GPU_XID_79"
    _free(store)
    assert store.flush() is False  # the retry is not due yet (backoff 1 s)
    clock.now += 1.0
    assert store.flush() is True and store.write_error == ""
    store._disk.close()  # the file alone, as the next start sees it
    again = Store(path)
    assert again.kv_get("before") == 1 and again.kv_get("during") == big
    assert history.rows(again, 1)[0]["code"] == "GPU_XID_79"


def test_retries_back_off_doubling_up_to_a_minute(tmp_path: Path) -> None:
    clock = Clock()
    store = Store(str(tmp_path / "state.db"), memory=True, clock=clock)
    _fill(store)
    store.kv_set("k", "x" * 20000)  # first failure: next try in 1 s
    waits = [store._retry_at - clock.now]
    for _ in range(8):
        clock.now = store._retry_at - 0.01
        assert store.flush() is False and store._retry_at > clock.now  # not due: not tried
        clock.now = store._retry_at
        previous = clock.now
        assert store.flush() is False
        waits.append(store._retry_at - previous)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert "full" in store.write_error


def test_queue_overflow_writes_the_whole_copy_back_keeping_other_writers_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "MAX_PENDING", 20000)
    path = str(tmp_path / "state.db")
    clock = Clock()
    store = Store(path, memory=True, clock=clock)
    _fill(store)
    for i in range(10):
        store.kv_set(f"k{i}", "y" * 5000)
    assert store._resync and store._pending == []
    _free(store)
    other = Store(path)  # `hma ack` in another process
    requests.add(other, "ack", {"code": "HMA_STATE_RESET"}, "root", 5.0)
    other.close()
    clock.now += 10
    assert store.flush() is True
    store._disk.close()
    again = Store(path)
    assert [again.kv_get(f"k{i}") for i in range(10)] == ["y" * 5000] * 10
    assert [r["kind"] for r in requests.Inbox(again).take(6.0)] == ["ack"]


def test_requests_are_read_from_the_file_and_taken_once(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    store = Store(path, memory=True)
    other = Store(path)
    inbox = requests.Inbox(store)
    requests.add(other, "ack", {"code": "X"}, "root", 1.0)
    assert [r["payload"] for r in inbox.take(2.0)] == [{"code": "X"}]
    requests.add(other, "ack", {"code": "Y"}, "root", 3.0)
    _fill(store)
    _fill(other)
    assert [r["payload"] for r in inbox.take(4.0)] == [{"code": "Y"}]
    assert inbox.take(5.0) == []  # not marked done in the file, still taken once
    other.close()
    store.close()
