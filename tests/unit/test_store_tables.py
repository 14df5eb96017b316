"""The tables' owners over the state store engine: history, boots and the maintenance row."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest

from hma.contracts.maintenance import Maintenance
from hma.health import history, maintenance_mode, records
from hma.health.store import Store


@pytest.fixture(params=[False, True], ids=["file", "memory"])
def store(tmp_path: Path, request: Any) -> Store:
    """A store on a fresh file, direct or from memory."""
    return Store(str(tmp_path / "state.db"), memory=request.param)


@pytest.mark.parametrize(
    ("stamps", "older_than", "gone", "left"),
    [
        ([], 5.0, 0, []),
        ([1.0, 2.0, 3.0], 0.5, 0, [3.0, 2.0, 1.0]),
        ([1.0, 2.0, 3.0], 2.0, 1, [3.0, 2.0]),
        ([1.0, 2.0, 3.0], 9.0, 3, []),
    ],
)
def test_history_prune(
    store: Store, stamps: list[float], older_than: float, gone: int, left: list[float]
) -> None:
    for ts in stamps:
        history.add(store, ts, "raised", "SYS_X", "node", "warning", "m")
    assert history.prune(store, older_than) == gone
    assert [row["ts"] for row in history.rows(store)] == left


def test_history_rows_newest_first_with_limit(store: Store) -> None:
    for ts in (1.0, 2.0, 3.0):
        history.add(store, ts, "raised")
    assert [row["ts"] for row in history.rows(store, 2)] == [3.0, 2.0]
    assert history.rows(store, 1)[0] == {
        "ts": 3.0,
        "kind": "raised",
        "code": "",
        "component": "",
        "severity": "",
        "message": "",
        "details": "{}",
        "who": "",
    }


@pytest.mark.parametrize(
    ("boots", "new", "count"),
    [
        (["a"], [True], 1),
        (["a", "a"], [True, False], 1),
        (["a", "b", "a"], [True, True, False], 2),
    ],
)
def test_boots(store: Store, boots: list[str], new: list[bool], count: int) -> None:
    assert [records.note_boot(store, b, float(i)) for i, b in enumerate(boots)] == new
    assert records.boot_count(store) == count


@pytest.mark.parametrize(
    ("window", "kind", "message"),
    [
        (Maintenance(10.0, 20.0, "bios", "bob"), "maintenance_on", None),
        (None, "maintenance_off", "maintenance off"),
    ],
)
def test_maintenance_row_and_history(
    store: Store, window: Optional[Maintenance], kind: str, message: Optional[str]
) -> None:
    maintenance_mode.save(store, window, "bob", 10.0)
    assert maintenance_mode.load(store) == window
    [row] = history.rows(store)
    expected = window.describe() if window is not None else message
    assert (row["kind"], row["message"], row["who"]) == (kind, expected, "bob")
    assert (row["code"], row["component"], row["severity"]) == (None, None, None)


def test_unreadable_maintenance_row_is_none(store: Store) -> None:
    with store.transaction() as conn:
        conn.execute("INSERT INTO maintenance (id, data) VALUES (1, 'not json')")
    assert maintenance_mode.load(store) is None
