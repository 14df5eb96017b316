"""State store: persistence, corrupt-database recovery, migration from the previous schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hma.catalogue import load_builtin
from hma.health import HealthModel
from hma.model import Finding
from hma.state import MIGRATIONS, SCHEMA_VERSION, Store


def test_records_survive_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    store = Store(path)
    model = HealthModel(load_builtin(), "b1")
    model.observe_event(Finding("SYS_MEM_ECC_UE", "node:edac/mc0", "ue", probe="system"), 1.0)
    store.save_records(sorted(model.changed), {(r.component, r.code): r for r in model.records()})
    store.kv_set("counter", {"reboots": 2})
    store.close()
    again = Store(path)
    records, bad = again.load_records()
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
    records, bad = store.load_records()
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
    [row] = store.history()
    assert row["kind"] == "raised" and row["who"] == ""
    rid = store.add_request("ack", {"code": "X"}, "alice", 2.0)
    assert [r["id"] for r in store.take_requests(3.0)] == [rid]
    assert store.take_requests(4.0) == []
    with store.transaction() as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
