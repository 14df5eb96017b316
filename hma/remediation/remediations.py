"""The node's remediations: every SQL statement on the state store's ``remediations`` table.

A row is one drain, GPU reset, reboot or replace hma carried out (what makes a repeat
offender), or an ``hma reset`` record (kept when the others are cleared). The table itself is
created and migrated by the store (``hma.health.store``).
"""

from __future__ import annotations

from typing import Any, Mapping

from hma.health.store import Store

# Columns of a ``remediations`` row (``add``, ``rows``).
KEYS = ("ts", "episode", "code", "component", "action", "boot_id", "who", "note")
_EMPTY: dict[str, Any] = {"episode": None}


def add(store: Store, row: Mapping[str, Any]) -> None:
    """Append one remediation (keys of ``KEYS``; absent ones empty)."""
    with store.transaction() as conn:
        conn.execute(
            f"INSERT INTO remediations ({', '.join(KEYS)}) VALUES "  # noqa: S608
            f"({', '.join('?' for _k in KEYS)})",
            tuple(row.get(k, _EMPTY.get(k, "")) for k in KEYS),
        )


def rows(store: Store) -> list[dict[str, Any]]:
    """Every recorded remediation, oldest first."""
    found = store.rows(f"SELECT {', '.join(KEYS)} FROM remediations ORDER BY ts, id")  # noqa: S608
    return [dict(zip(KEYS, r)) for r in found]


def delete(store: Store, **match: Any) -> int:
    """Delete the remediations whose columns equal ``match`` (a column given None matches
    every value; ``hma reset`` records are kept); returns how many went."""
    sql, params = "DELETE FROM remediations WHERE action != 'reset'", []
    for key, value in match.items():
        if key not in KEYS:
            raise ValueError(f"no column {key!r}")
        if value is not None:
            sql += f" AND {key} = ?"
            params.append(value)
    with store.transaction() as conn:
        return int(conn.execute(sql, tuple(params)).rowcount)
