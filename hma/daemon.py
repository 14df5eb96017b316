"""``hma run``: the agent's main loop.

One thread owns the health model: it takes probe results, event findings, device events and
signals from a queue, so every input is processed when it arrives (not at the next poll) and the
status file, the state store, reporters and remediation see each change at once. Probe runs
happen in their own threads or worker processes (hma.runner); a stuck probe never delays the loop
or the watchdog, which is pinged only from the loop itself.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hma import __version__, assembly
from hma.ack import ack_alert
from hma.adapters.notify import Notifier
from hma.check import resolve
from hma.config import EX_CONFIG, ConfigError
from hma.devices import DeviceWatcher
from hma.health import HealthModel
from hma.model import Finding, ProbeRun, RunStatus, Severity, Transition, Verdict
from hma.probe import NodeFacts
from hma.remediation import Remediator
from hma.reporters import Alert, Reporter, start_reporters
from hma.runner import make_slot, run_probe
from hma.state import StateError, Store
from hma.status import StatusWriter, boot_id, status_path

log = logging.getLogger("hma")

HEARTBEAT_S = 15.0
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


@dataclass
class _Inputs:
    """The loop's input queue with helpers for each kind of item."""

    q: queue.Queue = field(default_factory=queue.Queue)

    def put(self, kind: str, *payload: Any) -> None:
        self.q.put((kind, *payload))


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
    ) -> None:
        self.config_file = config_file
        self.notifier = notifier or Notifier()
        self.clock = clock
        self.inputs = _Inputs()
        self.stopping = threading.Event()
        self.setup = assembly.load(config_file)  # ConfigError propagates: exit 78
        agent = self.setup.config.section("agent")
        self.store = Store(os.path.join(agent["state_dir"], "state.db"))
        self.status_path = status_path(agent["run_dir"])
        self.status_writer = StatusWriter(self.status_path, HEARTBEAT_S)
        self.boot_id = boot_id(self.setup.config.section("paths")["procfs"])
        records, dropped = self.store.load_records()
        for note in dropped:
            log.warning("dropped unreadable state row: %s", note)
        self.model = HealthModel(self.setup.catalogue, self.boot_id, records)
        self.started = self.clock()
        self.probes: dict[str, ProbeState] = {}
        self.reporters: list[Reporter] = []
        self.remediator: Optional[Remediator] = None
        self._source_stop = threading.Event()
        self._source_threads: list[threading.Thread] = []
        self.devices: Optional[DeviceWatcher] = None
        self._last_ping = 0.0
        self._last_prune = 0.0

    # --- lifecycle ------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit status."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_signal)
        self._configure()
        self._startup_findings()
        self._write_status()
        self.notifier.send(READY="1", STATUS=self._status_line())
        try:
            self._loop()
        finally:
            self.notifier.send(STOPPING="1")
            self._teardown()
        return 0

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.inputs.put("signal", signum)

    def _configure(self) -> None:
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
            self._apply(self.model.forget_probe(name, self.clock()))
        self.reporters = self._make_reporters()
        self.remediator = self._make_remediator()
        self._start_sources()
        self._start_devices()

    def _make_reporters(self) -> list[Reporter]:
        for reporter in self.reporters:
            _quietly(reporter.close)
        return start_reporters(self.setup.config.reporters, log.error)

    def _make_remediator(self) -> Remediator:
        if self.remediator is not None:
            _quietly(self.remediator.close)
        remediator = Remediator(self.setup, self.store, self.clock)
        # decide on the current verdict at once (after a restart or reload the outbox and the
        # episode continue from the state store; updates otherwise come only with changes)
        remediator.update(self.model.verdict(self.clock()), self.boot_id)
        return remediator

    def _start_sources(self) -> None:
        self._source_stop.set()
        for thread in self._source_threads:
            thread.join(5.0)
        self._source_stop = threading.Event()
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
            self.inputs.put("run", ProbeRun(label, RunStatus.RAN, self.clock(), 0.0))

            def emit(finding: Finding, _name: str = name) -> None:
                self.inputs.put("event", finding.with_(probe=finding.probe or _name))

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
                "run",
                ProbeRun(
                    label,
                    RunStatus.FAILED,
                    self.clock(),
                    0.0,
                    (finding.with_(probe=label, ts=self.clock()),),
                    error,
                ),
            )
            stop.wait(backoff)
            backoff = min(backoff * 2, 60.0)

    def _start_devices(self) -> None:
        if self.devices is not None:
            self.devices.stop()
        subsystems = {s for n in self.probes for s in self.setup.config.probe(n)["triggers"]}
        self.devices = DeviceWatcher(
            subsystems, lambda sub, action, dev: self.inputs.put("device", sub, action, dev)
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
        self.store.close()

    def _startup_findings(self) -> None:
        now = self.clock()
        if self.boot_id and self.store.note_boot(self.boot_id, now) and self.store.boot_count() > 1:
            self._apply(self.model.new_boot(self.boot_id, now))
        extra = list(self.setup.load_findings())
        if self.store.reset_reason:
            extra.append(
                Finding(
                    "HMA_STATE_RESET",
                    "agent",
                    "state database was reset: " f"{self.store.reset_reason}",
                    {"error": self.store.reset_reason},
                )
            )
        for finding in extra:
            self._event(finding.with_(probe=finding.probe or "agent"))
        self._alert(Alert("agent", "", "agent", Severity.OK, f"hma {__version__} started", ts=now))

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopping.is_set():
            timeout = min(self._dispatch_due(), self.status_writer.wait(time.monotonic()))
            try:
                item = self.inputs.q.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is not None:
                try:
                    self._handle(item)
                except Exception:  # noqa: BLE001 - one bad input must not kill the daemon
                    log.exception("failed to process %s", item[0])
            self._periodic()

    def _dispatch_due(self) -> float:
        now = time.monotonic()
        wait = 1.0 if self.notifier.watchdog_s is None else min(1.0, self.notifier.watchdog_s / 4)
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
        ctx.device_events = state.device_events
        timeout = float(self.setup.config.probe(state.name)["timeout"])
        state.in_flight = True

        def work() -> None:
            try:
                result = run_probe(state.slot, ctx, timeout, self.clock())
            except Exception as exc:  # noqa: BLE001 - defensive: run_probe already contains errors
                result = ProbeRun(state.name, RunStatus.FAILED, self.clock(), 0.0, (), str(exc))
            self.inputs.put("run", result, state)

        threading.Thread(target=work, name=f"run-{state.name}", daemon=True).start()

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        now = self.clock()
        if kind == "run":
            run: ProbeRun = item[1]
            if len(item) > 2:
                state: ProbeState = item[2]
                state.in_flight = False
                if self.probes.get(state.name) is not state:
                    return  # the probe was reconfigured while it ran
                state.last = run
                if run.completed and run.snapshot is not None:
                    state.previous, state.previous_ts = run.snapshot, run.started
                    self.store.kv_set(
                        f"probe.{state.name}.previous",
                        {"ts": run.started, "snapshot": run.snapshot},
                    )
            resolved = ProbeRun(
                run.probe,
                run.status,
                run.started,
                run.duration_s,
                tuple(resolve(run.findings, self.setup.catalogue)),
                run.error,
            )
            self._apply(self.model.observe_run(resolved, now), force_status=True)
        elif kind == "event":
            self._event(item[1])
        elif kind == "device":
            _kind, subsystem, action, device = item
            log.info("device %s %s (%s): running interested probes", action, device, subsystem)
            for state in self.probes.values():
                if subsystem in self.setup.config.probe(state.name)["triggers"]:
                    state.device_events += 1
                    state.next_due = min(state.next_due, time.monotonic() + 0.2)
        elif kind == "signal":
            self._on_signal_item(item[1])

    def _event(self, finding: Finding) -> None:
        now = self.clock()
        for resolved in resolve([finding.with_(ts=finding.ts or now)], self.setup.catalogue):
            self._apply(self.model.observe_event(resolved, now))

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
            self.setup = new
            self.model.catalogue = new.catalogue
            self._configure()
            log.info("configuration reloaded")
        self.notifier.send(READY="1", STATUS=self._status_line())

    def process_requests(self) -> None:
        """Apply operator requests queued in the state store (``hma ack``)."""
        for req in self.store.take_requests(self.clock()):
            if req["kind"] == "ack":
                payload = req["payload"]
                self._ack(payload.get("code", ""), payload.get("component"), req["who"])

    def _ack(self, code: str, component: Optional[str], who: str) -> None:
        now = self.clock()
        verdict = self.model.ack(code, component, now, who)
        self.store.add_history(now, "acknowledged", code, component or "", "", "", who=who)
        self._alert(ack_alert(code, component, who, now))
        self._apply(verdict)

    def _periodic(self) -> None:
        now = self.clock()
        tick = self.model.tick(now)
        if tick.transitions:
            self._apply(tick)
        acted = False
        if self.remediator is not None:
            for alert in self.remediator.alerts():
                self._alert(alert)
                acted = True
        mono = time.monotonic()
        heartbeat = mono - self.status_writer.last_write >= HEARTBEAT_S
        if acted or heartbeat or self.status_writer.wait(mono) <= 0:  # remediation shows at once
            self._write_status()
        if now - self._last_prune >= PRUNE_EVERY_S:
            self._last_prune = now
            days = float(self.setup.config.section("agent")["history_days"])
            self.store.prune_history(now - days * 86400)
        if (
            self.notifier.watchdog_s is not None
            and mono - self._last_ping >= self.notifier.watchdog_s / 4
        ):
            self._last_ping = mono
            self.notifier.send(WATCHDOG="1")

    # --- effects of a verdict -------------------------------------------------------------------

    def _apply(self, verdict: Verdict, force_status: bool = False) -> None:
        changed = sorted(self.model.changed)
        self.model.changed.clear()
        if changed:
            present = {(r.component, r.code): r for r in self.model.records()}
            self.store.save_records(changed, present)
        for transition in verdict.transitions:
            self._transition(transition)
        if self.remediator is not None and (verdict.transitions or changed):
            try:
                self.remediator.update(verdict, self.boot_id)
            except Exception:  # noqa: BLE001
                log.exception("remediation failed")
        if verdict.transitions or changed or force_status:
            self._write_status()

    def _transition(self, t: Transition) -> None:
        f = t.fault
        severity = Severity.OK if t.kind == "cleared" else f.severity
        message = f"{t.kind}: {f.code} {f.component}: {f.message}"
        if t.reason:
            message += f" ({t.reason})"
        self.store.add_history(
            t.ts, t.kind, f.code, f.component, str(f.severity), message, dict(f.details)
        )
        self._alert(
            Alert(
                t.kind,
                f.code,
                f.component,
                severity,
                f.message + (f" ({t.reason})" if t.reason else ""),  # reporters add kind/code
                f.action,
                f.probe,
                dict(f.details),
                t.ts,
            )
        )

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
        for name, state in sorted(self.probes.items()):
            last = state.last
            probes.append(
                {
                    "name": name,
                    "status": str(last.status) if last else "pending",
                    "last_run": last.started if last else None,
                    "duration_s": round(last.duration_s, 4) if last else None,
                    "next_run": round(now + max(0.0, state.next_due - mono), 1),
                    "error": last.error if last else "",
                    "findings": len(last.findings) if last else 0,
                    "summary": self._summary(name, state),
                }
            )
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
            "probes": probes,
            "faults": [f.to_json() for f in faults],
            "remediation": remediation,
        }

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
        except OSError as exc:
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


def main(config_file: Optional[str]) -> int:
    """``hma run``: exit 78 on an invalid configuration (the unit prevents restarts on it)."""
    logging.basicConfig(level=logging.INFO, format="hma: %(levelname)s %(message)s")
    try:
        daemon = Daemon(config_file)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return EX_CONFIG
    except StateError as exc:
        log.error("state folder unusable: %s", exc)
        return 73  # EX_CANTCREAT
    return daemon.run()
