"""The event sources' supervisor: each enabled source runs in a thread of its own, and its
state is kept for status.json, ``hma status`` and the metrics (``states``, docs/status.md).

A source that does not apply to this node ends its thread (logged once; state
``not-applicable``); one that returns or raises is reported as a failed run of its pseudo probe
``source:NAME`` (``HMA_PROBE_ERROR``) and restarted with backoff (1 s doubling to 60 s; state
``restarting``, ``failed`` from the third failure in a row; a run that lasted 60 s starts the
count again). A running source tells what it reads through ``ctx.started`` (state ``running``,
or ``blind`` while it reads nothing it is for); a source that cannot read what it is for raises
its ``blind_finding`` as a run of its pseudo probe, cleared by the next run that can. Starting
again (a reload) stops the running ones first: ``ctx.stop`` wakes a source blocked in poll.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from hma.contracts.model import Finding, ProbeRun, RunStatus
from hma.contracts.source import KeyValue, SourceContext, StopEvent
from hma.detection.setup import Setup

log = logging.getLogger("hma")

JOIN_S = 5.0  # how long a stopping source's thread is waited for
BACKOFF_MIN_S = 1.0  # the first restart's delay (doubling to BACKOFF_MAX_S)
BACKOFF_MAX_S = 60.0
FAILED_AFTER = 3  # failures in a row after which a restarting source is shown failed


@dataclass(frozen=True)
class SourceState:
    """One event source as status.json shows it (``sources``): its state (hma.contracts.source
    ``STATES``) since
    when, what it reads (``backend``: ``kmsg``, ``journal``, ``nvml``; "" not told), why
    (``reason``: why it does not apply, failed, is blind, or took that backend) and its
    failures in a row."""

    name: str
    state: str
    since: float
    backend: str = ""
    reason: str = ""
    failures: int = 0

    def to_json(self) -> dict[str, Any]:
        """The source's entry of ``sources`` (docs/status.md)."""
        return {
            "name": self.name,
            "state": self.state,
            "backend": self.backend,
            "since": self.since,
            "reason": self.reason,
            "failures": self.failures,
        }


class SourceSupervisor:
    """Starts, restarts and stops the event sources' threads, and keeps their states."""

    def __init__(
        self,
        clock: Callable[[], float],
        kv: Callable[[str], KeyValue],
        report: Callable[[ProbeRun], None],
        found: Callable[[Finding], None],
    ) -> None:
        """``kv(prefix)``: a source's cursors; ``report``: a source started, stopped or
        changed state (a run of its pseudo probe); ``found``: a finding a source emitted (in
        the source's thread)."""
        self.clock, self.kv, self.report, self.found = clock, kv, report, found
        self._stop = StopEvent()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._states: dict[str, SourceState] = {}

    def start(self, setup: Setup, boot_id: str) -> None:
        """Stop the running sources, then start ``setup``'s enabled ones."""
        self._stop.set()
        for thread in self._threads:
            thread.join(JOIN_S)
        self._stop = StopEvent()
        self._threads = []
        enabled = [n for n in setup.sources if setup.config.sources[n]["enabled"]]
        with self._lock:
            self._states = {n: SourceState(n, "starting", self.clock()) for n in enabled}
        for name in enabled:
            thread = threading.Thread(
                target=self._run,
                args=(setup, boot_id, name, setup.sources[name], self._stop),
                name=f"source-{name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Tell every source to stop (their threads are not waited for)."""
        self._stop.set()

    def states(self) -> tuple[SourceState, ...]:
        """The enabled sources' states, by name."""
        with self._lock:
            return tuple(self._states[n] for n in sorted(self._states))

    def _set(self, name: str, state: str, **changes: Any) -> None:
        """Record ``name``'s ``state`` (``since`` kept while the state stays the same)."""
        with self._lock:
            old = self._states.get(name) or SourceState(name, state, self.clock())
            since = old.since if old.state == state else self.clock()
            self._states[name] = replace(old, state=state, since=since, **changes)

    def _blind(self, source: Any, ctx: SourceContext, name: str, reason: str) -> None:
        """A run of ``name``'s pseudo probe: its ``blind_finding`` while it cannot read what it
        is for (``reason``; "" when it can: the run clears it)."""
        blind_finding = getattr(source, "blind_finding", None)  # EventSource's (duck-typed)
        finding: Optional[Finding] = None
        if reason and blind_finding is not None:
            finding = blind_finding(ctx, reason)
        label = f"source:{name}"
        now = self.clock()
        findings = (finding.with_(probe=label, ts=now),) if finding is not None else ()
        self.report(ProbeRun(label, RunStatus.RAN, now, 0.0, findings))

    def _started(
        self, source: Any, ctx: SourceContext, name: str
    ) -> Callable[[str, str, bool], None]:
        """``ctx.started`` of a run of ``name``."""

        def started(backend: str, reason: str = "", blind: bool = False) -> None:
            state = "blind" if blind else "running"
            self._set(name, state, backend=backend, reason=reason)
            if blind:
                log.warning("event source %s (%s) reads nothing: %s", name, backend, reason)
            self._blind(source, ctx, name, reason if blind else "")

        return started

    def _run(self, setup: Setup, boot_id: str, name: str, source: Any, stop: StopEvent) -> None:
        backoff, failures = BACKOFF_MIN_S, 0
        label = f"source:{name}"
        while not stop.is_set():
            ctx = setup.source_context(name, boot_id, self.kv(f"{label}."))
            ctx.stop = stop
            ctx.started = self._started(source, ctx, name)
            reason = source.applies(ctx)
            if reason:
                log.info("event source %s does not apply: %s", name, reason)
                self._set(name, "not-applicable", backend="", reason=reason)
                self._blind(source, ctx, name, reason)
                return
            self._set(name, "running", backend="", reason="")
            self.report(ProbeRun(label, RunStatus.RAN, self.clock(), 0.0))

            def emit(finding: Finding, _name: str = name) -> None:
                self.found(finding.with_(probe=finding.probe or _name))

            began = time.monotonic()
            try:
                source.run(ctx, emit)
                error = "returned"
            except Exception as exc:  # noqa: BLE001 - report, back off, restart
                error = f"{type(exc).__name__}: {exc}"
            if stop.is_set():
                return
            if time.monotonic() - began >= BACKOFF_MAX_S:  # it ran a while: count afresh
                backoff, failures = BACKOFF_MIN_S, 0
            failures += 1
            state = "failed" if failures >= FAILED_AFTER else "restarting"
            self._set(name, state, reason=error, failures=failures)
            finding = Finding(
                "HMA_PROBE_ERROR", label, f"event source {name} stopped: {error}", {"error": error}
            )
            started = self.clock()
            stopped = finding.with_(probe=label, ts=self.clock())
            self.report(ProbeRun(label, RunStatus.FAILED, started, 0.0, (stopped,), error))
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
