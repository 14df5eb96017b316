"""The ``maintenance`` table of the state store: at most one row, the node's window of ``hma
maintenance`` (hma.contracts.maintenance), and a history row for each change of it.
"""

from __future__ import annotations

import json
from typing import Optional

from hma.contracts.maintenance import Maintenance
from hma.health import history
from hma.health.store import Store


def load(store: Store) -> Optional[Maintenance]:
    """The node's maintenance window (open or ended), or None; an unreadable row is None."""
    found = store.rows("SELECT data FROM maintenance WHERE id = 1")
    try:
        return Maintenance.from_json(json.loads(found[0][0])) if found else None
    except (ValueError, TypeError, AttributeError):
        return None


def save(store: Store, window: Optional[Maintenance], who: str, now: float) -> None:
    """Store the window (None: maintenance off), with a history row saying who did it."""
    with store.transaction() as conn:
        conn.execute("DELETE FROM maintenance")
        if window is not None:
            conn.execute(
                "INSERT INTO maintenance (id, data) VALUES (1, ?)",
                (json.dumps(window.to_json()),),
            )
        history.write(
            conn,
            now,
            "maintenance_on" if window is not None else "maintenance_off",
            None,
            None,
            None,
            window.describe() if window is not None else "maintenance off",
            window.to_json() if window is not None else {},
            who,
        )
