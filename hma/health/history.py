"""The ``history`` table of the state store: findings, transitions and what operators did (acks,
resets, maintenance), newest last, bounded by ``[agent] history_days`` (``prune``).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from hma.health.store import Store

COLUMNS = ("ts", "kind", "code", "component", "severity", "message", "details", "who")


def write(
    conn: Any,
    ts: float,
    kind: str,
    code: Optional[str],
    component: Optional[str],
    severity: Optional[str],
    message: str,
    details: Optional[dict[str, Any]],
    who: str,
) -> None:
    """Append one history row inside a transaction of the store (``conn``); a column given None
    stays NULL."""
    conn.execute(
        "INSERT INTO history (ts, kind, code, component, severity, message, details, who)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (ts, kind, code, component, severity, message, json.dumps(details or {}), who),
    )


def add(
    store: Store,
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
    with store.transaction() as conn:
        write(conn, ts, kind, code, component, severity, message, details, who)


def rows(store: Store, limit: int = 100) -> list[dict[str, Any]]:
    """Newest history rows first."""
    found = store.rows(
        f"SELECT {', '.join(COLUMNS)} FROM history ORDER BY id DESC LIMIT ?",  # noqa: S608
        (limit,),
    )
    return [dict(zip(COLUMNS, row)) for row in found]


def prune(store: Store, older_than: float) -> int:
    """Delete history rows before ``older_than``; returns how many."""
    with store.transaction() as conn:
        return int(conn.execute("DELETE FROM history WHERE ts < ?", (older_than,)).rowcount)
