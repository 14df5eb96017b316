"""``hma run``: the agent's main loop.

One thread owns the health model: it takes probe results, event findings, device events and
signals from a queue, so every input is processed when it arrives (not at the next poll) and the
status file, the state store, reporters and remediation see each change at once. Probe runs
happen in their own threads or worker processes (the scheduler, hma.detection.scheduler); a stuck
probe never delays the loop or the watchdog, which is pinged only from the loop itself. The
event sources run in threads of their own (hma.detection.sources), operator requests are applied
by hma.daemon.operator, and the status reporter (hma.reporters.status) builds status.json
from the snapshot the loop hands it.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from hma import __version__, assembly
from hma.adapters import logs
from hma.adapters.notify import Notifier
from hma.config.files import empty_files
from hma.config.schema import ConfigError
from hma.contracts.alert import Alert
from hma.contracts.model import Finding, ProbeRun, Severity
from hma.daemon import checkreq, lock
from hma.daemon.effects import Effects, quietly
from hma.daemon.housekeeping import HEARTBEAT_S, Housekeeping
from hma.daemon.operator import OperatorRequests
from hma.detection.scheduler import ProbeState, Scheduler
from hma.detection.setup import Setup
from hma.detection.sources import SourceSupervisor
from hma.health.model import HealthModel, listed
from hma.health.pipeline import Pipeline, open_store
from hma.health.store import Store
from hma.remediation.planner import VERIFY_PROBE
from hma.reporters import status, statusfile
from hma.topology import domain

log = logging.getLogger("hma")
CHECK_POLL_S = 1.0  # how often the loop looks at the folder of requested checks


# --- the loop's input messages: one type per kind, dispatched on type by Daemon._handle ---------


@dataclass(frozen=True)
class ProbeDone:
    """A run that the loop started finished; ``state`` is the probe it was started for."""

    state: ProbeState
    run: ProbeRun


@dataclass(frozen=True)
class RunReport:
    """A run the loop did not schedule: an event source starting or stopping, state writes."""

    run: ProbeRun


@dataclass(frozen=True)
class EventFound:
    """A finding an event source emitted."""

    finding: Finding


@dataclass(frozen=True)
class DeviceChanged:
    """A device of ``subsystem`` was added or removed (a uevent)."""

    subsystem: str
    action: str
    device: str


@dataclass(frozen=True)
class SignalReceived:
    """A signal the process received (handled in the loop, not in the handler)."""

    signum: int


@dataclass(frozen=True)
class AlertsQueued:
    """Remediation queued alerts (``Remediator.alerts``): the loop sleeps until it says so."""


Message = Union[ProbeDone, RunReport, EventFound, DeviceChanged, SignalReceived, AlertsQueued]


def load_for_reload(config_file: Optional[str]) -> Setup:
    """The configuration again; raises ``ConfigError`` also when a file of it is empty (being
    rewritten right now, most likely: all defaults is never meant)."""
    new = assembly.load(config_file)
    empty = empty_files(new.config.files)
    if empty:
        raise ConfigError([f"{name}: empty file (half-written?)" for name in empty])
    return new


class StoreKV:
    """``KeyValue`` view of the state store under a key prefix (event-source cursors, probes'
    last snapshots)."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def get(self, key: str, default: Any = None) -> Any:
        """Stored value or default."""
        return self.store.kv_get(self.prefix + key, default)

    def set(self, key: str, value: Any) -> None:
        """Store a value."""
        self.store.kv_set(self.prefix + key, value)


class Daemon:
    """The long-running agent: the loop, its configuration and signals, and the wiring of the
    scheduler, the event sources, operator requests, housekeeping and the effects of a verdict
    (remediation, reporters, status.json)."""

    def __init__(
        self,
        config_file: Optional[str] = None,
        notifier: Optional[Notifier] = None,
        clock: Callable[[], float] = time.time,
        log_level: Optional[str] = None,
    ) -> None:
        self.config_file = config_file
        # None: logging is left alone (tests); "": [agent] log_level; else --log-level's
        self.log_level = log_level
        self.notifier = notifier or Notifier()
        self.clock = clock
        self.inputs: queue.Queue[Message] = queue.Queue()
        self.stopping = threading.Event()
        self.setup = assembly.load(config_file)  # ConfigError propagates: exit 78
        agent = self.setup.config.section("agent")
        self._apply_log_level()
        self._lock = lock.hold_lock(agent["state_dir"])  # AlreadyRunning propagates: exit 75
        # from memory: a full or failing disk never stops detection or remediation
        # (hma.health.store)
        self.store = open_store(self.setup, memory=True)
        self.status = status.StatusReporter(statusfile.status_path(agent["run_dir"]), HEARTBEAT_S)
        self.boot_id = statusfile.boot_id(self.setup.config.section("paths")["procfs"])
        # alerts of the pipeline go to the reporters (self.effects, made next)
        self.pipeline = Pipeline(
            self.setup, self.store, self.boot_id, lambda item: self.effects.alert(item)
        )
        for note in self.pipeline.dropped:
            log.warning("dropped unreadable state row: %s", note)
        self.started = self.clock()
        self.effects = Effects(
            self.store,
            self.pipeline,
            self.clock,
            self.status,
            self.snapshot,
            lambda: self.inputs.put(AlertsQueued()),
        )
        self.scheduler = Scheduler(
            self.setup,
            self.boot_id,
            StoreKV(self.store, "probe."),
            self.clock,
            lambda state, run: self.inputs.put(ProbeDone(state, run)),
            lambda sub, action, dev: self.inputs.put(DeviceChanged(sub, action, dev)),
        )
        self.sources = SourceSupervisor(
            self.clock,
            lambda prefix: StoreKV(self.store, prefix),
            lambda run: self.inputs.put(RunReport(run)),
            self._found,
        )
        self.checks: Optional[checkreq.CheckRequests] = None  # made by _configure
        self.requests = OperatorRequests(self.store, self.pipeline, self.clock, self.effects)
        self.housekeeping = Housekeeping(
            self.store,
            self.status,
            self.notifier,
            self.clock,
            lambda: float(self.setup.config.section("agent")["history_days"]),
            lambda run: self.inputs.put(RunReport(run)),
        )

    @property
    def model(self) -> HealthModel:
        """The health model (the pipeline's: a GPU reset replaces it)."""
        return self.pipeline.model

    # --- lifecycle ------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit status."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, self._on_signal)
        self._configure()
        self._startup_findings()
        self.effects.decide_now()
        self.effects.write_status()
        self.notifier.send(READY="1", STATUS=self._status_line())
        try:
            self._loop()
        finally:
            self.notifier.send(STOPPING="1")
            self._teardown()
        return 0

    def _apply_log_level(self) -> None:
        if self.log_level is not None:
            logs.set_level(self.log_level or self.setup.config.section("agent")["log_level"])

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.inputs.put(SignalReceived(signum))

    def _configure(self) -> None:
        for line in self.setup.config.warnings:  # `hma config check` prints them too
            log.warning("configuration: %s", line)
        for name in self.scheduler.configure(self.setup):
            self.effects.react(self.pipeline.apply(self.model.forget_probe(name, self.clock())))
        self.effects.start_reporters(self.setup)
        self.effects.start_remediator(self.setup, self.topology()["domain"])
        self.sources.start(self.setup, self.boot_id)
        self.checks = checkreq.configure(
            self.setup.config.section("agent"), self.checks, self.pipeline
        )

    def _teardown(self) -> None:
        self.sources.stop()
        self.scheduler.stop_devices()
        for state in self.scheduler.probes.values():
            quietly(state.slot.close)
        self.effects.close()
        self.store.close()  # one last try to write what is queued
        if self.store.write_error:
            log.error(
                "stopped without writing everything to %s (%s): changes since then are lost",
                self.store.path,
                self.store.write_error,
            )
        if self._lock is not None:  # last: the state folder is free for the next daemon
            os.close(self._lock)

    def _startup_findings(self) -> None:
        now = self.clock()
        for applied in self.pipeline.start(now):
            self.effects.react(applied)
        started = Alert("agent", "", "agent", Severity.OK, f"hma {__version__} started", ts=now)
        self.effects.alert(started)

    def reload(self) -> None:
        """Re-read the configuration; an invalid one keeps the old configuration and alerts."""
        self.notifier.send(RELOADING="1")
        try:
            new = load_for_reload(self.config_file)
        except ConfigError as exc:
            log.error("reload refused, keeping the previous configuration:\n%s", exc)
            self._event(
                Finding(
                    "HMA_CONFIG_RELOAD_FAILED",
                    "agent",
                    f"invalid configuration, kept the previous one: {exc.errors[0]}",
                    {"errors": exc.errors},
                    probe="agent",
                )
            )
        else:
            self.setup = self.pipeline.setup = new
            self.model.catalogue = new.catalogue
            self._apply_log_level()
            self._configure()
            self.effects.decide_now()
            log.info("configuration reloaded")
        self.notifier.send(READY="1", STATUS=self._status_line())

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopping.is_set():
            due = self.scheduler.dispatch(lambda: self.effects.facts(self.setup.node_name))
            mono = time.monotonic()
            timeout = min(
                due, self.housekeeping.wait(mono, self.model), self.status.writer.wait(mono)
            )
            timeout = min(timeout, CHECK_POLL_S) if self.checks is not None else timeout
            try:
                message: Optional[Message] = self.inputs.get(timeout=timeout)
            except queue.Empty:
                message = None
            if message is not None:
                try:
                    self._handle(message)
                except Exception:  # noqa: BLE001 - one bad input must not kill the daemon
                    log.exception("failed to process %s", type(message).__name__)
            self._periodic()

    def _periodic(self) -> None:
        now = self.clock()
        self.housekeeping.check_writes(now)
        tick = self.model.tick(now)
        if tick.transitions:
            self.effects.react(self.pipeline.apply(tick))
        mono = time.monotonic()
        if self.housekeeping.status_due(mono):
            self.effects.write_status()
        self.housekeeping.prune_and_ping(now, mono)
        if self.checks is not None and self.checks.poll(now):  # a user asked: every probe now
            for name in self.checks.start(self.scheduler.probes, now):
                self.scheduler.run_now(name)
            self.effects.write_status()

    def _handle(self, message: Message) -> None:
        if isinstance(message, ProbeDone):
            if self._probe_done(message.state, message.run):
                self._observe(message.run)
                if self.checks and self.checks.ran(message.state.name, message.run, self.clock()):
                    self.effects.write_status()  # the requested check's verdict
        elif isinstance(message, RunReport):
            self._observe(message.run)
        elif isinstance(message, EventFound):
            self._event(message.finding)
        elif isinstance(message, DeviceChanged):
            self.scheduler.device_changed(message.subsystem, message.action, message.device)
        elif isinstance(message, SignalReceived):
            self._on_signal_item(message.signum)
        elif isinstance(message, AlertsQueued):
            for gpu, at in self.effects.remediation_alerts():
                self._gpu_reset(gpu, at)

    def _gpu_reset(self, gpu: str, at: float) -> None:
        """A GPU reset succeeded: clear the faults it clears and run the verifying probe now
        (its completed run is the good observation remediation waits for)."""
        log.info("GPU %s was reset: running the %s probe", gpu, VERIFY_PROBE)
        self.effects.react(self.pipeline.gpu_reset(gpu, at, self.clock()), force_status=True)
        self.scheduler.run_now(VERIFY_PROBE)

    def _probe_done(self, state: ProbeState, run: ProbeRun) -> bool:
        """A scheduled run finished: the scheduler records it, remediation hears of a completed
        one (and of the NVLink domain a new snapshot may show); False when it was dropped."""
        if not self.scheduler.finish(state, run):
            return False
        remediator = self.effects.remediator
        if run.completed and remediator is not None:
            remediator.probe_ran(state.name, run.started)
            if run.snapshot is not None:
                remediator.set_domain(self.topology()["domain"])
        return True

    def _observe(self, run: ProbeRun) -> None:
        self.effects.react(self.pipeline.observe_run(run, self.clock()), force_status=True)

    def _event(self, finding: Finding) -> None:
        for applied in self.pipeline.event(finding, self.clock()):
            self.effects.react(applied)

    def _found(self, finding: Finding) -> None:
        """An event source's finding (in the source's thread): read ahead, then to the loop."""
        self.effects.read_ahead(self.setup, finding)
        self.inputs.put(EventFound(finding))

    def _on_signal_item(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            log.info("stopping on signal %d", signum)
            self.stopping.set()
        elif signum == signal.SIGHUP:
            self.reload()
        elif signum == signal.SIGUSR1:
            self.requests.process()

    # --- what the status reporter is handed -----------------------------------------------------

    def snapshot(self) -> status.Snapshot:
        """The node's state now, for the status reporter (docs/status.md)."""
        now = self.clock()
        verdict = self.model.verdict(now)
        mono = time.monotonic()
        summaries = self.scheduler.summaries()
        probes = tuple(
            status.ProbeStatus(
                name, state.last, now + max(0.0, state.next_due - mono), summaries[name]
            )
            for name, state in sorted(self.scheduler.probes.items())
        )
        window = self.requests.watch_maintenance(now)
        faults = listed(self.model)
        remediation = self.effects.remediation_status()
        return status.Snapshot(
            node=self.setup.node_name,
            boot_id=self.boot_id,
            started=self.started,
            generated=now,
            severity=str(verdict.severity),
            action=str(verdict.action),
            active=len(verdict.faults),
            instance_type=self.setup.instance_type(),
            topology=self.topology(summaries),
            probes=probes,
            faults=tuple(f.to_json() for f in faults),
            remediation=remediation,
            maintenance=window.to_json(now) if window is not None else None,
            sources=tuple(s.to_json() for s in self.sources.states()),
            requested=self.checks.to_json() if self.checks is not None else None,
        )

    def topology(self, summaries: Optional[Mapping[str, Any]] = None) -> dict[str, str]:
        """The node's NVLink domain and where it came from (hma.topology.domain)."""
        if summaries is None:
            summaries = self.scheduler.summaries()
        configured = self.setup.config.section("topology")["domain"]
        name, source = domain.resolve(configured, summaries)
        return {"domain": name, "source": source}

    def _status_line(self) -> str:
        verdict = self.model.verdict(self.clock())
        return status.status_line(
            str(verdict.severity), len(verdict.faults), len(self.scheduler.probes)
        )
