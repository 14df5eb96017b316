"""The operator requests a running daemon applies, read on SIGUSR1 from the state store's queue
(hma.health.requests): ``hma ack``, ``hma maintenance on|off``, ``hma reset`` and deep-check
results; and the maintenance window's start and end, which go to the log.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional

from hma.contracts import maintenance
from hma.daemon.effects import Effects
from hma.deepcheck import record as deepcheck_record
from hma.health import maintenance_mode, requests
from hma.health.pipeline import Pipeline
from hma.health.store import Store
from hma.remediation.engine import Remediator, reset_alert

log = logging.getLogger("hma")


class OperatorRequests:
    """Takes the queued requests and applies each; watches the maintenance window."""

    def __init__(
        self, store: Store, pipeline: Pipeline, clock: Callable[[], float], effects: Effects
    ) -> None:
        self.store, self.pipeline, self.clock, self.effects = store, pipeline, clock, effects
        self.inbox = requests.Inbox(store)
        self._maintenance_active: Optional[bool] = None  # as last logged

    def process(self) -> None:
        """Apply the operator requests queued in the state store, oldest first."""
        for req in self.inbox.take(self.clock()):
            kind, payload, who = req["kind"], req["payload"], req["who"]
            if kind == requests.ACK:
                applied = self.pipeline.ack(
                    payload.get("code", ""), payload.get("component"), who, self.clock()
                )
                self.effects.react(applied)
            elif kind == maintenance.REQUEST_KIND:  # hma maintenance on|off
                self._set_maintenance(payload, who)
            elif kind == requests.RESET and self.effects.remediator is not None:  # hma reset
                self._reset(self.effects.remediator, payload, who)
            elif kind == deepcheck_record.REQUEST_KIND:  # hma deep-check results
                for run in deepcheck_record.from_payload(payload):
                    self.effects.react(self.pipeline.observe_run(run, self.clock()))

    def _reset(self, remediator: Remediator, payload: dict[str, Any], who: str) -> None:
        done = remediator.release(
            payload.get("code"), payload.get("component"), who, payload["reason"]
        )
        self.effects.alert(reset_alert(payload, who, done, self.clock()))
        self.effects.decide_now()
        self.effects.write_status()

    def _set_maintenance(self, payload: Mapping[str, Any], who: str) -> None:
        raw = payload.get("window")  # None: maintenance off
        try:
            window = maintenance.Maintenance.from_json(raw) if raw is not None else None
        except (ValueError, AttributeError) as exc:
            log.error("maintenance request refused: %s", exc)
            return
        maintenance_mode.save(self.store, window, who, self.clock())
        self.watch_maintenance(self.clock())
        self.effects.write_status()

    def watch_maintenance(self, now: float) -> Optional[maintenance.Maintenance]:
        """The maintenance window; its start and end (also by expiry) go to the log."""
        window = maintenance_mode.load(self.store)
        active = window is not None and window.active(now)
        if active != self._maintenance_active:
            if active and window is not None:
                log.warning(
                    "maintenance on, %s: faults are detected, recorded and alerted; no action "
                    "is taken on this node",
                    window.describe(),
                )
            elif self._maintenance_active is not None:
                ended = window.describe(now) if window is not None else "turned off"
                log.warning("maintenance off (%s): remediation acts again", ended)
            self._maintenance_active = active
        return window
