"""When each probe runs: the daemon's probe scheduler.

Each enabled probe has a ``ProbeState``: when it is due next, whether a run is in flight, its last
run and its last snapshot (kept under ``<name>.previous`` in a ``KeyValue``, so a restart compares
with it). ``dispatch`` starts the runs that are due, each in its own thread (hma.detection.runner),
and says how long the caller may sleep; a finished run goes to the ``done`` callback (the daemon
puts it on its loop's queue) and the loop hands it back to ``finish``. Device events (a udev
watcher of the probes' ``triggers``, hma.detection.devices, reporting to ``device`` the same way)
and a GPU reset bring a probe's next run forward.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hma.contracts.model import ProbeRun, RunStatus
from hma.contracts.probe import NodeFacts
from hma.contracts.source import KeyValue
from hma.detection.devices import DeviceWatcher
from hma.detection.runner import make_slot, run_probe
from hma.detection.setup import Setup

log = logging.getLogger("hma")

UNSUPPORTED_RECHECK_S = 3600.0
"""How long an "unsupported" answer of a probe with ``unsupported_stands`` stands without a
device event of its triggers."""
DEVICE_DELAY_S = 0.2  # a device event runs the interested probes this soon


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
    summary: Any = None  # the probe's digest of ``summary_of`` (status.json asks at each write)
    summary_of: Any = None  # the snapshot ``summary`` was made from


class Scheduler:
    """The enabled probes' states: which run is due, starting it, taking its result."""

    def __init__(
        self,
        setup: Setup,
        boot_id: str,
        kv: KeyValue,
        clock: Callable[[], float],
        done: Callable[[ProbeState, ProbeRun], None],
        device: Callable[[str, str, str], None],
    ) -> None:
        """``done(state, run)``: a run finished; ``device(subsystem, action, device)``: a device
        of the probes' triggers came or went (both called in other threads)."""
        self.setup, self.boot_id, self.kv, self.clock, self.done = setup, boot_id, kv, clock, done
        self.device = device
        self.probes: dict[str, ProbeState] = {}
        self.devices: Optional[DeviceWatcher] = None

    def configure(self, setup: Setup) -> list[str]:
        """Take ``setup``'s enabled probes: a probe whose plugin is unchanged keeps its state, a
        new one is first due within a small jitter, with its stored snapshot; returns the probes
        no longer enabled (their slots closed)."""
        self.setup = setup
        now = time.monotonic()
        old, self.probes = self.probes, {}
        for name in setup.enabled():
            prev = old.pop(name, None)
            if prev is not None and prev.slot.probe is setup.probes.get(name):
                self.probes[name] = prev
                continue
            interval = float(setup.config.probe(name)["interval"])
            jitter = random.uniform(0.0, min(interval * 0.1, 5.0))
            state = ProbeState(name, make_slot(setup.probes[name]), now + jitter)
            stored = self.kv.get(f"{name}.previous")
            if isinstance(stored, dict):
                state.previous, state.previous_ts = stored.get("snapshot"), stored.get("ts", 0.0)
            self.probes[name] = state
        for gone in old.values():
            gone.slot.close()
        self.watch_devices()
        return list(old)

    def watch_devices(self) -> None:
        """(Re)start the udev watcher on the subsystems whose events run a probe."""
        self.stop_devices()
        triggers = {s for n in self.probes for s in self.setup.config.probe(n)["triggers"]}
        self.devices = DeviceWatcher(triggers, self.device)
        self.devices.start()

    def stop_devices(self) -> None:
        """Stop the udev watcher."""
        if self.devices is not None:
            self.devices.stop()

    def dispatch(self, facts: Callable[[], NodeFacts]) -> float:
        """Start every run that is due (``facts`` asked once, only when one is); returns the
        seconds until the next one is due (inf without probes)."""
        now = time.monotonic()
        wait = float("inf")
        known: Optional[NodeFacts] = None
        for state in self.probes.values():
            if state.in_flight:
                continue
            if state.next_due <= now:
                known = known or facts()
                self.start(state, known)
                state.next_due = now + float(self.setup.config.probe(state.name)["interval"])
            wait = min(wait, max(0.0, state.next_due - now))
        return wait

    def start(self, state: ProbeState, facts: NodeFacts) -> None:
        """Run ``state``'s probe in a thread of its own; its result goes to ``done``."""
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
            self.done(state, result)

        threading.Thread(target=work, name=f"run-{state.name}", daemon=True).start()

    def finish(self, state: ProbeState, run: ProbeRun) -> bool:
        """Record a finished run on its probe, keeping a completed run's snapshot; False when the
        probe was reconfigured while it ran (the result is dropped)."""
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
        if run.completed and run.snapshot is not None:
            state.previous, state.previous_ts = run.snapshot, run.started
            self.kv.set(f"{state.name}.previous", {"ts": run.started, "snapshot": run.snapshot})
        return True

    def device_changed(self, subsystem: str, action: str, device: str) -> None:
        """A device of ``subsystem`` came or went (``action``): the probes it triggers run soon."""
        log.info("device %s %s (%s): running interested probes", action, device, subsystem)
        for state in self.probes.values():
            if subsystem in self.setup.config.probe(state.name)["triggers"]:
                state.device_events += 1
                state.next_due = min(state.next_due, time.monotonic() + DEVICE_DELAY_S)

    def run_now(self, name: str) -> None:
        """Bring the next run of probe ``name`` (if enabled) forward to now."""
        state = self.probes.get(name)
        if state is not None:
            state.next_due = min(state.next_due, time.monotonic())

    def summaries(self) -> dict[str, Any]:
        """Each probe's digest of its last snapshot (e.g. the EFA mesh matrix), or None; made
        once per snapshot (a summary is a function of the snapshot alone)."""
        return {name: self._summary(name, state) for name, state in self.probes.items()}

    def _summary(self, name: str, state: ProbeState) -> Any:
        if state.previous is None:
            return None
        if state.summary_of is not state.previous:
            state.summary, state.summary_of = self._digest(name, state.previous), state.previous
        return state.summary

    def _digest(self, name: str, snapshot: Any) -> Any:
        try:
            return self.setup.probes[name].summary(snapshot)
        except Exception as exc:  # noqa: BLE001 - a bad summary must not break the status file
            return {"error": f"{type(exc).__name__}: {exc}"}
