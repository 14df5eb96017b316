"""``hma run``: the agent's main loop.

One thread owns the health model: it takes probe results, event findings, device events and
signals from a queue, so every input is processed when it arrives (not at the next poll) and the
status file, the state store, reporters and remediation see each change at once. Probe runs
happen in their own threads or worker processes (hma.detection.runner); a stuck probe never delays
the loop or the watchdog, which is pinged only from the loop itself.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from hma import __version__, assembly
from hma.adapters import logs
from hma.adapters.notify import Notifier
from hma.config.files import empty_files
from hma.config.schema import EX_CONFIG, ConfigError
from hma.contracts import maintenance
from hma.contracts.alert import Alert
from hma.contracts.model import Clears, Finding, ProbeRun, RunStatus, Severity
from hma.contracts.probe import NodeFacts
from hma.contracts.reporter import Reporter
from hma.contracts.source import StopEvent
from hma.deepcheck import record as deepcheck_record
from hma.deepcheck.gate import RecoveryGate
from hma.detection.devices import DeviceWatcher
from hma.detection.runner import make_slot, run_probe
from hma.health import history, maintenance_mode
from hma.health.model import HealthModel
from hma.health.pipeline import Applied, Pipeline, open_store
from hma.health.store import RETRY_MIN_S, StateError, Store
from hma.remediation.engine import Remediator, reset_alert
from hma.remediation.planner import VERIFY_PROBE
from hma.reporters import start_reporters
from hma.reporters.statusfile import StatusWriter, boot_id, status_path
from hma.topology import domain as topology_domain

log = logging.getLogger("hma")

HEARTBEAT_S = 15.0
UNSUPPORTED_RECHECK_S = 3600.0
"""How long an "unsupported" answer of a probe with ``unsupported_stands`` stands without a
device event of its triggers."""
STATE_PROBE = "agent:state"  # the findings about writing state are this pseudo probe's
PRUNE_EVERY_S = 3600.0


@dataclass
class ProbeState:
    """Scheduling and last-result facts of one probe, shown in status.json."""

    name: str
    slot: Any
    next_due: float
    in_flight: bool = False
    last: Optional[ProbeRun] = None
    previous: Any = None
    previous_ts: float = 0.0
    device_events: int = 0
    dispatched_events: int = 0  # device_events when the run in flight started


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


class StoreKV:
    """``KeyValue`` view of the state store under a key prefix (event-source cursors)."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def get(self, key: str, default: Any = None) -> Any:
        """Stored value or default."""
        return self.store.kv_get(self.prefix + key, default)

    def set(self, key: str, value: Any) -> None:
        """Store a value."""
        self.store.kv_set(self.prefix + key, value)


class Daemon:
    """The long-running agent."""

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
        self._lock = hold_lock(agent["state_dir"])  # AlreadyRunning propagates: exit 75
        # from memory: a full or failing disk never stops detection or remediation
        # (hma.health.store)
        self.store = open_store(self.setup, memory=True)
        self.status_path = status_path(agent["run_dir"])
        self.status_writer = StatusWriter(self.status_path, HEARTBEAT_S)
        self.boot_id = boot_id(self.setup.config.section("paths")["procfs"])
        self.pipeline = Pipeline(self.setup, self.store, self.boot_id, self._alert)
        for note in self.pipeline.dropped:
            log.warning("dropped unreadable state row: %s", note)
        self.started = self.clock()
        self.probes: dict[str, ProbeState] = {}
        self.reporters: list[Reporter] = []
        self.remediator: Optional[Remediator] = None
        self._source_stop = StopEvent()
        self._source_threads: list[threading.Thread] = []
        self.devices: Optional[DeviceWatcher] = None
        self._last_ping = 0.0
        self._last_prune = 0.0
        self._status_error = ""
        self._write_failures: dict[str, str] = {}  # path -> error, as last reported
        self._maintenance_active: Optional[bool] = None  # as last logged

    @property
    def model(self) -> HealthModel:
        """The health model (the pipeline's: a GPU reset replaces it)."""
        return self.pipeline.model

    # --- lifecycle ------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit status."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_signal)
        self._configure()
        self._startup_findings()
        self._decide_now()
        self._write_status()
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
        now = time.monotonic()
        old = self.probes
        self.probes = {}
        for name in self.setup.enabled():
            opts = self.setup.config.probe(name)
            prev = old.pop(name, None)
            if prev is not None and prev.slot.probe is self.setup.probes.get(name):
                self.probes[name] = prev
                continue
            jitter = random.uniform(0.0, min(float(opts["interval"]) * 0.1, 5.0))
            state = ProbeState(name, make_slot(self.setup.probes[name]), now + jitter)
            stored = self.store.kv_get(f"probe.{name}.previous")
            if isinstance(stored, dict):
                state.previous, state.previous_ts = stored.get("snapshot"), stored.get("ts", 0.0)
            self.probes[name] = state
        for name, gone in old.items():
            gone.slot.close()
            self._react(self.pipeline.apply(self.model.forget_probe(name, self.clock())))
        self.reporters = self._make_reporters()
        self.remediator = self._make_remediator()
        self._start_sources()
        self._start_devices()

    def _make_reporters(self) -> list[Reporter]:
        started = start_reporters(self.setup.config.reporters, log.error, self.reporters)
        for reporter in self.reporters:
            if reporter not in started:
                _quietly(reporter.close)
        return started

    def _make_remediator(self) -> Remediator:
        if self.remediator is not None:
            _quietly(self.remediator.close)
        gate = RecoveryGate(self.setup)  # [deep_check] after_recovery (hma.deepcheck.gate)
        remediator = Remediator(self.setup, self.store, self.clock, resume_gate=gate.hold)
        remediator.on_alert = lambda: self.inputs.put(AlertsQueued())
        remediator.set_domain(self.topology()["domain"])
        self.inputs.put(AlertsQueued())  # any queued before on_alert was set
        return remediator

    def _decide_now(self) -> None:
        """Remediation decides on the current verdict at once (after a start or reload the outbox
        and the episode continue from the state store; updates otherwise come only with changes).
        At start this comes after the boot-id check, so a fault that a reboot cleared is never
        acted on again with the new boot id."""
        if self.remediator is not None:
            self.remediator.update(self.model.verdict(self.clock()), self.boot_id)

    def _start_sources(self) -> None:
        self._source_stop.set()
        for thread in self._source_threads:
            thread.join(5.0)
        self._source_stop = StopEvent()
        self._source_threads = []
        for name, source in self.setup.sources.items():
            if not self.setup.config.sources[name]["enabled"]:
                continue
            thread = threading.Thread(
                target=self._source_loop,
                args=(name, source, self._source_stop),
                name=f"source-{name}",
                daemon=True,
            )
            thread.start()
            self._source_threads.append(thread)

    def _source_loop(self, name: str, source: Any, stop: threading.Event) -> None:
        backoff = 1.0
        label = f"source:{name}"
        while not stop.is_set():
            ctx = self.setup.source_context(name, self.boot_id, StoreKV(self.store, f"{label}."))
            ctx.stop = stop
            reason = source.applies(ctx)
            if reason:
                log.info("event source %s does not apply: %s", name, reason)
                return
            self.inputs.put(RunReport(ProbeRun(label, RunStatus.RAN, self.clock(), 0.0)))

            def emit(finding: Finding, _name: str = name) -> None:
                self._read_ahead(finding)
                self.inputs.put(EventFound(finding.with_(probe=finding.probe or _name)))

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
            self.inputs.put(
                RunReport(
                    ProbeRun(
                        label,
                        RunStatus.FAILED,
                        self.clock(),
                        0.0,
                        (finding.with_(probe=label, ts=self.clock()),),
                        error,
                    )
                )
            )
            stop.wait(backoff)
            backoff = min(backoff * 2, 60.0)

    def _start_devices(self) -> None:
        if self.devices is not None:
            self.devices.stop()
        subsystems = {s for n in self.probes for s in self.setup.config.probe(n)["triggers"]}
        self.devices = DeviceWatcher(
            subsystems, lambda sub, action, dev: self.inputs.put(DeviceChanged(sub, action, dev))
        )
        self.devices.start()

    def _teardown(self) -> None:
        self._source_stop.set()
        if self.devices is not None:
            self.devices.stop()
        for state in self.probes.values():
            _quietly(state.slot.close)
        if self.remediator is not None:
            _quietly(self.remediator.close)
        for reporter in self.reporters:
            _quietly(reporter.close)
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
            self._react(applied)
        self._alert(Alert("agent", "", "agent", Severity.OK, f"hma {__version__} started", ts=now))

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopping.is_set():
            timeout = min(self._dispatch_due(), self.status_writer.wait(time.monotonic()))
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

    def _dispatch_due(self) -> float:
        now = time.monotonic()
        wait = self._next_timer(now)
        facts: Optional[NodeFacts] = None
        for state in self.probes.values():
            if state.in_flight:
                continue
            if state.next_due <= now:
                facts = facts or self._facts()
                self._start_run(state, facts)
                state.next_due = now + float(self.setup.config.probe(state.name)["interval"])
            wait = min(wait, max(0.0, state.next_due - now))
        return wait

    def _next_timer(self, mono: float) -> float:
        """Seconds until ``_periodic`` has something to do: the status heartbeat, the watchdog
        ping, a window-cleared fault's expiry, a state write retry, pruning. Everything else
        arrives as a message, so between probe runs the loop sleeps (issue 14)."""
        now = self.clock()
        waits = [
            self.status_writer.last_write + HEARTBEAT_S - mono,
            self._last_prune + PRUNE_EVERY_S - now,
        ]
        if self.notifier.watchdog_s is not None:
            waits.append(self._last_ping + self.notifier.watchdog_s / 4 - mono)
        if self.store.write_error:
            waits.append(RETRY_MIN_S)  # the store backs off by itself; flush says when
        for rec in self.model.records():
            entry = self.model.catalogue.entry(rec.code)
            if entry.clears is Clears.WINDOW:
                waits.append(rec.last_seen + entry.window_s - now)
        return max(0.0, min(waits))

    def _facts(self) -> NodeFacts:
        if self.remediator is not None:
            try:
                facts: NodeFacts = self.remediator.facts()
                return facts
            except Exception as exc:  # noqa: BLE001
                log.warning("facts unavailable: %s", exc)
        return NodeFacts(node_name=self.setup.node_name)

    def _start_run(self, state: ProbeState, facts: NodeFacts) -> None:
        ctx = self.setup.context(state.name, facts=facts, boot_id=self.boot_id)
        ctx.previous, ctx.previous_ts = state.previous, state.previous_ts
        ctx.device_events = state.dispatched_events = state.device_events
        timeout = float(self.setup.config.probe(state.name)["timeout"])
        state.in_flight = True

        def work() -> None:
            try:
                result = run_probe(state.slot, ctx, timeout, self.clock())
            except Exception as exc:  # noqa: BLE001 - defensive: run_probe already contains errors
                result = ProbeRun(state.name, RunStatus.FAILED, self.clock(), 0.0, (), str(exc))
            self.inputs.put(ProbeDone(state, result))

        threading.Thread(target=work, name=f"run-{state.name}", daemon=True).start()

    def _handle(self, message: Message) -> None:
        if isinstance(message, ProbeDone):
            if self._probe_done(message.state, message.run):
                self._observe(message.run)
        elif isinstance(message, RunReport):
            self._observe(message.run)
        elif isinstance(message, EventFound):
            self._event(message.finding)
        elif isinstance(message, DeviceChanged):
            self._device(message)
        elif isinstance(message, SignalReceived):
            self._on_signal_item(message.signum)
        elif isinstance(message, AlertsQueued):
            self._remediation_alerts()

    def _remediation_alerts(self) -> None:
        alerts = self.remediator.alerts() if self.remediator is not None else []
        for alert in alerts:
            self._alert(alert)
        if alerts:
            self._write_status()  # remediation shows at once
        resets = self.remediator.gpu_resets() if self.remediator is not None else []
        for gpu, at in resets:
            self._gpu_reset(gpu, at)

    def _gpu_reset(self, gpu: str, at: float) -> None:
        """A GPU reset succeeded: clear the faults it clears and run the verifying probe now
        (its completed run is the good observation remediation waits for)."""
        log.info("GPU %s was reset: running the %s probe", gpu, VERIFY_PROBE)
        self._react(self.pipeline.gpu_reset(gpu, at, self.clock()), force_status=True)
        state = self.probes.get(VERIFY_PROBE)
        if state is not None:
            state.next_due = min(state.next_due, time.monotonic())

    def _probe_done(self, state: ProbeState, run: ProbeRun) -> bool:
        """Record a finished scheduled run on its probe; False when the probe was reconfigured
        while it ran (the result is dropped)."""
        state.in_flight = False
        if self.probes.get(state.name) is not state:
            return False
        state.last = run
        if (
            run.status is RunStatus.UNSUPPORTED
            and self.setup.probes[state.name].unsupported_stands
            and state.device_events == state.dispatched_events  # none came during the run
        ):
            state.next_due = max(state.next_due, time.monotonic() + UNSUPPORTED_RECHECK_S)
        if run.completed and self.remediator is not None:
            self.remediator.probe_ran(state.name, run.started)
        if run.completed and run.snapshot is not None:
            state.previous, state.previous_ts = run.snapshot, run.started
            self.store.kv_set(
                f"probe.{state.name}.previous", {"ts": run.started, "snapshot": run.snapshot}
            )
            if self.remediator is not None:
                self.remediator.set_domain(self.topology()["domain"])
        return True

    def _observe(self, run: ProbeRun) -> None:
        self._react(self.pipeline.observe_run(run, self.clock()), force_status=True)

    def _device(self, change: DeviceChanged) -> None:
        log.info(
            "device %s %s (%s): running interested probes",
            change.action,
            change.device,
            change.subsystem,
        )
        for state in self.probes.values():
            if change.subsystem in self.setup.config.probe(state.name)["triggers"]:
                state.device_events += 1
                state.next_due = min(state.next_due, time.monotonic() + 0.2)

    def _event(self, finding: Finding) -> None:
        for applied in self.pipeline.event(finding, self.clock()):
            self._react(applied)

    def _on_signal_item(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            log.info("stopping on signal %d", signum)
            self.stopping.set()
        elif signum == signal.SIGHUP:
            self.reload()
        elif signum == signal.SIGUSR1:
            self.process_requests()

    def reload(self) -> None:
        """Re-read the configuration; an invalid one keeps the old configuration and alerts."""
        self.notifier.send(RELOADING="1")
        try:
            new = assembly.load(self.config_file)
            empty = empty_files(new.config.files)
            if empty:  # being rewritten right now, most likely: all defaults is never meant
                raise ConfigError([f"{name}: empty file (half-written?)" for name in empty])
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
            self._decide_now()
            log.info("configuration reloaded")
        self.notifier.send(READY="1", STATUS=self._status_line())

    def process_requests(self) -> None:
        """Apply operator requests queued in the state store (``hma ack``)."""
        for req in self.store.take_requests(self.clock()):
            if req["kind"] == "ack":
                payload = req["payload"]
                self._ack(payload.get("code", ""), payload.get("component"), req["who"])
            elif req["kind"] == maintenance.REQUEST_KIND:  # hma maintenance on|off
                self._set_maintenance(req["payload"], req["who"])
            elif req["kind"] == "reset" and self.remediator is not None:  # hma reset
                payload = req["payload"]
                done = self.remediator.release(
                    payload.get("code"), payload.get("component"), req["who"], payload["reason"]
                )
                self._alert(reset_alert(payload, req["who"], done, self.clock()))
                self._decide_now()
                self._write_status()
            elif req["kind"] == deepcheck_record.REQUEST_KIND:  # hma deep-check results
                for run in deepcheck_record.from_payload(req["payload"]):
                    self._react(self.pipeline.observe_run(run, self.clock()))

    def _set_maintenance(self, payload: Mapping[str, Any], who: str) -> None:
        raw = payload.get("window")  # None: maintenance off
        try:
            window = maintenance.Maintenance.from_json(raw) if raw is not None else None
        except (ValueError, AttributeError) as exc:
            log.error("maintenance request refused: %s", exc)
            return
        maintenance_mode.save(self.store, window, who, self.clock())
        self._watch_maintenance(self.clock())
        self._write_status()

    def _watch_maintenance(self, now: float) -> Optional[maintenance.Maintenance]:
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

    def _ack(self, code: str, component: Optional[str], who: str) -> None:
        self._react(self.pipeline.ack(code, component, who, self.clock()))

    def _periodic(self) -> None:
        now = self.clock()
        self._check_writes(now)
        tick = self.model.tick(now)
        if tick.transitions:
            self._react(self.pipeline.apply(tick))
        mono = time.monotonic()
        heartbeat = mono - self.status_writer.last_write >= HEARTBEAT_S
        if heartbeat or self.status_writer.wait(mono) <= 0:
            self._write_status()
        if now - self._last_prune >= PRUNE_EVERY_S:
            self._last_prune = now
            days = float(self.setup.config.section("agent")["history_days"])
            history.prune(self.store, now - days * 86400)
        if (
            self.notifier.watchdog_s is not None
            and mono - self._last_ping >= self.notifier.watchdog_s / 4
        ):
            self._last_ping = mono
            self.notifier.send(WATCHDOG="1")

    def _check_writes(self, now: float) -> None:
        """Retry queued state writes when due, and raise or clear ``HMA_STATE_WRITE_FAILED``
        (one per path: the state database, status.json) when that changes."""
        self.store.flush()
        errors = {
            str(self.store.path): self.store.write_error,
            str(self.status_path): self._status_error,
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
        self.inputs.put(RunReport(ProbeRun(STATE_PROBE, RunStatus.RAN, now, 0.0, findings)))

    def _read_ahead(self, finding: Finding) -> None:
        """An event that drains at once (critical, fatal): remediation reads the node's state
        now, while the health model and the state store take the event (its drain then needs
        no read of its own). Runs in the source's thread."""
        entry = self.setup.catalogue.get(finding.code)
        remediator = self.remediator
        if entry is None or remediator is None or not (entry.drains and entry.enabled):
            return
        if entry.counted or entry.observe:
            return  # drains only at a count, or never
        severity = finding.severity or entry.severity
        if severity is Severity.CRITICAL and (entry.fatal or entry.fail_after <= 1):
            remediator.read_ahead()

    # --- effects of a verdict -------------------------------------------------------------------

    def _react(self, applied: Applied, force_status: bool = False) -> None:
        """Remediation and status.json after a verdict was applied to the store."""
        verdict, changed = applied.verdict, applied.changed
        if self.remediator is not None and (verdict.transitions or changed):
            try:
                self.remediator.update(verdict, self.boot_id)
            except Exception:  # noqa: BLE001
                log.exception("remediation failed")
        if verdict.transitions or changed or force_status:
            self._write_status()

    def _alert(self, alert: Alert) -> None:
        for reporter in self.reporters:
            try:
                reporter.alert(alert)
            except Exception as exc:  # noqa: BLE001 - a failing reporter never stops the loop
                log.error("reporter %s failed: %s", reporter.name, exc)

    # --- status ---------------------------------------------------------------------------------

    def status_doc(self) -> dict[str, Any]:
        """The status.json document (docs/status.md)."""
        now = self.clock()
        verdict = self.model.verdict(now)
        mono = time.monotonic()
        probes = []
        summaries = {}
        for name, state in sorted(self.probes.items()):
            last = state.last
            summaries[name] = self._summary(name, state)
            probes.append(
                {
                    "name": name,
                    "status": str(last.status) if last else "pending",
                    "last_run": last.started if last else None,
                    "duration_s": round(last.duration_s, 4) if last else None,
                    "next_run": round(now + max(0.0, state.next_due - mono), 1),
                    "error": last.error if last else "",
                    "findings": len(last.findings) if last else 0,
                    "summary": summaries[name],
                }
            )
        window = self._watch_maintenance(now)
        faults = [self.model.fault(r) for r in self.model.records()]
        faults.sort(key=lambda f: (not f.active, -f.severity.rank, f.component, f.code))
        remediation: dict[str, Any] = {}
        if self.remediator is not None:
            try:
                remediation = self.remediator.status()
            except Exception as exc:  # noqa: BLE001
                remediation = {"error": str(exc)}
        return {
            "schema": 1,
            "version": __version__,
            "node": self.setup.node_name,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "boot_id": self.boot_id,
            "started": self.started,
            "generated": now,
            "heartbeat_s": HEARTBEAT_S,
            "severity": str(verdict.severity),
            "action": str(verdict.action),
            "instance_type": self.setup.instance_type(),
            "topology": self.topology(summaries),
            "probes": probes,
            "faults": [f.to_json() for f in faults],
            "remediation": remediation,
            **({"maintenance": window.to_json(now)} if window is not None else {}),
        }

    def topology(self, summaries: Optional[Mapping[str, Any]] = None) -> dict[str, str]:
        """The node's NVLink domain and where it came from (hma.topology.domain)."""
        if summaries is None:
            summaries = {n: self._summary(n, s) for n, s in self.probes.items()}
        configured = self.setup.config.section("topology")["domain"]
        domain, source = topology_domain.resolve(configured, summaries)
        return {"domain": domain, "source": source}

    def _summary(self, name: str, state: ProbeState) -> Any:
        """The probe's digest of its last snapshot (e.g. the EFA mesh matrix), or None."""
        if state.previous is None:
            return None
        try:
            return self.setup.probes[name].summary(state.previous)
        except Exception as exc:  # noqa: BLE001 - a bad summary must not break the status file
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _write_status(self) -> None:
        """Offer a fresh document: written when it changed (at most a few times a second) or
        the heartbeat is due; reporters publish what was written."""
        doc = self.status_doc()
        try:
            if not self.status_writer.offer(doc, time.monotonic()):
                return
            self._status_error = ""
        except OSError as exc:  # reported once, as HMA_STATE_WRITE_FAILED (_check_writes)
            self._status_error = f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # a non-finite number (never JSON)
            log.error("cannot write %s: %s", self.status_path, exc)
        for reporter in self.reporters:
            try:
                reporter.publish(doc)
            except Exception as exc:  # noqa: BLE001
                log.error("reporter %s failed: %s", reporter.name, exc)

    def _status_line(self) -> str:
        verdict = self.model.verdict(self.clock())
        return (
            f"{verdict.severity}: {len(verdict.faults)} active fault(s), {len(self.probes)} probes"
        )


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        log.warning("shutdown step failed: %s", exc)


LOCK_FILE = "hma.lock"
EX_RUNNING = 75  # EX_TEMPFAIL: another `hma run` holds the state folder


class AlreadyRunning(Exception):
    """Another daemon holds the lock of this state folder."""


def hold_lock(state_dir: str) -> Optional[int]:
    """Lock ``state_dir``/hma.lock (flock) for this process's life, writing the pid in it: one
    daemon per state folder. Raises ``AlreadyRunning``; None (logged) when the file cannot be
    opened at all (a failing disk must not stop the agent: the store falls back to memory)."""
    path = os.path.join(state_dir, LOCK_FILE)
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        log.warning(
            "cannot open the lock file %s (%s): not guarding against a second daemon", path, exc
        )
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise AlreadyRunning(
            f"another hma run (pid {holder or '?'}) uses the state folder {state_dir} "
            f"(it holds {path})"
        ) from None
    except OSError as exc:  # a file system without locks: run unguarded, as above
        os.close(fd)
        log.warning("cannot lock %s (%s): not guarding against a second daemon", path, exc)
        return None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:  # a full disk: the lock holds, only the pid in it is missing
        log.warning("cannot write the pid into %s (%s)", path, exc)
    return fd


def main(config_file: Optional[str], log_level: Optional[str] = None) -> int:
    """``hma run``: exit 78 on an invalid configuration (the unit prevents restarts on it), 75
    when another daemon holds the state folder. ``log_level`` (``--log-level``) overrides
    ``[agent] log_level``."""
    logs.configure(log_level or "info")
    try:
        daemon = Daemon(config_file, log_level=log_level or "")
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return EX_CONFIG
    except StateError as exc:
        log.error("state folder unusable: %s", exc)
        return 73  # EX_CANTCREAT
    except AlreadyRunning as exc:
        log.error("%s", exc)
        return EX_RUNNING
    return daemon.run()
