"""What follows a verdict in the daemon: remediation decides, the reporters alert, status.json
shows it.

``Effects`` holds the Remediator of the current configuration (remade on a reload, with the
deep-check recovery gate, hma.deepcheck.gate) and the started reporters. The loop hands it each
applied verdict (``react``); remediation's alerts wake the loop (``wake``: an ``AlertsQueued``
message), which takes them (``remediation_alerts``). The status document is built and written by
the status reporter (hma.reporters.statusfile) from the daemon's ``snapshot``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional

from hma.contracts.alert import Alert
from hma.contracts.model import Finding, Severity
from hma.contracts.probe import NodeFacts
from hma.contracts.reporter import Reporter
from hma.deepcheck.gate import RecoveryGate
from hma.detection.setup import Setup
from hma.health.pipeline import Applied, Pipeline
from hma.health.store import Store
from hma.remediation.engine import Remediator
from hma.reporters import start_reporters
from hma.reporters.status import Snapshot, StatusReporter

log = logging.getLogger("hma")


class Effects:
    """Remediation, the reporters and status.json, as the daemon's loop drives them."""

    def __init__(
        self,
        store: Store,
        pipeline: Pipeline,
        clock: Callable[[], float],
        status: StatusReporter,
        snapshot: Callable[[], Snapshot],
        wake: Callable[[], None],
    ) -> None:
        """``snapshot``: the daemon's state now; ``wake``: remediation queued alerts (called in
        remediation's threads)."""
        self.store, self.pipeline, self.clock = store, pipeline, clock
        self.status, self.snapshot, self.wake = status, snapshot, wake
        self.reporters: list[Reporter] = []
        self.remediator: Optional[Remediator] = None

    def start_reporters(self, setup: Setup) -> None:
        """Start ``setup``'s reporters (running ones are kept), closing those no longer wanted."""
        started = start_reporters(setup.config.reporters, log.error, self.reporters)
        for reporter in self.reporters:
            if reporter not in started:
                quietly(reporter.close)
        self.reporters = started

    def start_remediator(self, setup: Setup, domain: str) -> None:
        """A Remediator for ``setup`` in place of the running one (closed), on NVLink domain
        ``domain``."""
        if self.remediator is not None:
            quietly(self.remediator.close)
        gate = RecoveryGate(setup)  # [deep_check] after_recovery (hma.deepcheck.gate)
        remediator = Remediator(setup, self.store, self.clock, resume_gate=gate.hold)
        remediator.on_alert = self.wake
        remediator.set_domain(domain)
        self.remediator = remediator
        self.wake()  # any queued before on_alert was set

    def decide_now(self) -> None:
        """Remediation decides on the current verdict at once (after a start or reload the outbox
        and the episode continue from the state store; updates otherwise come only with changes).
        At start this comes after the boot-id check, so a fault that a reboot cleared is never
        acted on again with the new boot id."""
        if self.remediator is not None:
            self.remediator.update(self.pipeline.model.verdict(self.clock()), self.pipeline.boot_id)

    def react(self, applied: Applied, force_status: bool = False) -> None:
        """Remediation and status.json after a verdict was applied to the store."""
        verdict, changed = applied.verdict, applied.changed
        if self.remediator is not None and (verdict.transitions or changed):
            try:
                self.remediator.update(verdict, self.pipeline.boot_id)
            except Exception:  # noqa: BLE001
                log.exception("remediation failed")
        if verdict.transitions or changed or force_status:
            self.write_status()

    def alert(self, alert: Alert) -> None:
        """Hand an alert to every reporter (a failing one is logged)."""
        for reporter in self.reporters:
            try:
                reporter.alert(alert)
            except Exception as exc:  # noqa: BLE001 - a failing reporter never stops the loop
                log.error("reporter %s failed: %s", reporter.name, exc)

    def write_status(self) -> None:
        """Offer a fresh document to the status reporter (written when it changed, or the
        heartbeat is due); the reporters publish what was written."""
        self.status.publish(self.snapshot(), self.reporters)

    def remediation_alerts(self) -> list[tuple[str, float]]:
        """Alert what remediation queued (status.json shows it at once); returns the GPU resets
        done since the last call: (GPU component, when it ended)."""
        alerts = self.remediator.alerts() if self.remediator is not None else []
        for item in alerts:
            self.alert(item)
        if alerts:
            self.write_status()
        return self.remediator.gpu_resets() if self.remediator is not None else []

    def remediation_status(self) -> Mapping[str, Any]:
        """Remediation's block of status.json ({"error": ...} when it cannot say)."""
        if self.remediator is None:
            return {}
        try:
            return self.remediator.status()
        except Exception as exc:  # noqa: BLE001
            return {"error": str(exc)}

    def facts(self, node_name: str) -> NodeFacts:
        """What probes may know of the node (remediation's reads), else the node's name only."""
        if self.remediator is not None:
            try:
                facts: NodeFacts = self.remediator.facts()
                return facts
            except Exception as exc:  # noqa: BLE001
                log.warning("facts unavailable: %s", exc)
        return NodeFacts(node_name=node_name)

    def read_ahead(self, setup: Setup, finding: Finding) -> None:
        """An event that drains at once (critical, fatal): remediation reads the node's state
        now, while the health model and the state store take the event (its drain then needs
        no read of its own). Runs in the source's thread."""
        entry = setup.catalogue.get(finding.code)
        remediator = self.remediator
        if entry is None or remediator is None or not (entry.drains and entry.enabled):
            return
        if entry.counted or entry.observe:
            return  # drains only at a count, or never
        severity = finding.severity or entry.severity
        if severity is Severity.CRITICAL and (entry.fatal or entry.fail_after <= 1):
            remediator.read_ahead()

    def close(self) -> None:
        """Close the Remediator and the reporters (a failure is logged)."""
        if self.remediator is not None:
            quietly(self.remediator.close)
        for reporter in self.reporters:
            quietly(reporter.close)


def quietly(fn: Callable[[], Any]) -> None:
    """Run a shutdown step; a failure is logged, never raised."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        log.warning("shutdown step failed: %s", exc)
