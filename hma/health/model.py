"""The health model: pure. Inputs in (probe runs, events, boots, time, acks), verdicts out.

Per (component, code) it keeps a record with hysteresis: a fault becomes active after the code's
``fail_after`` consecutive bad observations (at once for ``fatal`` codes) and clears after
``clear_after`` consecutive good ones, when the code clears by observation. Only a completed probe
run is a good observation of what it did not report; an ``unknown`` finding neither raises nor
clears a fault that is already known. Other codes clear by reboot (new boot id), by an operator
(``ack``) or after their window without a repeat. No I/O and no clock: callers pass ``now``.

A counted code (``after`` = N > 1, ``within`` = T) keeps its occurrences (each event, each probe
run that reports it) per component, or per node with ``per = "node"``: below N within T it is an
active *watching* fault at most a warning, without action, that also clears when it has not
recurred for T; at N it is promoted to its severity and action. One event that two sources report
(NVML and the kernel log) within ``MERGE_S`` is one occurrence. A code in observe mode is decided
as usual, but its fault is shown at most as a warning without action, with ``would`` saying what
act mode would do (``drain``, ``reboot``, ``replace``): nothing downstream can act on it.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Iterable, Mapping, Optional

from hma.contracts.catalogue import Catalogue, Entry, below, seconds_text
from hma.contracts.model import Action, Clears, Finding, ProbeRun, Severity
from hma.contracts.severity import worst

MERGE_S = 10.0  # one event reported by two sources within this many seconds is one occurrence

# One occurrence of a counted code: (time, component, source that reported it).
Occurrence = tuple[float, str, str]


@dataclass(frozen=True)
class Fault:
    """A (component, code) the health model tracks, with its resolved catalogue facts."""

    code: str
    component: str
    severity: Severity
    action: Action
    message: str
    details: Mapping[str, Any]
    probe: str
    first_seen: float
    last_seen: float
    count: int  # observations (or event repeats) while active
    drains: bool  # the catalogue says this code drains (hardware fault)
    clears: Clears
    active: bool  # False while still below fail_after (pending)
    observe: bool = False  # the code is in observe mode: shown, never acted on
    would: str = ""  # observe mode: what act mode would do (drain, reboot, replace), else ""
    # counted codes: after, within (s), per, occurrences (in the window), reached
    threshold: Optional[Mapping[str, Any]] = None

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the fault: (component, code)."""
        return (self.component, self.code)

    def to_json(self) -> dict[str, Any]:
        """The fault as in status.json ``faults`` (docs/status.md)."""
        return {
            "code": self.code,
            "component": self.component,
            "severity": str(self.severity),
            "action": str(self.action),
            "message": self.message,
            "details": dict(self.details),
            "probe": self.probe,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "count": self.count,
            "drains": self.drains,
            "clears": str(self.clears),
            "active": self.active,
            **({"observe": True, "would": self.would} if self.observe else {}),
            **({"threshold": dict(self.threshold)} if self.threshold is not None else {}),
        }

    @property
    def draining(self) -> bool:
        """Whether this fault takes the node out of scheduling (active, critical, drains, and
        not in observe mode)."""
        return (
            self.active and self.drains and self.severity is Severity.CRITICAL and not self.observe
        )


@dataclass(frozen=True)
class Transition:
    """A state change worth one alert: ``raised``, ``escalated`` or ``cleared``."""

    kind: str
    fault: Fault
    ts: float
    reason: str = ""


@dataclass(frozen=True)
class Verdict:
    """The node's health after the latest input: what remediation and reporters consume."""

    ts: float
    boot_id: str
    faults: tuple[Fault, ...]  # active faults only
    transitions: tuple[Transition, ...] = ()

    @property
    def severity(self) -> Severity:
        """Worst severity of the active faults."""
        return worst(f.severity for f in self.faults)

    @property
    def draining(self) -> tuple[Fault, ...]:
        """Active faults that take the node out of scheduling."""
        return tuple(f for f in self.faults if f.draining)

    @property
    def action(self) -> Action:
        """Strongest recommended action of the draining faults."""
        return max((f.action for f in self.draining), default=Action.NONE)


@dataclass
class Record:
    """Mutable state of one (component, code); persisted by the state store as JSON."""

    code: str
    component: str
    probe: str
    severity: str
    action: str
    message: str
    details: dict[str, Any]
    first_seen: float
    last_seen: float
    count: int = 0
    bad: int = 0
    good: int = 0
    active: bool = False
    boot_id: str = ""
    watching: bool = False  # a counted code, active below its threshold (shown as a warning)

    def to_json(self) -> dict[str, Any]:
        """JSON form for the state store."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        """Inverse of ``to_json`` (fields added later take their defaults); raises
        KeyError/TypeError/ValueError on malformed data."""
        values = {}
        for f in fields(cls):
            if f.name in data:
                values[f.name] = data[f.name]
            elif f.default is MISSING:
                raise KeyError(f.name)
        rec = cls(**values)
        Severity.parse(rec.severity)
        Action.parse(rec.action)
        return rec


class HealthModel:
    """Per-component fault state of one node."""

    def __init__(
        self,
        catalogue: Catalogue,
        boot_id: str,
        records: Iterable[Record] = (),
        occurrences: Optional[Mapping[tuple[str, str], Iterable[Occurrence]]] = None,
    ) -> None:
        self.catalogue = catalogue
        self.boot_id = boot_id
        self._records: dict[tuple[str, str], Record] = {(r.component, r.code): r for r in records}
        self.changed: set[tuple[str, str]] = set()  # keys touched since the caller last reset it
        # counted codes: (scope, code) -> occurrences within the code's window, oldest first;
        # scope is the component, or "node" for codes counted per node
        self._occurrences: dict[tuple[str, str], list[Occurrence]] = {
            key: list(items) for key, items in (occurrences or {}).items()
        }
        self.changed_occurrences: set[tuple[str, str]] = set()  # same, for occurrences

    # --- inputs ---------------------------------------------------------------------------------

    def observe_run(self, run: ProbeRun, now: float) -> Verdict:
        """A finished probe run (findings already resolved through the catalogue)."""
        transitions: list[Transition] = []
        seen = set()
        for finding in run.findings:
            seen.add((finding.component, finding.code))
            transitions += self._bad(finding, now)
        if run.completed:
            for key, rec in list(self._records.items()):
                if rec.probe == run.probe and key not in seen:
                    transitions += self._good(key, rec, now)
        return self.verdict(now, transitions)

    def observe_event(self, finding: Finding, now: float) -> Verdict:
        """A finding pushed by an event source (kernel log, NVML events); one of severity ``ok``
        (a kernel line saying the fault is over: NFS server OK) clears (component, code)."""
        if finding.severity is Severity.OK:
            key = (finding.component, finding.code)
            rec = self._records.get(key)
            if rec is None:
                return self.verdict(now)
            return self.verdict(now, self._clear(key, rec, now, finding.message or "reported ok"))
        return self.verdict(now, self._bad(finding, now))

    def new_boot(self, boot_id: str, now: float) -> Verdict:
        """The node booted: faults that clear by reboot and were seen in another boot go."""
        self.boot_id = boot_id
        transitions = []
        for key, rec in list(self._records.items()):
            if self._entry(rec).clears is Clears.REBOOT and rec.boot_id != boot_id:
                transitions += self._clear(key, rec, now, "reboot")
        return self.verdict(now, transitions)

    def tick(self, now: float) -> Verdict:
        """Time passed: window-cleared faults and watching faults without a repeat go, and
        occurrences older than their code's window are forgotten."""
        transitions = []
        for key, rec in list(self._records.items()):
            entry = self._entry(rec)
            if rec.watching and entry.counted and now - rec.last_seen >= entry.watch_s:
                why = f"no repeat for {seconds_text(entry.watch_s)}"
                transitions += self._clear(key, rec, now, why)
            elif entry.clears is Clears.WINDOW and now - rec.last_seen >= entry.window_s:
                transitions += self._clear(key, rec, now, f"no repeat for {entry.window_s:g} s")
        for key, items in list(self._occurrences.items()):
            within = self.catalogue.entry(key[1]).within
            kept = [o for o in items if _recent(o, now, within)]
            if len(kept) != len(items):
                self._set_occurrences(key, kept)
        return self.verdict(now, transitions)

    def ack(self, code: str, component: Optional[str], now: float, who: str = "") -> Verdict:
        """Operator acknowledgement: clears matching faults that clear by operator."""
        transitions = []
        for key, rec in list(self._records.items()):
            if rec.code == code and (component is None or rec.component == component):
                if self._entry(rec).clears is Clears.OPERATOR:
                    transitions += self._clear(
                        key, rec, now, f"acknowledged by {who or 'operator'}"
                    )
        return self.verdict(now, transitions)

    def forget_probe(self, probe: str, now: float) -> Verdict:
        """A probe was disabled: its observation-cleared records can no longer clear; drop them."""
        transitions = []
        for key, rec in list(self._records.items()):
            if rec.probe == probe and self._entry(rec).clears is Clears.OBSERVATION:
                transitions += self._clear(key, rec, now, f"probe {probe} disabled")
        return self.verdict(now, transitions)

    # --- outputs --------------------------------------------------------------------------------

    def records(self) -> list[Record]:
        """All tracked records (active and pending)."""
        return list(self._records.values())

    def record(self, key: tuple[str, str]) -> Optional[Record]:
        """The record of (component, code), if tracked."""
        return self._records.get(key)

    def occurrences(self) -> dict[tuple[str, str], list[Occurrence]]:
        """Occurrences of counted codes by (scope, code), for the state store."""
        return {key: list(items) for key, items in self._occurrences.items()}

    def verdict(self, now: float, transitions: Iterable[Transition] = ()) -> Verdict:
        """The current verdict, carrying the given transitions."""
        faults = tuple(
            sorted(
                (self.fault(r) for r in self._records.values() if r.active),
                key=lambda f: (-f.severity.rank, f.component, f.code),
            )
        )
        return Verdict(now, self.boot_id, faults, tuple(transitions))

    def fault(self, rec: Record) -> Fault:
        """Immutable view of a record (observe mode: shown as at most a warning, no action)."""
        entry = self._entry(rec)
        severity, action = Severity.parse(rec.severity), Action.parse(rec.action)
        would = ""
        if entry.observe:
            if rec.active and entry.drains and severity is Severity.CRITICAL:
                would = str(action) if action is not Action.NONE else "drain"
            severity = Severity.WARNING if severity is Severity.CRITICAL else severity
            action = Action.NONE
        threshold = None
        if entry.counted:
            scope = "node" if entry.per == "node" else rec.component
            threshold = {
                "after": entry.after,
                "within": entry.within,
                "per": entry.per,
                "occurrences": len(self._occurrences.get((scope, rec.code), ())),
                "reached": rec.active and not rec.watching,
            }
        return Fault(
            code=rec.code,
            component=rec.component,
            severity=severity,
            action=action,
            message=rec.message,
            details=dict(rec.details),
            probe=rec.probe,
            first_seen=rec.first_seen,
            last_seen=rec.last_seen,
            count=rec.count,
            drains=entry.drains,
            clears=entry.clears,
            active=rec.active,
            observe=entry.observe,
            would=would,
            threshold=threshold,
        )

    # --- internals ------------------------------------------------------------------------------

    def _entry(self, rec: Record) -> Any:
        return self.catalogue.entry(rec.code)

    def _bad(self, finding: Finding, now: float) -> list[Transition]:
        key = (finding.component, finding.code)
        entry = self.catalogue.entry(finding.code)
        severity = finding.severity or entry.severity
        action = finding.action if finding.action is not None else entry.action
        rec = self._records.get(key)
        if severity is Severity.UNKNOWN and rec is not None and rec.severity != "unknown":
            return []  # could not measure: a known fault neither grows nor clears
        counted = entry.counted and severity is not Severity.UNKNOWN
        seen = self._occur(entry, finding, now) if counted else 0
        if rec is None:
            rec = Record(
                finding.code,
                finding.component,
                finding.probe,
                str(severity),
                str(action),
                finding.message,
                dict(finding.details),
                now,
                now,
                boot_id=self.boot_id,
            )
            self._records[key] = rec
        self.changed.add(key)
        rec.bad += 1
        rec.good = 0
        rec.last_seen = now
        rec.boot_id = self.boot_id
        rec.message = finding.message
        rec.details = dict(finding.details)
        rec.probe = finding.probe or rec.probe
        if counted:
            return self._counted(rec, entry, severity, action, seen, now)
        if not rec.active:
            rec.severity, rec.action = str(severity), str(action)
            threshold = 1 if entry.fatal or severity is Severity.UNKNOWN else entry.fail_after
            if rec.bad >= threshold:
                rec.active = True
                rec.count = 1
                rec.first_seen = now
                return [Transition("raised", self.fault(rec), now)]
            return []
        rec.count += 1
        old_sev, old_act = Severity.parse(rec.severity), Action.parse(rec.action)
        if severity.rank > old_sev.rank or action > old_act:
            rec.severity = str(severity if severity.rank > old_sev.rank else old_sev)
            rec.action = str(max(action, old_act))
            return [Transition("escalated", self.fault(rec), now)]
        return []

    def _occur(self, entry: Entry, finding: Finding, now: float) -> int:
        """Note one occurrence of a counted code; how many its scope has within the window."""
        scope = "node" if entry.per == "node" else finding.component
        key = (scope, finding.code)
        kept = [o for o in self._occurrences.get(key, ()) if _recent(o, now, entry.within)]
        last = next((o for o in reversed(kept) if o[1] == finding.component), None)
        if last is None or last[2] == finding.probe or now - last[0] >= MERGE_S:
            kept.append((now, finding.component, finding.probe))
        self._set_occurrences(key, kept[-entry.after :])  # only whether N is reached matters
        return len(kept)

    def _set_occurrences(self, key: tuple[str, str], items: list[Occurrence]) -> None:
        if items:
            self._occurrences[key] = items
        else:
            self._occurrences.pop(key, None)
        self.changed_occurrences.add(key)

    def _counted(
        self,
        rec: Record,
        entry: Entry,
        severity: Severity,
        action: Action,
        seen: int,
        now: float,
    ) -> list[Transition]:
        """A counted code's record after an occurrence (``seen`` of ``after`` in the window)."""
        reached = seen >= entry.after
        shown = (severity, action) if reached else below(severity)
        words = f"{min(seen, entry.after)} of {entry.threshold_text()}"
        if not rec.active or rec.severity == "unknown":
            fresh = not rec.active
            rec.active, rec.watching = True, not reached
            rec.severity, rec.action = str(shown[0]), str(shown[1])
            if fresh:
                rec.count, rec.first_seen = 1, now
                return [Transition("raised", self.fault(rec), now, words)]
            return [Transition("escalated", self.fault(rec), now, words)] if reached else []
        rec.count += 1
        old_sev, old_act = Severity.parse(rec.severity), Action.parse(rec.action)
        if rec.watching and not reached:
            return []
        rec.watching = False
        if shown[0].rank > old_sev.rank or shown[1] > old_act:
            rec.severity = str(shown[0] if shown[0].rank > old_sev.rank else old_sev)
            rec.action = str(max(shown[1], old_act))
            return [Transition("escalated", self.fault(rec), now, words)]
        return []

    def _good(self, key: tuple[str, str], rec: Record, now: float) -> list[Transition]:
        self.changed.add(key)
        rec.bad = 0
        rec.good += 1
        entry = self._entry(rec)
        if not rec.active:
            del self._records[key]
            return []
        if entry.clears is Clears.OBSERVATION and rec.good >= entry.clear_after:
            return self._clear(key, rec, now, f"{rec.good} good observations")
        return []

    def _clear(self, key: tuple[str, str], rec: Record, now: float, why: str) -> list[Transition]:
        self.changed.add(key)
        del self._records[key]
        if not rec.active:
            return []
        return [Transition("cleared", self.fault(rec), now, why)]


def listed(model: HealthModel) -> list[Fault]:
    """Every record ``model`` tracks as a fault, in the order status.json lists them: active
    first, then worst severity first, by component and code."""
    return sorted(
        (model.fault(r) for r in model.records()),
        key=lambda f: (not f.active, -f.severity.rank, f.component, f.code),
    )


def _recent(item: Occurrence, now: float, within: float) -> bool:
    """Whether an occurrence lies in the window ending ``now`` (one dated later than ``now``, as
    a damaged store or a clock set back would give, is not counted)."""
    return 0.0 <= now - item[0] < within
