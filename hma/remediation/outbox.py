"""The outbox: remediation's persistent records in the state store.

Every SQL statement on the ``actions`` table lives here: an action is written (once per key)
before it is attempted, applied strictly in order, retried with backoff while it fails, held
and re-tried while a rule holds it, cancelled when the fault goes away (see docs/remediation.md).
The open episode, the reboot counts and whether the node is held for a human are kept in the
store's key-value table, the node's remediations in its ``remediations`` table (SQL in the
module ``remediations``); the planner's pass and the worker's attempts change them from different
threads under the outbox's ``lock``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Optional

from hma.contracts.label import History, PostMortem
from hma.health.store import Store
from hma.remediation import remediations
from hma.remediation.planner import ACTIONS_COUNTED, Enqueue, Episode, Reboot, Remediation

KV_STATE = "remediation"
KV_REBOOTS = "remediation.reboots"
KV_LAST_REBOOT = "remediation.last_reboot"
KV_HUMAN = "remediation.human"
FINAL = ("done", "cancelled", "dry_run", "skipped")
OPEN = ("pending", "attempting", "failed", "held")
_OPEN_SQL = "('pending','attempting','failed','held')"
_SHOWN = (
    "id",
    "key",
    "kind",
    "node",
    "reason",
    "state",
    "attempts",
    "last_error",
    "created",
    "updated",
    "next_try",
)


@dataclass(frozen=True)
class Row:
    """An open action, as the worker applies it."""

    id: int
    key: str
    kind: str
    node: str
    reason: str
    payload: dict[str, Any]
    state: str
    attempts: int
    next_try: float


def backoff(attempts: int, retry_min: float, retry_max: float) -> float:
    """Seconds before the next try after ``attempts`` failed ones (doubling, capped)."""
    return min(retry_min * 2 ** (attempts - 1), retry_max)


class Outbox:
    """The actions table and the episode records of one state store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # Held while the episode or the reboot records are read and changed (reentrant).
        self.lock = threading.RLock()

    # --- the episode and the reboot counts --------------------------------------------------------

    def episode(self) -> Optional[Episode]:
        """The open episode."""
        with self.lock:
            return self.load()[1]

    def load(self) -> tuple[int, Optional[Episode]]:
        """(last episode id, the open episode)."""
        value = self.store.kv_get(KV_STATE, None)
        if not isinstance(value, dict):
            return 0, None
        ep = value.get("episode")
        return int(value.get("seq", 0)), Episode.from_json(ep) if isinstance(ep, dict) else None

    def save(self, conn: Any, seq: int, episode: Optional[Episode]) -> None:
        """Record the episode inside a transaction."""
        _kv_put(conn, KV_STATE, {"seq": seq, "episode": episode.to_json() if episode else None})

    def reboots(self) -> list[Reboot]:
        """Every recorded reboot (the caller applies the window)."""
        value = self.store.kv_get(KV_REBOOTS, [])
        out = []
        for r in value if isinstance(value, list) else []:
            if isinstance(r, dict):
                out.append(
                    Reboot(
                        str(r.get("code")),
                        str(r.get("component")),
                        float(r.get("ts", 0)),
                        r.get("episode"),
                        str(r.get("boot_id") or ""),
                    )
                )
        return out

    def save_reboots(self, rows: list[Reboot], last_reboot: Optional[float] = None) -> None:
        """Replace the reboot records (and note the last reboot's time)."""
        doc = [
            {"code": r.code, "component": r.component, "ts": r.ts}
            | ({"episode": r.episode, "boot_id": r.boot_id} if r.episode is not None else {})
            for r in rows
        ]
        with self.store.transaction() as conn:
            _kv_put(conn, KV_REBOOTS, doc)
            if last_reboot is not None:
                _kv_put(conn, KV_LAST_REBOOT, last_reboot)

    def last_reboot(self) -> float:
        """When hma last had this node rebooted (0: never)."""
        return float(self.store.kv_get(KV_LAST_REBOOT, 0.0) or 0.0)

    # --- the remediations and the hold for a human ------------------------------------------------

    def remediations(self) -> list[Remediation]:
        """The node's recorded remediations, oldest first (``hma reset`` rows left out)."""
        return [
            Remediation(
                float(r["ts"]),
                r["episode"],
                str(r["code"]),
                str(r["component"]),
                str(r["action"]),
                str(r["boot_id"] or ""),
            )
            for r in remediations.rows(self.store)
            if r["action"] in ACTIONS_COUNTED
        ]

    def record(self, ep: Episode, action: str, boot_id: str, now: float) -> bool:
        """Record a remediation of episode ``ep`` (once per episode, action and boot); False
        when it was recorded already."""
        with self.lock:
            for r in self.remediations():
                if (r.episode, r.action, r.boot_id) == (ep.id, action, boot_id):
                    return False
            remediations.add(
                self.store,
                {
                    "ts": now,
                    "episode": ep.id,
                    "code": ep.code,
                    "component": ep.component,
                    "action": action,
                    "boot_id": boot_id,
                    "who": "hma",
                },
            )
            return True

    def crash(self, cause: str, component: str, boot_id: str, now: float) -> bool:
        """Record the previous boot's crash the post-mortem read in boot ``boot_id`` (once per
        boot: the boot that followed it); False when it was recorded already."""
        with self.lock:
            if any(r.action == "crash" and r.boot_id == boot_id for r in self.remediations()):
                return False
            row = {"ts": now, "code": cause, "component": component, "boot_id": boot_id}
            remediations.add(self.store, {**row, "action": "crash", "who": "postmortem"})
            return True

    def postmortem(self, now: float, window: float) -> Optional[PostMortem]:
        """The newest crash within ``window`` (the label field's ``hmap=``), None without one."""
        crashes = [r for r in self.remediations() if r.action == "crash" and now - r.ts <= window]
        return PostMortem(crashes[-1].ts, crashes[-1].code) if crashes else None

    def human(self) -> float:
        """Since when the node is held for a human (a repeat offender); 0: it is not."""
        return float(self.store.kv_get(KV_HUMAN, 0.0) or 0.0)

    def set_human(self, since: float) -> None:
        """Hold the node for a human since ``since`` (0: release it)."""
        self.store.kv_set(KV_HUMAN, since)

    def history(self, now: float, window: float) -> History:
        """The mirror of the remediations within ``window`` (one entry per episode: its first
        time and code) and of the hold (hma.contracts.label)."""
        episodes: dict[Any, list[Remediation]] = {}
        for r in self.remediations():
            if now - r.ts <= window:
                key = r.episode if r.episode is not None else f"t{r.ts}"
                episodes.setdefault(key, []).append(r)
        entries = sorted((rows[0].ts, rows[0].code) for rows in episodes.values())
        return History(tuple(entries), self.human())

    def seed_history(self, mirror: History) -> bool:
        """At start: the remediations the cluster mirrors that this store does not know. After a
        wiped store, every entry and the hold; otherwise the entries dated after the store's
        newest record (another writer's while this agent was away: the controller's watcher).
        Whether anything was taken."""
        with self.lock:
            known = remediations.rows(self.store)  # hma reset's records count here
            if not known and not self.human():
                taken = list(mirror.entries)
                if mirror.held:
                    self.set_human(mirror.held)
            else:
                newest = max((float(r["ts"]) for r in known), default=self.human())
                taken = [(ts, code) for ts, code in mirror.entries if ts > newest]
            first = min((int(r["episode"]) for r in known if r["episode"] is not None), default=0)
            for i, (ts, code) in enumerate(taken):  # episodes hma did not run here: < 0
                episode = min(first, 0) - 1 - i
                row = {"ts": ts, "episode": episode, "code": code, "component": "", "who": "mirror"}
                remediations.add(self.store, {**row, "action": "drain"})
            return bool(taken or (mirror.held and not known))

    # --- the actions table ------------------------------------------------------------------------

    @staticmethod
    def add(conn: Any, node: str, intent: Enqueue, now: float, dry_run: bool) -> bool:
        """Write an action (``dry_run`` rows are final at once); False when its key exists."""
        cur = conn.execute(
            "INSERT OR IGNORE INTO actions (key, kind, node, reason, payload, state, attempts,"
            " last_error, created, updated, next_try) VALUES (?, ?, ?, ?, ?, ?, 0, '', ?, ?, ?)",
            (
                intent.key,
                intent.kind,
                node,
                intent.episode.reason,
                json.dumps(intent.payload()),
                "dry_run" if dry_run else "pending",
                now,
                now,
                now,
            ),
        )
        return bool(cur.rowcount == 1)

    @staticmethod
    def cancel(conn: Any, row_id: int, now: float, why: str) -> None:
        """Cancel an open action; its key is freed so that the step can be decided again."""
        conn.execute(
            "UPDATE actions SET state = 'cancelled', last_error = ?, updated = ?, "
            "key = key || ':x' || id WHERE id = ?",
            (why, now, row_id),
        )

    @staticmethod
    def open_rows(conn: Any, episode_id: int) -> tuple[tuple[int, str], ...]:
        """(id, kind) of the episode's open actions, in order."""
        rows = conn.execute(
            f"SELECT id, kind FROM actions WHERE key LIKE ? AND state IN {_OPEN_SQL} ORDER BY id",  # noqa: S608
            (f"ep{episode_id}:%",),
        ).fetchall()
        return tuple((int(r[0]), str(r[1])) for r in rows)

    def due(self) -> list[Row]:
        """The open actions, in order."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT id, key, kind, node, reason, payload, state, attempts, next_try FROM "
                f"actions WHERE state IN {_OPEN_SQL} ORDER BY id"  # noqa: S608
            ).fetchall()
        return [
            Row(
                int(r[0]),
                str(r[1]),
                str(r[2]),
                str(r[3]),
                str(r[4]),
                json.loads(r[5] or "{}"),
                str(r[6]),
                int(r[7] or 0),
                float(r[8] or 0),
            )
            for r in rows
        ]

    def next_due(self) -> Optional[float]:
        """When the first open action is due (None: none is open)."""
        rows = self.due()
        return rows[0].next_try if rows else None

    def attempting(self, row_id: int, now: float) -> None:
        """An attempt starts."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE actions SET state = 'attempting', attempts = attempts + 1, updated = ? "
                "WHERE id = ?",
                (now, row_id),
            )

    @staticmethod
    def cancelled(conn: Any, row_id: int) -> bool:
        """The action was cancelled meanwhile (its outcome is dropped)."""
        current = conn.execute("SELECT state FROM actions WHERE id = ?", (row_id,)).fetchone()
        return bool(current and current[0] == "cancelled")

    @staticmethod
    def retry(conn: Any, row_id: int, state: str, note: str, now: float, when: float) -> None:
        """``failed`` or ``held``: tried again at ``when``."""
        conn.execute(
            "UPDATE actions SET state = ?, last_error = ?, updated = ?, next_try = ? WHERE id = ?",
            (state, note, now, when, row_id),
        )

    @staticmethod
    def finish(conn: Any, row_id: int, state: str, now: float, note: str = "") -> None:
        """A final outcome (``done``, ``skipped``)."""
        conn.execute(
            "UPDATE actions SET state = ?, last_error = ?, updated = ? WHERE id = ?",
            (state, note, now, row_id),
        )

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` actions, oldest first (status.json ``remediation.actions``)."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"SELECT {', '.join(_SHOWN)} FROM actions ORDER BY id DESC LIMIT ?",  # noqa: S608
                (limit,),
            ).fetchall()
        return [dict(zip(_SHOWN, r)) for r in reversed(rows)]


def _kv_put(conn: Any, key: str, value: Any) -> None:
    conn.execute(
        "INSERT INTO kv (key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, json.dumps(value)),
    )
