"""The remediation engine: verdicts in, Slurm actions out, through a persistent outbox.

``update()`` (called by the daemon after every change) only decides and writes the decision to
the ``actions`` table (the outbox), which takes milliseconds. A worker thread applies due actions
in order, re-reading the node's state before each one, and retries failures with backoff (a
failing scontrol takes about 9 s while slurmctld is unreachable). A second thread refreshes the
node facts (state, jobs) that probes and decisions use. See docs/remediation.md.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Optional

from hma.adapters.command import CommandRunner
from hma.config import ConfigError
from hma.model import Action, Clears, Fault, Severity, Verdict
from hma.probe import NodeFacts
from hma.remediation import breaker
from hma.remediation import label as label_mod
from hma.remediation import options as options_mod
from hma.remediation.label import Label
from hma.remediation.requeue import AutoResume
from hma.remediation.slurm import (
    HYPERPOD_REBOOT,
    HYPERPOD_REPLACE,
    OWNED_PREFIX,
    NodeState,
    SlurmClient,
    SlurmError,
)
from hma.reporters import Alert

log = logging.getLogger("hma.remediation")

KV_STATE = "remediation"
KV_REBOOTS = "remediation.reboots"
FINAL = ("done", "cancelled", "dry_run", "skipped")
OPEN = ("pending", "attempting", "failed", "held")
BREAKER_CODE = "HMA_BREAKER_OPEN"
MAX_ROWS_SHOWN = 20


def reason_for(fault: Fault) -> str:
    """The drain reason hma sets: ``HMA: <CODE> <component>``."""
    return f"{OWNED_PREFIX} {fault.code} {fault.component}"


class Remediator:
    """Turns verdicts into labels, drains and recovery actions for this node (see module doc)."""

    def __init__(
        self,
        setup: Any,
        store: Any,
        clock: Callable[[], float] = time.time,
        client: Optional[SlurmClient] = None,
        start: bool = True,
        node_name: Optional[str] = None,
    ) -> None:
        self.setup = setup
        self.store = store
        self.clock = clock
        self.rec = dict(setup.config.section("recovery"))
        self.sl = dict(setup.config.section("slurm"))
        errors = options_mod.problems(self.rec)
        if errors:
            raise ConfigError(errors)
        self.field = str(self.rec["label_field"])
        self.client = client or SlurmClient(
            scontrol=list(self.sl["scontrol"]),
            sinfo=list(self.sl["sinfo"]),
            squeue=list(self.sl["squeue"]),
            conf=self.sl["conf"],
            timeout=float(self.sl["timeout"]),
            path=str(self.sl["path"] or ""),
            spool_dir=self.sl["spool_dir"],
        )
        self.enabled = bool(self.sl["enabled"]) and self._scontrol_found()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._reread = threading.Event()  # an action was applied: read the node's state again
        self._stop = threading.Event()
        self._alerts: list[Alert] = []
        self.on_alert: Callable[[], None] = lambda: None  # told when ``alerts`` has more
        self._verdict: Optional[Verdict] = None
        self._boot_id = ""
        self._boot_since = 0.0  # when this engine first heard of the current boot id
        self._node_name: Optional[str] = node_name or options_mod.node_name_of(self.sl)
        self._node: Optional[NodeState] = None
        self._jobs: tuple[tuple[str, str], ...] = ()
        self._facts_ok = False
        self._facts_error = ""
        self._breaker: Optional[breaker.Count] = None
        self._breaker_alerted = False
        self._last_recheck = 0.0
        self._recheck_every = float(self.rec["recheck_interval"])
        self._stale_checked = False
        self._threads: list[threading.Thread] = []
        self._seed_reboots_done = False
        self._autoresume = AutoResume(clock)  # hma srun --auto-resume jobs (autoresume.py)
        if start and self.enabled:
            for target, name in ((self._facts_loop, "facts"), (self._worker_loop, "outbox")):
                thread = threading.Thread(target=target, name=f"remediation-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _scontrol_found(self) -> bool:
        tool = str(self.sl["scontrol"][0])
        return (
            os.path.isabs(tool)
            and os.access(tool, os.X_OK)
            or bool(shutil.which(tool, path=str(self.sl["path"] or os.environ.get("PATH", ""))))
        )

    # --- the daemon's interface -----------------------------------------------------------------

    def facts(self) -> NodeFacts:
        """Cached node facts (never waits on Slurm)."""
        with self._lock:
            node = self._node
            return NodeFacts(
                node_name=self._node_name or "",
                job_running=(bool(self._jobs) if self._facts_ok else None),
                job_ids=tuple(j for j, _u in self._jobs),
                slurm_configured=self.enabled,
                job_users=tuple(sorted({u for _j, u in self._jobs})),
                slurm_state=node.label_text if node is not None and self._facts_ok else "",
                slurm_reason=node.reason if node is not None and self._facts_ok else "",
            )

    def update(self, verdict: Verdict, boot_id: str) -> None:
        """Decide on the latest verdict; decisions go to the outbox. Returns at once."""
        with self._lock:
            self._verdict = verdict
            if boot_id != self._boot_id:
                self._boot_since = self.clock()
            self._boot_id = boot_id
            if self.enabled:
                self._plan(self.clock())
        self._wake.set()

    def status(self) -> dict[str, Any]:
        """The ``remediation`` object of status.json (docs/status.md, docs/remediation.md)."""
        with self._lock:
            state = self._state()
            ep = state.get("episode")
            node = self._node
            doc: dict[str, Any] = {
                "policy": self.rec["policy"],
                "dry_run": bool(self.rec["dry_run"]),
                "enabled": self.enabled,
                "node": self._node_name,
                "state": node.label_text if node is not None else "unknown",
                "slurm": {
                    "reachable": self._facts_ok,
                    "error": self._facts_error,
                    "state": node.label_text if node is not None else None,
                    "reason": node.reason if node is not None else None,
                    "owned": node.owned if node is not None else None,
                },
                "held": None,
                "jobs": list(ep["jobs"]) if ep else [j for j, _u in self._jobs],
                "episode": ep,
                "breaker": self._breaker.to_json() if self._breaker is not None else None,
                "reboots": self._reboot_counts(),
                "actions": self._rows(MAX_ROWS_SHOWN),
            }
        doc["pending"] = sum(1 for r in doc["actions"] if r["state"] in OPEN)
        held = [r for r in doc["actions"] if r["state"] == "held"]
        doc["held"] = held[0]["last_error"] if held else None
        return doc

    def alerts(self) -> list[Alert]:
        """Alerts since the last call (action_requested/applied/held/failed)."""
        with self._lock:
            out, self._alerts = self._alerts, []
        return out

    def close(self) -> None:
        """Stop the threads (an action in flight finishes in the background)."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(1.0)

    # --- synchronous use (hma healthcheck, tests) -----------------------------------------------

    def refresh(self) -> None:
        """Refresh node name, state and jobs now (blocking)."""
        self._refresh_facts()

    def flush(self, timeout: float = 30.0) -> None:
        """Plan and apply until nothing is due (blocking; for one-shot commands)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.enabled:
                    self._plan(self.clock())
            if not self._process_due():
                return

    # --- persistent state -----------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        value = self.store.kv_get(KV_STATE, None)
        return value if isinstance(value, dict) else {"seq": 0, "episode": None}

    def _save_state(self, conn: Any, state: dict[str, Any]) -> None:
        _kv_put(conn, KV_STATE, state)

    def _reboots(self) -> list[dict[str, Any]]:
        value = self.store.kv_get(KV_REBOOTS, [])
        return value if isinstance(value, list) else []

    def _reboot_count(self, code: str, component: str, now: float) -> int:
        window = float(self.rec["reboot_window"])
        return sum(
            1
            for r in self._reboots()
            if r.get("code") == code
            and r.get("component") == component
            and now - float(r.get("ts", 0)) <= window
        )

    def _reboot_counts(self) -> dict[str, int]:
        now = self.clock()
        out: dict[str, int] = {}
        for r in self._reboots():
            if now - float(r.get("ts", 0)) <= float(self.rec["reboot_window"]):
                key = f"{r.get('code')} {r.get('component')}"
                out[key] = out.get(key, 0) + 1
        return out

    def _seed_reboots(self, node: NodeState) -> None:
        """After a wiped disk: take reboot counts from the label Slurm still holds."""
        if self._seed_reboots_done:
            return
        self._seed_reboots_done = True
        found = label_mod.find(node.field(self.field))
        if found is None or not found.reboots or self._reboots():
            return
        ts = found.since or self.clock()
        if self.clock() - ts > float(self.rec["reboot_window"]):
            return
        rows = [{"code": found.code, "component": found.component, "ts": ts}] * found.reboots
        self.store.kv_set(KV_REBOOTS, rows)
        log.info("seeded %d reboot(s) of %s from the node label", found.reboots, found.code)

    # --- deciding -------------------------------------------------------------------------------

    def _effective(self, fault: Fault, now: float) -> Action:
        if fault.action is Action.REBOOT and self._reboot_count(
            fault.code, fault.component, now
        ) >= int(self.rec["max_reboots"]):
            return Action.REPLACE
        return fault.action

    def _primary(self, now: float) -> tuple[Optional[Fault], Action]:
        faults = self._verdict.draining if self._verdict is not None else ()
        if not self.rec["adopt_slurm_drains"]:  # Slurm's own drains: reported, never acted on
            faults = tuple(f for f in faults if not f.code.startswith("SLURM_"))
        if not faults:
            return None, Action.NONE
        ranked = sorted(
            faults, key=lambda f: (-int(self._effective(f, now)), f.first_seen, f.code, f.component)
        )
        return ranked[0], self._effective(ranked[0], now)

    def _plan(self, now: float) -> None:
        """Bring the outbox in line with the verdict (under the lock)."""
        if self._node_name is None or self._verdict is None:
            return  # decided once Slurm told us who we are and the daemon gave a verdict
        state = self._state()
        ep = state.get("episode")
        if ep is not None and self._node is not None and self._facts_ok:
            self._stale_checked = True  # an episode at start: nothing in Slurm to take up later
        fault, action = self._primary(now)
        hit = ep["jobs"] if ep is not None else [j for j, _u in self._jobs]
        action = self._autoresume.action_for(action, hit)  # auto-resume job: replace, not reboot
        automatic = self.rec["policy"] == "automatic"
        dry = bool(self.rec["dry_run"])
        with self.store.transaction() as conn:
            if fault is not None:
                if ep is None:
                    state["seq"] = int(state.get("seq", 0)) + 1
                    ep = {
                        "id": state["seq"],
                        "code": fault.code,
                        "component": fault.component,
                        "severity": str(fault.severity),
                        "message": fault.message,
                        "action": str(action),
                        "since": fault.first_seen or now,
                        "jobs": [j for j, _u in self._jobs],
                        "users": sorted({u for _j, u in self._jobs}),
                        "boot_id": self._boot_id,
                        "reason": reason_for(fault),
                        "phase": "open",
                        "owned": None,
                        "drained_at": None,
                        "acted": None,
                        "down_at": None,
                        "healthy_since": None,
                    }
                    state["episode"] = ep
                    kind = "drain" if automatic else "label"
                    self._enqueue(conn, ep, kind, f"ep{ep['id']}:{kind}", now)
                else:
                    if ep["phase"] == "resuming":
                        self._cancel(conn, ep, "resume", now, "the fault came back")
                        ep["phase"] = "open"
                    ep["healthy_since"] = None
                    node = self._node
                    released = ep.get("owned") is False and node is not None
                    if automatic and released and not node.out_of_service:  # type: ignore[union-attr]
                        ep["owned"] = None  # whoever held it let go: drain it now
                        self._enqueue(conn, ep, "drain", f"ep{ep['id']}:drain:{int(now)}", now)
                    elif automatic and ep.get("owned") is None and not self._open_rows(conn, ep):
                        self._enqueue(conn, ep, "drain", f"ep{ep['id']}:drain:{int(now)}", now)
                    if str(action) != ep["action"]:
                        old = ep["action"]
                        ep["action"] = str(action)
                        if Action.parse(old) < action:
                            ep["code"], ep["component"] = fault.code, fault.component
                            ep["severity"], ep["message"] = str(fault.severity), fault.message
                        self._enqueue(conn, ep, "label", f"ep{ep['id']}:label:{action}", now)
                if automatic:
                    self._progress(conn, ep, action, now, fault)
            else:
                ep = ep or self._stale_episode(state, now)
            if fault is None and ep is not None and ep["phase"] == "open":
                if ep["healthy_since"] is None:
                    ep["healthy_since"] = now
                never_drained = not ep.get("owned")
                healthy_for = now - float(ep["healthy_since"] or now)
                if never_drained or healthy_for >= float(self.rec["resume_after"]):
                    ep["phase"] = "resuming"
                    for row in self._open_rows(conn, ep):
                        self._cancel_row(conn, row["id"], now, "the fault cleared")
                    self._enqueue(conn, ep, "resume", f"ep{ep['id']}:resume", now)
                    if dry:
                        state["episode"] = None
            self._save_state(conn, state)

    def _stale_episode(self, state: dict[str, Any], now: float) -> Optional[dict[str, Any]]:
        """A healthy node that Slurm shows labelled or drained by hma, with no episode in the
        state store (a wiped disk, a replaced instance): take it up again, so that the drain is
        resumed after ``resume_after`` and the label cleared, by the usual rules."""
        node = self._node
        if node is None or not self._facts_ok or self._stale_checked:
            return None
        self._stale_checked = True  # once, at start: later labels are this instance's own
        found = label_mod.find(node.field(self.field))
        owned = node.owned and node.out_of_service
        if not owned and (found is None or found.state != "unhealthy"):
            return None
        code, component = (found.code, found.component) if found else ("", "")
        if owned:
            text = node.reason[len(OWNED_PREFIX) :].split(" : ", 1)[0].strip()
            code, _, component = text.partition(" ")
        state["seq"] = int(state.get("seq", 0)) + 1
        ep = {
            "id": state["seq"],
            "code": code or "?",
            "component": component or "node",
            "severity": "critical",
            "message": "found in Slurm without a record in the state store",
            "action": found.action if found else "none",
            "since": (found.since if found and found.since else node.reason_time) or now,
            "jobs": list(found.jobs) if found else [],
            "users": [],
            "boot_id": self._boot_id,
            "reason": node.reason.split(" : ", 1)[0] if owned else f"{OWNED_PREFIX} {code}",
            "phase": "open",
            "owned": owned or None,
            "drained_at": node.reason_time if owned else None,
            "acted": None,
            "down_at": None,
            "healthy_since": None,
            "stale": True,
        }
        state["episode"] = ep
        log.info("taking up hma's %s on %s from Slurm", "drain" if owned else "label", node.name)
        return ep

    def _progress(
        self, conn: Any, ep: dict[str, Any], action: Action, now: float, fault: Fault
    ) -> None:
        """Next recovery step of an open episode whose drain hma owns (``fault``: its primary)."""
        if not ep.get("owned") or ep["phase"] != "open":
            return
        node = self._node
        acted = ep.get("acted")
        if acted and acted.get("boot_id") == self._boot_id:
            return  # acted in this boot; wait for the reboot (or a human, for replace)
        if acted and fault.clears is Clears.OBSERVATION and fault.last_seen < self._boot_since:
            return  # carried over the reboot, not seen on this boot: wait for its probe to look
        if acted and acted.get("kind") == "replace":
            return
        if self.rec["dry_run"]:
            idle = node is None or not node.busy  # as if the drain had happened
        else:
            idle = bool(ep.get("down_at")) or (node is not None and node.drained)
        if not idle and node is not None and node.draining:
            if now - float(ep.get("drained_at") or now) >= float(self.rec["drain_timeout"]):
                self._enqueue(conn, ep, "down", f"ep{ep['id']}:down", now)
            return
        if not idle:
            return
        if action is Action.REBOOT:
            self._enqueue(conn, ep, "reboot", f"ep{ep['id']}:reboot:{self._boot_id}", now)
        elif action is Action.REPLACE:
            self._enqueue(conn, ep, "replace", f"ep{ep['id']}:replace", now)

    def _enqueue(self, conn: Any, ep: dict[str, Any], kind: str, key: str, now: float) -> None:
        dry = bool(self.rec["dry_run"])
        payload = {
            "episode": ep["id"],
            "code": ep["code"],
            "component": ep["component"],
            "action": ep["action"],
            "boot_id": self._boot_id,
            "jobs": ep["jobs"],
        }
        cur = conn.execute(
            "INSERT OR IGNORE INTO actions (key, kind, node, reason, payload, state, attempts,"
            " last_error, created, updated, next_try) VALUES (?, ?, ?, ?, ?, ?, 0, '', ?, ?, ?)",
            (
                key,
                kind,
                self._node_name,
                ep["reason"],
                json.dumps(payload),
                "dry_run" if dry else "pending",
                now,
                now,
                now,
            ),
        )
        if cur.rowcount != 1:
            return
        if dry:  # simulate, so that the next steps are decided (and shown) too
            if kind == "drain":
                ep["owned"], ep["drained_at"] = True, now
            elif kind in ("reboot", "replace"):
                ep["acted"] = {"kind": kind, "boot_id": self._boot_id, "at": now}
        what = _describe(kind, ep, self._node_name or "", self.rec)
        if dry:
            self._alert("action_held", ep, f"dry run: would {what}", kind, {"held": "dry_run"})
        elif kind == "label" and self.rec["policy"] == "none":
            self._alert("action_held", ep, f"policy none: {what} only", kind, {"held": "policy"})
        else:
            self._alert("action_requested", ep, what, kind, {})

    def _cancel(self, conn: Any, ep: dict[str, Any], kind: str, now: float, why: str) -> None:
        for row in self._open_rows(conn, ep):
            if row["kind"] == kind:
                self._cancel_row(conn, row["id"], now, why)

    @staticmethod
    def _cancel_row(conn: Any, row_id: int, now: float, why: str) -> None:
        """Cancel an open action; its key is freed so that the step can be decided again."""
        conn.execute(
            "UPDATE actions SET state = 'cancelled', last_error = ?, updated = ?, "
            "key = key || ':x' || id WHERE id = ?",
            (why, now, row_id),
        )

    def _open_rows(self, conn: Any, ep: dict[str, Any]) -> list[dict[str, Any]]:
        rows = conn.execute(
            "SELECT id, kind, state FROM actions WHERE key LIKE ? AND state IN "
            "('pending','attempting','failed','held') ORDER BY id",
            (f"ep{ep['id']}:%",),
        ).fetchall()
        return [{"id": r[0], "kind": r[1], "state": r[2]} for r in rows]

    @staticmethod
    def _set(conn: Any, row_id: int, state: str, now: float, error: str = "") -> None:
        conn.execute(
            "UPDATE actions SET state = ?, last_error = ?, updated = ? WHERE id = ?",
            (state, error, now, row_id),
        )

    # --- alerts ---------------------------------------------------------------------------------

    def _alert(
        self, kind: str, ep: dict[str, Any], message: str, action_kind: str, extra: dict[str, Any]
    ) -> None:
        severity = Severity.parse(ep.get("severity") or "critical")
        details = {
            "node": self._node_name,
            "action_kind": action_kind,
            "reason": ep.get("reason"),
            "jobs": list(ep.get("jobs") or []),
            "users": list(ep.get("users") or []),
            "episode": ep.get("id"),
            **extra,
        }
        jobs = f" (jobs {','.join(ep['jobs'])})" if ep.get("jobs") else ""
        self._alerts.append(
            Alert(
                kind,
                str(ep.get("code")),
                str(ep.get("component")),
                severity,
                message + jobs,
                Action.parse(str(ep.get("action") or "none")),
                "remediation",
                details,
                self.clock(),
            )
        )
        self.on_alert()
        log.info("%s: %s%s", kind, message, jobs)

    def _breaker_alert(self, ep: dict[str, Any], count: breaker.Count, what: str) -> None:
        if self._breaker_alerted:
            return
        self._breaker_alerted = True
        msg = (
            f"circuit breaker open: {len(count.held)} of {count.total} nodes in "
            f"{','.join(count.partitions) or 'the cluster'} held by hma (limit {count.limit}); "
            f"{what} held"
        )
        self._alerts.append(
            Alert(
                "action_held",
                BREAKER_CODE,
                "node",
                Severity.CRITICAL,
                msg,
                Action.NONE,
                "remediation",
                {"held": "breaker", "fault": ep.get("code"), **count.to_json()},
                self.clock(),
            )
        )
        self.on_alert()
        log.warning(msg)

    # --- the worker -----------------------------------------------------------------------------

    def _worker_loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._plan(self.clock())
                self._process_due()
                self._recheck_breaker()
                with self._lock:
                    self._plan(self.clock())
            except Exception:  # noqa: BLE001 - the worker never dies
                log.exception("remediation worker error")
            wait = float(self.rec["recheck_interval"])
            nxt = self._next_due()
            if nxt is not None:
                wait = max(0.0, min(wait, nxt - self.clock()))
            self._wake.wait(wait)
            self._wake.clear()

    def _recheck_breaker(self) -> None:
        """Every cycle while hma holds a drain it has not acted on yet: if the node turns out to
        be beyond the limit (drains that raced past the recount), undo it; the drain is decided
        again and held by the breaker."""
        now = self.clock()
        if now - self._last_recheck < self._recheck_every or self.rec["dry_run"]:
            return
        self._last_recheck = now
        with self._lock:
            ep = self._state().get("episode")
            name = self._node_name
        if not ep or ep["phase"] != "open" or not ep.get("owned") or ep.get("acted") or not name:
            self._recheck_every = float(self.rec["recheck_interval"])
            return
        if self._due_rows():
            return  # the outbox is busy with this episode; its rows do their own counting
        # a race shows soon after the drain: check often at first, then less (up to heartbeat)
        self._recheck_every = min(2 * self._recheck_every, float(self.sl["heartbeat"]))
        try:
            count = self._count(self.client.node(name))
            if count.beyond(name):
                self._undo(name, count)
        except SlurmError as exc:
            log.info("breaker recheck skipped: %s", exc)

    def _due_rows(self) -> list[dict[str, Any]]:
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT id, key, kind, node, reason, payload, state, attempts, next_try FROM "
                "actions WHERE state IN ('pending','attempting','failed','held') ORDER BY id"
            ).fetchall()
        keys = ("id", "key", "kind", "node", "reason", "payload", "state", "attempts", "next_try")
        return [dict(zip(keys, r)) for r in rows]

    def _next_due(self) -> Optional[float]:
        rows = self._due_rows()
        return float(rows[0]["next_try"] or 0) if rows else None

    def _process_due(self) -> bool:
        """Apply due actions in order; returns whether any was attempted."""
        did = False
        while not self._stop.is_set():
            rows = self._due_rows()
            if not rows:
                return did
            row = rows[0]  # strictly in order: a later action never overtakes an earlier one
            now = self.clock()
            if float(row["next_try"] or 0) > now:
                return did
            did = True
            self._attempt(row)
        return did

    def _attempt(self, row: dict[str, Any]) -> None:
        now = self.clock()
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE actions SET state = 'attempting', attempts = attempts + 1, updated = ? "
                "WHERE id = ?",
                (now, row["id"]),
            )
        payload = json.loads(row["payload"] or "{}")
        try:
            outcome, note = self._apply(row, payload)
        except SlurmError as exc:
            outcome, note = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - one bad action must not stop the worker
            log.exception("action %s failed", row["key"])
            outcome, note = "failed", f"{type(exc).__name__}: {exc}"
        now = self.clock()
        attempts = int(row["attempts"] or 0) + 1
        with self._lock:
            state = self._state()
            ep = state.get("episode") or {
                "id": payload.get("episode"),
                "code": payload.get("code"),
                "component": payload.get("component"),
                "action": payload.get("action"),
                "reason": row["reason"],
                "jobs": payload.get("jobs", []),
            }
            with self.store.transaction() as conn:
                current = conn.execute(
                    "SELECT state FROM actions WHERE id = ?", (row["id"],)
                ).fetchone()
                if current and current[0] == "cancelled":
                    return
                if outcome == "failed":
                    delay = min(
                        float(self.rec["retry_min"]) * 2 ** (attempts - 1),
                        float(self.rec["retry_max"]),
                    )
                    conn.execute(
                        "UPDATE actions SET state = 'failed', last_error = ?, updated = ?, "
                        "next_try = ? WHERE id = ?",
                        (note, now, now + delay, row["id"]),
                    )
                    self._alert(
                        "action_failed",
                        ep,
                        f"{row['kind']} of {row['node']} failed (attempt {attempts}, retry in "
                        f"{delay:.0f} s): {note}",
                        row["kind"],
                        {"error": note, "attempts": attempts, "action_id": row["id"]},
                    )
                elif outcome == "held":
                    conn.execute(
                        "UPDATE actions SET state = 'held', last_error = ?, updated = ?, "
                        "next_try = ? WHERE id = ?",
                        (note, now, now + float(self.rec["recheck_interval"]), row["id"]),
                    )
                    if row["state"] != "held":
                        self._alert(
                            "action_held",
                            ep,
                            f"{row['kind']} of {row['node']} held: {note}",
                            row["kind"],
                            {"held": note.split(":")[0], "action_id": row["id"]},
                        )
                else:
                    self._set(conn, row["id"], outcome, now, note)
                    if outcome == "done":
                        self._reread.set()  # the node's state changed: status shows it soon
                        self._alert(
                            "action_applied",
                            ep,
                            f"{_describe(row['kind'], ep, row['node'], self.rec)}: done"
                            + (f" ({note})" if note else ""),
                            row["kind"],
                            {"action_id": row["id"], "note": note},
                        )

            if outcome != "held":
                self._breaker_alerted = False

    # --- applying one action --------------------------------------------------------------------

    def _apply(self, row: dict[str, Any], payload: dict[str, Any]) -> tuple[str, str]:
        """Carry out one action; returns (outcome, note). Raises SlurmError to retry."""
        node_name = row["node"]
        kind = row["kind"]
        node = self.client.node(node_name)
        with self._lock:
            self._node = node
            self._seed_reboots(node)
        if not node.understood:
            return "held", (
                f"unknown: Slurm state {node.base}+{'+'.join(sorted(node.flags))} not "
                "understood; doing nothing"
            )
        if kind == "label":
            self._write_label(node, held="policy" if self.rec["policy"] == "none" else "")
            return "done", ""
        if kind == "resume":
            return self._resume(node)
        if kind == "drain":
            return self._drain(node, row)
        if kind == "down":
            if not node.owned:
                return "skipped", f"not owned: reason is {node.reason!r}"
            self.client.update(node_name, State="DOWN", Reason=row["reason"])
            self._episode_update(down_at=self.clock())
            return "done", "drain did not complete within drain_timeout"
        if kind in ("reboot", "replace"):
            return self._act(kind, node, row, payload)
        return "skipped", f"unknown action kind {kind!r}"

    def _episode_update(self, **changes: Any) -> None:
        with self._lock:
            state = self._state()
            if state.get("episode") is not None:
                state["episode"].update(changes)
                self.store.kv_set(KV_STATE, state)

    def _label_for(self, held: str = "", drained: float = 0.0) -> Optional[Label]:
        with self._lock:
            state = self._state()
            ep = state.get("episode")
            if ep is None or ep["phase"] == "resuming":
                return None
            count = self._reboot_count(ep["code"], ep["component"], self.clock())
            previous = label_mod.find(self._node.field(self.field)) if self._node else None
            return Label(
                "unhealthy",
                ep["code"],
                ep["action"],
                ep["component"],
                float(ep["since"]),
                count,
                tuple(ep["jobs"]),
                held,
                drained or (previous.drained if previous and not held else 0.0),
            )

    def _field_update(self, node: NodeState, lab: Optional[Label]) -> dict[str, str]:
        text = node.field(self.field)
        new = label_mod.edit(text, lab)
        key = "Comment" if self.field == "comment" else "Extra"
        return {} if new == text else {key: new}

    def _write_label(self, node: NodeState, held: str = "") -> None:
        fields = self._field_update(node, self._label_for(held))
        if fields:
            self.client.update(node.name, **fields)

    def _count(self, node: NodeState) -> breaker.Count:
        """The breaker's count for ``node`` (one filtered query: only when about to act)."""
        nodes, total = self.client.held_view(node)
        max_nodes = self.rec["max_drained_nodes"]
        result = breaker.count(
            nodes,
            node.name,
            self.field,
            float(self.rec["max_drained_percent"]),
            int(max_nodes) if max_nodes is not None else None,
            total,
        )
        with self._lock:
            self._breaker = result
        return result

    def _drain(self, node: NodeState, row: dict[str, Any]) -> tuple[str, str]:
        reason = str(row["reason"])
        if node.owned and node.out_of_service:
            self._episode_update(owned=True, drained_at=node.reason_time or self.clock())
            self._write_label(node)
            return "done", "already drained by hma"
        if node.out_of_service and self._may_adopt(node):
            self.client.update(node.name, State="DRAIN", Reason=reason)
            self._episode_update(owned=True, drained_at=self.clock(), adopted=node.reason)
            self._write_label(replace(node, reason=reason))
            return "done", f"took over Slurm's drain {node.reason!r}"
        if node.out_of_service:
            self._episode_update(owned=False)
            self._write_label(node, held="not_owned")
            return "done", f"not owned: left {node.label_text} ({node.reason!r}); labelled only"
        if node.maintenance:
            self._write_label(node, held="maintenance")
            return "held", "maintenance: node is in a maintenance reservation"
        # Count first only when the breaker was open (a held drain, or the last count blocked):
        # otherwise drain at once and count after, undoing a drain beyond the limit (the drain
        # is what a fault needs fast; the count reads the node table).
        last = self._breaker
        if row["state"] == "held" or (last is not None and last.blocks(node.name)):
            count = self._count(node)
            if count.blocks(node.name):
                with self._lock:
                    ep = self._state().get("episode") or {}
                    self._breaker_alert(ep, count, f"drain of {node.name}")
                self._write_label(node, held="breaker")
                return "held", (
                    f"breaker: {count.others(node.name)} node(s) held, limit {count.limit}"
                )
        drained = round(self.clock(), 3)
        fields = self._field_update(node, self._label_for(drained=drained))
        self.client.update(node.name, State="DRAIN", Reason=reason, **fields)
        self._episode_update(owned=True, drained_at=self.clock())
        drained_node = replace(node, flags=node.flags | {"DRAIN"}, reason=reason)
        with self._lock:
            self._node = drained_node
        # Count: nodes failing at the same instant (or past an open breaker) must not get through.
        after = self._count(drained_node)
        if after.beyond(node.name):
            return self._undo(node.name, after)
        return "done", ""

    def _undo(self, name: str, count: breaker.Count) -> tuple[str, str]:
        current = self.client.node(name)
        if current.owned:
            fields = self._field_update(current, self._label_for(held="breaker"))
            self.client.update(name, State="RESUME", **fields)
        self._episode_update(owned=None, drained_at=None)
        with self._lock:
            ep = self._state().get("episode") or {}
            self._breaker_alert(ep, count, f"drain of {name} (undone)")
        return "held", (
            f"breaker: {count.held.index(name)} node(s) held before it; drain undone "
            f"(limit {count.limit})"
        )

    def _may_adopt(self, node: NodeState) -> bool:
        if not self.rec["adopt_slurm_drains"] or not node.drain or node.owned:
            return False
        with self._lock:
            ep = self._state().get("episode") or {}
        return str(ep.get("code", "")).startswith("SLURM_")

    def _act(
        self, kind: str, node: NodeState, row: dict[str, Any], payload: dict[str, Any]
    ) -> tuple[str, str]:
        with self._lock:
            boot_now = self._boot_id
            ep = self._state().get("episode") or {}
        reason = str(row["reason"])
        mode = self.rec["reboot_mode"] if kind == "reboot" else self.rec["replace_mode"]
        hyper = HYPERPOD_REBOOT if kind == "reboot" else HYPERPOD_REPLACE
        # Already in effect? (a restart after kill -9 must not act twice)
        if payload.get("boot_id") and boot_now and payload["boot_id"] != boot_now:
            return "done", "the node rebooted since"
        if kind == "reboot" and mode == "scontrol" and node.reboot_pending:
            self._count_reboot(ep)
            return "done", "reboot already requested"
        if mode == "hyperpod" and node.fail and node.reason == hyper:
            if kind == "reboot":
                self._count_reboot(ep)
            return "done", f"already State=FAIL Reason={hyper}"
        if not (node.owned and node.out_of_service):
            return "skipped", f"not owned: reason is {node.reason!r}"
        if kind == "replace" and mode == "drain_only":
            self._write_label(node)
            self._episode_update(acted={"kind": kind, "boot_id": boot_now, "at": self.clock()})
            return "done", "left drained for a human (replace_mode = drain_only)"
        count = self._count(node)
        if count.blocks(node.name):
            self._breaker_alert(ep, count, f"{kind} of {node.name}")
            self._write_label(node, held="breaker")
            return "held", f"breaker: {count.others(node.name)} node(s) held, limit {count.limit}"
        if kind == "reboot":
            last = float(self.store.kv_get("remediation.last_reboot", 0.0) or 0.0)
            interval = float(self.rec["min_reboot_interval"])
            if last and self.clock() - last < interval:
                self._write_label(node, held="rate")
                return "held", (
                    f"rate: last reboot {self.clock() - last:.0f} s ago, "
                    f"min_reboot_interval {interval:.0f} s"
                )
        self._write_label(node)
        if mode == "scontrol":
            self.client.reboot(node.name, reason)
        elif mode == "hyperpod":
            self.client.update(node.name, State="FAIL", Reason=hyper)
        else:
            self._hook(kind, node.name, reason, row, ep)
        self._episode_update(acted={"kind": kind, "boot_id": boot_now, "at": self.clock()})
        if kind == "reboot":
            self._count_reboot(ep)
            with self._lock:
                self._node = replace(node, flags=node.flags | {"REBOOT_REQUESTED"})
        return "done", f"{kind} via {mode}"

    def _count_reboot(self, ep: dict[str, Any]) -> None:
        """Count one reboot of the episode's fault (once per episode and boot)."""
        with self._lock:
            now = self.clock()
            window = float(self.rec["reboot_window"])
            rows = [r for r in self._reboots() if now - float(r.get("ts", 0)) <= window]
            if any(
                r.get("episode") == ep.get("id") and r.get("boot_id") == self._boot_id for r in rows
            ):
                return
            rows.append(
                {
                    "code": ep.get("code"),
                    "component": ep.get("component"),
                    "ts": now,
                    "episode": ep.get("id"),
                    "boot_id": self._boot_id,
                }
            )
            with self.store.transaction() as conn:
                _kv_put(conn, KV_REBOOTS, rows)
                _kv_put(conn, "remediation.last_reboot", now)
            if ep:
                self._episode_update(acted={"kind": "reboot", "boot_id": self._boot_id, "at": now})

    def _hook(
        self, kind: str, node: str, reason: str, row: dict[str, Any], ep: dict[str, Any]
    ) -> None:
        argv = self.rec["reboot_command"] if kind == "reboot" else self.rec["replace_command"]
        verdict = self._verdict
        findings = [f.to_json() for f in (verdict.draining if verdict is not None else ())]
        fd, path = tempfile.mkstemp(prefix="hma-findings-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(
                    {
                        "node": node,
                        "action": kind,
                        "reason": reason,
                        "jobs": ep.get("jobs", []),
                        "findings": findings,
                    },
                    fh,
                )
            env = self.client.env()
            env.update(
                HMA_NODE=node,
                HMA_ACTION=kind,
                HMA_REASON=reason,
                HMA_ACTION_ID=str(row["key"]),
                HMA_FINDINGS_FILE=path,
            )
            result = CommandRunner().run(list(argv), float(self.rec["command_timeout"]), env=env)
        finally:
            os.unlink(path)
        if not result.ok:
            err = (result.stderr.strip() or result.stdout.strip() or result.error)[-300:]
            what = "timed out" if result.timed_out else f"exited {result.rc}"
            raise SlurmError(f"{kind} hook {what}: {err}")

    def _resume(self, node: NodeState) -> tuple[str, str]:
        with self._lock:
            ep = self._state().get("episode") or {}
        acted = ep.get("acted") or {}
        ours_hyper = (
            node.fail
            and node.reason in (HYPERPOD_REBOOT, HYPERPOD_REPLACE)
            and acted.get("kind") is not None
        )
        lab = self._resume_label(ep)
        fields = self._field_update(node, lab)
        if (node.owned and node.out_of_service) or ours_hyper:
            self.client.update(node.name, State="RESUME", **fields)
            note = f"resumed ({node.label_text}, {node.reason!r})"
        else:
            if fields:
                self.client.update(node.name, **fields)
            note = (
                f"label cleared; {node.label_text} ({node.reason!r}) is not hma's, left alone"
                if node.out_of_service
                else "label cleared"
            )
        with self._lock:
            state = self._state()
            current = state.get("episode")
            if current is not None and current["id"] == ep.get("id"):
                if current["phase"] == "resuming":
                    state["episode"] = None
                else:  # the fault came back while resuming: decide the drain again
                    current.update(owned=None, drained_at=None, acted=None)
                self.store.kv_set(KV_STATE, state)
            self._breaker_alerted = False
        return "done", note

    def _resume_label(self, ep: dict[str, Any]) -> Optional[Label]:
        """After recovery: keep the reboot count in the label while it is inside the window."""
        if not ep:
            return None
        count = self._reboot_count(str(ep.get("code")), str(ep.get("component")), self.clock())
        if not count:
            return None
        last = max(
            (float(r["ts"]) for r in self._reboots() if r.get("code") == ep.get("code")),
            default=self.clock(),
        )
        return Label("recovered", str(ep["code"]), "reboot", str(ep["component"]), last, count)

    # --- facts ----------------------------------------------------------------------------------

    def _facts_loop(self) -> None:
        """Jobs (local slurmd) every ``facts_interval``; the node's state from slurmctld every
        ``heartbeat`` (jittered) while nothing happens, every ``facts_interval`` while something
        does and once after each action applied (so a resume shows at once), backing off up to
        ``heartbeat`` while slurmctld cannot be reached."""
        due = 0.0  # monotonic time of the next node-state read
        failures = 0
        while not self._stop.is_set():
            now = time.monotonic()
            fast = float(self.sl["facts_interval"])
            if now >= due or self._busy() or self._reread.is_set():
                self._reread.clear()
                ok = self._refresh_facts()
                failures = 0 if ok else failures + 1
                if ok:
                    wait = float(self.sl["heartbeat"]) * random.uniform(0.9, 1.1)  # noqa: S311
                else:
                    wait = min(fast * 2**failures, float(self.sl["heartbeat"]))
                due = now + wait
            else:
                self._refresh_jobs()
            self._stop.wait(min(fast, max(0.0, due - time.monotonic())))

    def _busy(self) -> bool:
        """Something is happening: an episode, an open action or a job auto-resume watches."""
        with self._lock:
            return bool(self._state().get("episode")) or bool(self._autoresume.watch)

    def _node_name_now(self) -> str:
        name = self._node_name
        if name is None:
            name = self.client.find_node_name()
            if name is None:
                raise SlurmError("this host matches no NodeHostname/NodeName in Slurm")
        return name

    def _refresh_facts(self) -> bool:
        """Read the node's state (one single-node query) and jobs; returns whether it worked."""
        try:
            name = self._node_name_now()
            node = self.client.node(name)
        except SlurmError as exc:
            return self._facts_failed(exc)
        with self._lock:
            first = self._node_name is None
            self._node_name = name
            self._node = node
            self._seed_reboots(node)
        ok = self._refresh_jobs()
        if first:
            self._wake.set()
        return ok

    def _facts_failed(self, exc: SlurmError) -> bool:
        with self._lock:
            self._facts_ok = False
            self._facts_error = str(exc)
        return False

    def _refresh_jobs(self) -> bool:
        """Read the node's jobs (``SlurmClient.jobs``: no controller query in the steady state)."""
        name = self._node_name
        if name is None:
            return False
        try:
            jobs = self.client.jobs(name)
        except SlurmError as exc:
            return self._facts_failed(exc)
        self._autoresume.observe(self.client, jobs)  # before the jobs are used by _plan
        with self._lock:
            self._jobs = tuple((j.id, j.user) for j in jobs)
            self._facts_ok = self._node is not None
            self._facts_error = ""
        return True

    # --- status helpers -------------------------------------------------------------------------

    def _rows(self, limit: int) -> list[dict[str, Any]]:
        with self.store.transaction() as conn:
            rows = conn.execute(
                "SELECT id, key, kind, node, reason, state, attempts, last_error, created, "
                "updated, next_try FROM actions ORDER BY id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        keys = (
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
        return [dict(zip(keys, r)) for r in reversed(rows)]


def _kv_put(conn: Any, key: str, value: Any) -> None:
    conn.execute(
        "INSERT INTO kv (key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, json.dumps(value)),
    )


def _describe(kind: str, ep: dict[str, Any], node: str, rec: dict[str, Any]) -> str:
    reason = ep.get("reason", "")
    if kind == "drain":
        return f"drain {node} ({reason})"
    if kind == "label":
        return f"label {node} {ep.get('code')}:{ep.get('action')}"
    if kind == "resume":
        return f"resume {node} and clear its label"
    if kind == "down":
        return f"set {node} DOWN ({reason}): drain_timeout passed"
    if kind == "reboot":
        return f"reboot {node} ({rec['reboot_mode']})"
    if kind == "replace":
        return f"replace {node} ({rec['replace_mode']})"
    return f"{kind} {node}"
