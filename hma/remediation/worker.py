"""The outbox worker: applies due actions strictly in order and records what each did.

One attempt: the maintenance window is read, the applier's step runs (``actions.Applier``), and
its outcome is written once, in one transaction: the row's new state (done, skipped, held and
tried again, failed and retried with backoff) and the episode as ``transitions.fold`` makes it.
Between passes the planner is asked again and the breaker's recheck runs (docs/remediation.md).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from hma.contracts.cluster import BackendError
from hma.health import maintenance_mode
from hma.health.store import Store
from hma.remediation.actions import Applier, describe
from hma.remediation.alerts import Alerts
from hma.remediation.breaker import Breaker
from hma.remediation.options import Recovery
from hma.remediation.outbox import Outbox, Row, backoff
from hma.remediation.planner import Episode
from hma.remediation.transitions import Failed, Held, Outcome, ResetRan, fold, state_of

log = logging.getLogger("hma.remediation")


class Worker:
    """Applies the outbox of one engine (see module doc). ``plan``: the engine's planning pass;
    ``node_name``: this node's name now; ``gpu_reset_done``: told (GPU, end time) of each GPU
    reset that worked, once its outcome is written; ``applied``: set when an action was done
    (the facts thread reads the node's state again); ``stop``: set to end the loop."""

    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        applier: Applier,
        breaker: Breaker,
        recovery: Recovery,
        alerts: Alerts,
        clock: Callable[[], float],
        plan: Callable[[], None],
        node_name: Callable[[], Optional[str]],
        gpu_reset_done: Callable[[str, float], None],
        applied: threading.Event,
        stop: threading.Event,
    ) -> None:
        self.store = store
        self.outbox = outbox
        self.applier = applier
        self.breaker = breaker
        self.rec = recovery
        self.alerts = alerts
        self.clock = clock
        self.plan = plan
        self.node_name = node_name
        self.gpu_reset_done = gpu_reset_done
        self.stop = stop
        self.wake = threading.Event()
        self.read_ahead = threading.Event()  # a drain may come: read the node's state now
        self.applied = applied

    def loop(self) -> None:
        """The worker thread: plan, apply what is due, recheck, plan; then wait until the next
        action is due, ``recheck_interval`` passed or something wakes it."""
        while not self.stop.is_set():
            try:
                if self.read_ahead.is_set():
                    self.read_ahead.clear()
                    self._read_node_ahead()
                self.plan()
                self.process_due()
                self.recheck()
                self.plan()
            except Exception:  # noqa: BLE001 - the worker never dies
                log.exception("remediation worker error")
            wait = self.rec.recheck_interval
            nxt = self.outbox.next_due()
            if nxt is not None:
                wait = max(0.0, min(wait, nxt - self.clock()))
            self.wake.wait(wait)
            self.wake.clear()

    def _read_node_ahead(self) -> None:
        """The node's state for a drain about to be decided (``Remediator.read_ahead``)."""
        name = self.node_name()
        if name is not None and self.outbox.episode() is None:
            self.applier.read_ahead(name)

    def process_due(self) -> bool:
        """Apply due actions in order; returns whether any was attempted."""
        did = False
        while not self.stop.is_set():
            rows = self.outbox.due()
            if not rows:
                return did
            row = rows[0]  # strictly in order: a later action never overtakes an earlier one
            if row.next_try > self.clock():
                return did
            did = True
            self._attempt(row)
        return did

    def recheck(self) -> None:
        """The breaker's recheck (``Applier.recheck``); a drain it undid is folded into the
        episode."""
        undone = self.applier.recheck()
        if undone is not None:
            with self.outbox.lock, self.store.transaction() as conn:
                self._fold(conn, undone)

    def _fold(self, conn: Any, outcome: Outcome) -> Optional[Episode]:
        """Fold ``outcome`` into the open episode and write it when it changed (under the
        outbox's lock, in transaction ``conn``); returns the episode as it is now."""
        seq, ep = self.outbox.load()
        new = fold(ep, outcome)
        if new is not ep:
            self.outbox.save(conn, seq, new)
        return new

    def _attempt(self, row: Row) -> None:
        self.outbox.attempting(row.id, self.clock())
        outcome: Outcome
        try:
            # `hma maintenance on`: decided and alerted, not done
            window = maintenance_mode.load(self.store)
            if window is not None and window.active(self.clock()):
                outcome = Held(f"maintenance: hma maintenance on, {window.describe()}")
            else:
                outcome = self.applier.apply(row)
        except BackendError as exc:
            outcome = Failed(str(exc))
        except Exception as exc:  # noqa: BLE001 - one bad action must not stop the worker
            log.exception("action %s failed", row.key)
            outcome = Failed(f"{type(exc).__name__}: {exc}")
        state = state_of(outcome)
        with self.outbox.lock, self.store.transaction() as conn:  # the attempt's one write
            ep = self._fold(conn, outcome) or Episode.from_json(
                {**row.payload, "id": row.payload.get("episode"), "reason": row.reason}
            )
            cancelled = self.outbox.cancelled(conn, row.id)
            if not cancelled:
                self._record(conn, row, ep, state, outcome.note)
        if isinstance(outcome, ResetRan) and outcome.ok:
            self.gpu_reset_done(outcome.component, outcome.at)
        if state != "held" and not cancelled:
            self.breaker.passed()

    def _record(self, conn: Any, row: Row, ep: Episode, state: str, note: str) -> None:
        """The row's new state after an attempt, and its alert."""
        now = self.clock()
        attempts = row.attempts + 1
        if state == "failed":
            delay = backoff(attempts, self.rec.retry_min, self.rec.retry_max)
            self.outbox.retry(conn, row.id, "failed", note, now, now + delay)
            self.alerts.about(
                "action_failed",
                ep,
                f"{row.kind} of {row.node} failed (attempt {attempts}, retry in "
                f"{delay:.0f} s): {note}",
                row.kind,
                {"error": note, "attempts": attempts, "action_id": row.id},
            )
        elif state == "held":
            self.outbox.retry(conn, row.id, "held", note, now, now + self.rec.recheck_interval)
            if row.state != "held":
                self.alerts.about(
                    "action_held",
                    ep,
                    f"{row.kind} of {row.node} held: {note}",
                    row.kind,
                    {"held": note.split(":")[0], "action_id": row.id},
                )
        else:
            self.outbox.finish(conn, row.id, state, now, note)
            if state == "done":
                self.applied.set()  # the node's state changed: status shows it soon
                self.alerts.about(
                    "action_applied",
                    ep,
                    f"{describe(row.kind, ep, row.node, self.rec)}: done"
                    + (f" ({note})" if note else ""),
                    row.kind,
                    {"action_id": row.id, "note": note},
                )
