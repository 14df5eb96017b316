"""Applying the health model's results to the state store, one way for every caller.

The daemon (``hma run``), ``hma ack`` without a daemon and the healthcheck without a daemon keep
the health model in the state store. All three go through a ``Pipeline``:

- ``start``: the boot-id check (a new boot clears what clears by reboot) and the agent's own
  findings (plugins that failed to load, a state database that was reset);
- each verdict: the changed records saved, each transition written to the history and alerted.

What comes after (remediation, status.json) is the caller's: ``Applied`` says whether records
changed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

from hma.contracts.alert import Alert
from hma.contracts.model import Finding, ProbeRun, Severity
from hma.contracts.reporter import Reporter
from hma.detection.setup import Setup
from hma.health import history, records
from hma.health.model import HealthModel, Transition, Verdict
from hma.health.store import DAMAGE_KEY, Store
from hma.reporters import start_reporters, statusfile

STATE_FILE = "state.db"


@dataclass(frozen=True)
class Applied:
    """A verdict after it was applied; ``changed``: fault records were saved."""

    verdict: Verdict
    changed: bool


def ack_alert(code: str, component: Optional[str], who: str, now: float) -> Alert:
    """The alert that records an acknowledgement."""
    return Alert(
        "acknowledged",
        code,
        component or "node",
        Severity.OK,
        f"{code} acknowledged by {who}",
        details={"who": who},
        ts=now,
    )


def reporter_alerts(setup: Setup, prog: str) -> Callable[[Alert], None]:
    """Alerting for a command that runs without the daemon: through the enabled reporters,
    started at the first alert; their problems go to stderr as ``prog: ...``."""
    reporters: list[Reporter] = []
    started = False

    def complain(fmt: str, *args: object) -> None:
        print(f"{prog}: " + fmt % args, file=sys.stderr)

    def alert(item: Alert) -> None:
        nonlocal started
        if not started:
            started = True
            reporters.extend(start_reporters(setup.config.reporters, complain))
        for reporter in reporters:
            try:
                reporter.alert(item)
            except Exception as exc:  # noqa: BLE001 - what it alerts is already recorded
                complain("reporter %s failed: %s", reporter.name, exc)

    return alert


def open_store(setup: Setup, memory: bool = False) -> Store:
    """The state store in ``[agent] state_dir``; raises ``StateError`` when it cannot be opened."""
    folder = setup.config.section("agent")["state_dir"]
    return Store(os.path.join(folder, STATE_FILE), memory=memory)


def command_pipeline(setup: Setup, store: Store, prog: str) -> Pipeline:
    """The pipeline of a command that runs without the daemon (``hma ack``, the healthcheck,
    deep-check results): this boot's id, alerts through the enabled reporters as ``prog``."""
    boot_id = statusfile.boot_id(setup.config.section("paths")["procfs"])
    return Pipeline(setup, store, boot_id, reporter_alerts(setup, prog))


def _reset_clears(model: HealthModel, code: str) -> bool:
    entry = model.catalogue.get(code)
    return entry is not None and entry.reset_gpu


class Pipeline:
    """The health model loaded from ``store``, and every change to it written back."""

    def __init__(
        self, setup: Setup, store: Store, boot_id: str, alert: Callable[[Alert], None]
    ) -> None:
        found, self.dropped = records.load_records(store)  # dropped: notes on unreadable rows
        occurrences, dropped = records.load_occurrences(store)
        self.dropped += dropped
        self.model = HealthModel(setup.catalogue, boot_id, found, occurrences)
        self.setup, self.store, self.boot_id, self.alert = setup, store, boot_id, alert

    def start(self, now: float) -> list[Applied]:
        """A new boot id and the agent's own findings (broken plugins, a reset database)."""
        out = []
        rebooted = bool(self.boot_id) and records.note_boot(self.store, self.boot_id, now)
        if rebooted and records.boot_count(self.store) > 1:
            out.append(self.apply(self.model.new_boot(self.boot_id, now)))
        findings = list(self.setup.load_findings())
        damage = self.store.kv_get(DAMAGE_KEY)  # by this open or an earlier command's
        if damage:
            findings.append(
                Finding("HMA_STATE_RESET", "agent", f"state database {damage}", {"error": damage})
            )
        for finding in findings:
            out += self.event(finding.with_(probe=finding.probe or "agent"), now)
        if damage:
            self.store.kv_delete(DAMAGE_KEY)
        return out

    def observe_run(self, run: ProbeRun, now: float) -> Applied:
        """A probe run (its findings resolved against the catalogue)."""
        resolved = ProbeRun(
            run.probe,
            run.status,
            run.started,
            run.duration_s,
            tuple(self.model.catalogue.resolve_all(run.findings)),
            run.error,
        )
        return self.apply(self.model.observe_run(resolved, now))

    def event(self, finding: Finding, now: float) -> list[Applied]:
        """A finding outside a probe run (event sources, the agent's own)."""
        found = self.model.catalogue.resolve_all([finding.with_(ts=finding.ts or now)])
        return [self.apply(self.model.observe_event(f, now)) for f in found]

    def ack(self, code: str, component: Optional[str], who: str, now: float) -> Applied:
        """An operator's acknowledgement, recorded and alerted, then its clears."""
        verdict = self.model.ack(code, component, now, who)
        history.add(self.store, now, "acknowledged", code, component or "", "", "", who=who)
        self.alert(ack_alert(code, component, who, now))
        return self.apply(verdict)

    def gpu_reset(self, component: str, at: float, now: float) -> Applied:
        """A GPU reset of ``component`` ended at ``at``: its faults that a reset clears (the
        catalogue's ``reset_gpu``) and that were last seen before it go, with a ``cleared``
        transition each. The GPU's probe then says whether it is healthy again."""
        old = self.model
        gone = [
            r
            for r in old.records()
            if r.component == component and r.last_seen <= at and _reset_clears(old, r.code)
        ]
        if not gone:
            return Applied(old.verdict(now), False)
        keys = {(r.component, r.code) for r in gone}
        kept = [r for r in old.records() if (r.component, r.code) not in keys]
        self.model = HealthModel(old.catalogue, old.boot_id, kept, old.occurrences())
        self.model.changed.update(keys | old.changed)
        self.model.changed_occurrences.update(old.changed_occurrences)
        transitions = [
            Transition("cleared", old.fault(r), now, "GPU reset") for r in gone if r.active
        ]
        return self.apply(self.model.verdict(now, transitions))

    def apply(self, verdict: Verdict) -> Applied:
        """Save the records the model changed; history and an alert per transition."""
        changed = sorted(self.model.changed)
        self.model.changed.clear()
        if changed:
            present = {(r.component, r.code): r for r in self.model.records()}
            records.save_records(self.store, changed, present)
        counted = sorted(self.model.changed_occurrences)
        self.model.changed_occurrences.clear()
        if counted:
            records.save_occurrences(self.store, counted, self.model.occurrences())
        for transition in verdict.transitions:
            self._transition(transition)
        return Applied(verdict, bool(changed))

    def _transition(self, t: Transition) -> None:
        f = t.fault
        severity = Severity.OK if t.kind == "cleared" else f.severity
        reason = f" ({t.reason})" if t.reason else ""
        would = f"observe mode, would {f.would}: " if f.would and t.kind != "cleared" else ""
        message = f"{t.kind}: {f.code} {f.component}: {would}{f.message}{reason}"
        details = dict(f.details)
        history.add(
            self.store, t.ts, t.kind, f.code, f.component, str(f.severity), message, details
        )
        self.alert(
            Alert(
                t.kind,
                f.code,
                f.component,
                severity,
                would + f.message + reason,  # reporters add kind/code
                f.action,
                f.probe,
                details,
                t.ts,
                mode="observe" if f.observe else "",
                would=f.would if t.kind != "cleared" else "",
            )
        )
