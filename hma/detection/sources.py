"""The event sources' supervisor: each enabled source runs in a thread of its own.

A source that does not apply to this node ends its thread (logged once); one that returns or
raises is reported as a failed run of its pseudo probe ``source:NAME`` (``HMA_PROBE_ERROR``) and
restarted with backoff (1 s doubling to 60 s). Starting again (a reload) stops the running ones
first: ``ctx.stop`` wakes a source blocked in poll.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from hma.contracts.model import Finding, ProbeRun, RunStatus
from hma.contracts.source import KeyValue, StopEvent
from hma.detection.setup import Setup

log = logging.getLogger("hma")

JOIN_S = 5.0  # how long a stopping source's thread is waited for
BACKOFF_MAX_S = 60.0


class SourceSupervisor:
    """Starts, restarts and stops the event sources' threads."""

    def __init__(
        self,
        clock: Callable[[], float],
        kv: Callable[[str], KeyValue],
        report: Callable[[ProbeRun], None],
        found: Callable[[Finding], None],
    ) -> None:
        """``kv(prefix)``: a source's cursors; ``report``: a source started or stopped (a run of
        its pseudo probe); ``found``: a finding a source emitted (in the source's thread)."""
        self.clock, self.kv, self.report, self.found = clock, kv, report, found
        self._stop = StopEvent()
        self._threads: list[threading.Thread] = []

    def start(self, setup: Setup, boot_id: str) -> None:
        """Stop the running sources, then start ``setup``'s enabled ones."""
        self._stop.set()
        for thread in self._threads:
            thread.join(JOIN_S)
        self._stop = StopEvent()
        self._threads = []
        for name, source in setup.sources.items():
            if not setup.config.sources[name]["enabled"]:
                continue
            thread = threading.Thread(
                target=self._run,
                args=(setup, boot_id, name, source, self._stop),
                name=f"source-{name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Tell every source to stop (their threads are not waited for)."""
        self._stop.set()

    def _run(self, setup: Setup, boot_id: str, name: str, source: Any, stop: StopEvent) -> None:
        backoff = 1.0
        label = f"source:{name}"
        while not stop.is_set():
            ctx = setup.source_context(name, boot_id, self.kv(f"{label}."))
            ctx.stop = stop
            reason = source.applies(ctx)
            if reason:
                log.info("event source %s does not apply: %s", name, reason)
                return
            self.report(ProbeRun(label, RunStatus.RAN, self.clock(), 0.0))

            def emit(finding: Finding, _name: str = name) -> None:
                self.found(finding.with_(probe=finding.probe or _name))

            try:
                source.run(ctx, emit)
                error = "returned"
            except Exception as exc:  # noqa: BLE001 - report, back off, restart
                error = f"{type(exc).__name__}: {exc}"
            if stop.is_set():
                return
            finding = Finding(
                "HMA_PROBE_ERROR", label, f"event source {name} stopped: {error}", {"error": error}
            )
            started = self.clock()
            stopped = finding.with_(probe=label, ts=self.clock())
            self.report(ProbeRun(label, RunStatus.FAILED, started, 0.0, (stopped,), error))
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
