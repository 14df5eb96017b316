"""The health model's tables in the state store: ``faults`` (its records), ``occurrences`` (the
recent occurrences of counted codes, so that a restart forgets no window) and ``boots`` (the boot
ids seen). The pipeline (hma.health.pipeline) is their one user.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from hma.health.model import Occurrence, Record
from hma.health.store import Store


def load_records(store: Store) -> tuple[list[Record], list[str]]:
    """Stored health records, and a note per row that could not be read (dropped)."""
    records, bad = [], []
    for component, code, data in store.rows("SELECT component, code, data FROM faults"):
        try:
            records.append(Record.from_json(json.loads(data)))
        except (ValueError, KeyError, TypeError) as exc:
            bad.append(f"{component} {code}: {exc}")
    return records, bad


def save_records(
    store: Store, changed: list[tuple[str, str]], present: dict[tuple[str, str], Record]
) -> None:
    """Write the changed keys: upsert those still present, delete the others."""
    with store.transaction() as conn:
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


def load_occurrences(store: Store) -> tuple[dict[tuple[str, str], list[Occurrence]], list[str]]:
    """Stored occurrences by (scope, code), each list distinct and oldest first, and a note per
    row that could not be read (dropped: that count starts again, it never raises a fault)."""
    found: dict[tuple[str, str], list[Occurrence]] = {}
    bad = []
    for scope, code, data in store.rows("SELECT scope, code, data FROM occurrences"):
        items = _occurrences(data) if isinstance(scope, str) and isinstance(code, str) else None
        if items is None:
            bad.append(f"occurrences {scope!r} {code!r}: not a list of [time, component, source]")
        else:
            found[(scope, code)] = items
    return found, bad


def _occurrences(data: Any) -> Optional[list[Occurrence]]:
    """The occurrences a row's ``data`` holds, distinct and oldest first; None unless it is a
    JSON list of [time, component, source] with a finite number of seconds and two strings."""
    try:
        items = json.loads(data)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(items, list):
        return None
    out = set()
    for item in items:
        if not (isinstance(item, list) and len(item) == 3):
            return None
        ts, component, source = item
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            return None
        try:
            seconds = float(ts)
        except OverflowError:
            return None
        if not (math.isfinite(seconds) and isinstance(component, str) and isinstance(source, str)):
            return None
        out.add((seconds, component, source))
    return sorted(out)


def save_occurrences(
    store: Store,
    changed: list[tuple[str, str]],
    present: dict[tuple[str, str], list[Occurrence]],
) -> None:
    """Write the changed (scope, code) keys: upsert those still present, delete the others."""
    with store.transaction() as conn:
        for key in changed:
            items = present.get(key)
            if not items:
                conn.execute("DELETE FROM occurrences WHERE scope = ? AND code = ?", key)
            else:
                conn.execute(
                    "INSERT INTO occurrences (scope, code, data) VALUES (?, ?, ?) "
                    "ON CONFLICT(scope, code) DO UPDATE SET data = excluded.data",
                    (*key, json.dumps([list(o) for o in items])),
                )


def note_boot(store: Store, boot_id: str, now: float) -> bool:
    """Record a boot id; True when it was not known (the node rebooted)."""
    with store.transaction() as conn:
        cur = conn.execute(
            "INSERT OR IGNORE INTO boots (boot_id, first_seen) VALUES (?, ?)", (boot_id, now)
        )
        return bool(cur.rowcount == 1)


def boot_count(store: Store) -> int:
    """How many distinct boots were seen."""
    return int(store.rows("SELECT COUNT(*) FROM boots")[0][0])
