"""The daemon loop's timed duties: the status heartbeat, the watchdog ping, pruning the findings
history, retrying queued state writes (raising or clearing ``HMA_STATE_WRITE_FAILED``) and the
expiry of window-cleared faults. ``wait`` says when the next one is due: everything else arrives
as a message, so between probe runs the loop sleeps (issue 14).
"""

from __future__ import annotations

import logging
from typing import Callable

from hma.adapters.notify import Notifier
from hma.contracts.model import Clears, Finding, ProbeRun, RunStatus
from hma.health import history
from hma.health.model import HealthModel
from hma.health.store import RETRY_MIN_S, Store
from hma.reporters.status import StatusReporter

log = logging.getLogger("hma")

HEARTBEAT_S = 15.0
STATE_PROBE = "agent:state"  # the findings about writing state are this pseudo probe's
PRUNE_EVERY_S = 3600.0


class Housekeeping:
    """The timers of the loop's duties, and the duties that are not the health model's."""

    def __init__(
        self,
        store: Store,
        status: StatusReporter,
        notifier: Notifier,
        clock: Callable[[], float],
        history_days: Callable[[], float],
        report: Callable[[ProbeRun], None],
    ) -> None:
        """``history_days``: ``[agent] history_days`` now; ``report``: a run of the pseudo probe
        ``agent:state`` (its findings say which state writes fail) for the loop."""
        self.store, self.status, self.notifier, self.clock = store, status, notifier, clock
        self.history_days, self.report = history_days, report
        self._last_ping = 0.0
        self._last_prune = 0.0
        self._write_failures: dict[str, str] = {}  # path -> error, as last reported

    def wait(self, mono: float, model: HealthModel) -> float:
        """Seconds until a duty is due: the status heartbeat, the watchdog ping, a window-cleared
        fault's expiry (``model``'s), a state write retry, pruning."""
        now = self.clock()
        waits = [
            self.status.writer.last_write + HEARTBEAT_S - mono,
            self._last_prune + PRUNE_EVERY_S - now,
        ]
        if self.notifier.watchdog_s is not None:
            waits.append(self._last_ping + self.notifier.watchdog_s / 4 - mono)
        if self.store.write_error:
            waits.append(RETRY_MIN_S)  # the store backs off by itself; flush says when
        for rec in model.records():
            entry = model.catalogue.entry(rec.code)
            if entry.clears is Clears.WINDOW:
                waits.append(rec.last_seen + entry.window_s - now)
        return max(0.0, min(waits))

    def status_due(self, mono: float) -> bool:
        """Whether status.json is to be offered again: its heartbeat, or a pending change."""
        heartbeat = mono - self.status.writer.last_write >= HEARTBEAT_S
        return heartbeat or self.status.writer.wait(mono) <= 0

    def prune_and_ping(self, now: float, mono: float) -> None:
        """Prune the history when due; ping the watchdog (every quarter of ``WatchdogSec``)."""
        if now - self._last_prune >= PRUNE_EVERY_S:
            self._last_prune = now
            history.prune(self.store, now - self.history_days() * 86400)
        if (
            self.notifier.watchdog_s is not None
            and mono - self._last_ping >= self.notifier.watchdog_s / 4
        ):
            self._last_ping = mono
            self.notifier.send(WATCHDOG="1")

    def check_writes(self, now: float) -> None:
        """Retry queued state writes when due, and raise or clear ``HMA_STATE_WRITE_FAILED``
        (one per path: the state database, status.json) when that changes."""
        self.store.flush()
        errors = {
            str(self.store.path): self.store.write_error,
            str(self.status.path): self.status.error,
        }
        failures = {path: error for path, error in errors.items() if error}
        if failures.keys() == self._write_failures.keys():
            return
        for path, error in failures.items():
            if path not in self._write_failures:
                log.error("cannot write %s: %s (working from memory, retrying)", path, error)
        for path in self._write_failures.keys() - failures.keys():
            log.info("%s is written again", path)
        self._write_failures = failures
        findings = tuple(
            Finding(
                "HMA_STATE_WRITE_FAILED",
                f"agent:{path}",
                f"cannot write {path}: {error}; working from memory, retrying",
                {"path": path, "error": error},
                probe=STATE_PROBE,
                ts=now,
            )
            for path, error in failures.items()
        )
        self.report(ProbeRun(STATE_PROBE, RunStatus.RAN, now, 0.0, findings))
