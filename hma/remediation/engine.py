"""The remediation engine: verdicts in, cluster actions out, through a persistent outbox.

It only wires the parts: ``update()`` (called by the daemon after every change) asks the pure
planner (``planner.plan``) what to do and writes its intents to the outbox (``outbox``), which
takes milliseconds. A worker thread applies due actions in order through the cluster backend
(``actions.Applier``, behind the circuit breaker of ``breaker``) and records their outcome,
retrying failures with backoff (a failing scontrol takes about 9 s while slurmctld is
unreachable). A second thread refreshes the node facts (state, jobs) that probes and decisions
use. See docs/remediation.md.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from hma.config.schema import Config, ConfigError
from hma.contracts.alert import Alert
from hma.contracts.cluster import GROUP, Backend, BackendError, NodeState, RequeuesJobs
from hma.contracts.model import Action, Severity
from hma.contracts.probe import NodeFacts
from hma.detection.registry import discover
from hma.detection.setup import Setup
from hma.health import history, maintenance_mode
from hma.health.model import Verdict
from hma.health.store import Store
from hma.remediation import options as options_mod
from hma.remediation.actions import Applier, describe
from hma.remediation.breaker import Breaker
from hma.remediation.outbox import OPEN, Outbox, Row, backoff
from hma.remediation.planner import (
    VERIFY_PROBE,
    Cancel,
    Enqueue,
    Episode,
    Policy,
    Situation,
    plan,
    remediation_count,
)
from hma.remediation.requeue import AutoResume
from hma.topology import domain as topology_domain

log = logging.getLogger("hma.remediation")

MAX_ROWS_SHOWN = 20


def make_backend(config: Config) -> Backend:
    """The backend ``[cluster] backend`` names (entry point group ``hma.backends``),
    configured from its own section; ``ConfigError`` when it cannot be loaded."""
    name = str(config.section("cluster")["backend"])
    classes, broken = discover(GROUP, Backend, [name])
    if name not in classes:
        why = next((b.error for b in broken if b.name == name), "not installed")
        raise ConfigError([f"cluster.backend: {name!r}: {why}"])
    return classes[name](config.section(name), str(config.section("recovery")["label_field"]))


def reset_alert(request: dict[str, Any], who: str, done: dict[str, Any], now: float) -> Alert:
    """The alert that records an ``hma reset`` (``request``: its code, component, reason;
    ``done``: what ``Remediator.release`` did)."""
    code, component = request.get("code") or "", request.get("component") or "node"
    what = f"{code} on {component}" if code else "all"
    held = "; released from the hold for a human" if done.get("released") else ""
    return Alert(
        "acknowledged",
        code,
        component,
        Severity.OK,
        f"remediation history ({what}) reset by {who}: {request.get('reason', '')}"
        f" ({done.get('cleared', 0)} remediation(s), {done.get('reboots_cleared', 0)} reboot(s)"
        f" cleared{held})",
        probe="remediation",
        details={"who": who, "reason": request.get("reason", ""), "reset": done},
        ts=now,
    )


def reset_codes(setup: Setup) -> frozenset[str]:
    """The catalogue's codes a GPU reset may clear (``reset_gpu = true``)."""
    return frozenset(e.code for e in setup.catalogue if e.reset_gpu)


def scheduler_codes(setup: Setup) -> frozenset[str]:
    """The catalogue's codes of drains the scheduler made itself (``scheduler = true``)."""
    return frozenset(e.code for e in setup.catalogue if e.scheduler)


@dataclass(frozen=True)
class Known:
    """What the engine knows of its node at one moment. Replaced whole under the engine's lock,
    never changed: any thread reads it without the lock (the Applier's ``EngineView``)."""

    node_name: Optional[str] = None
    node: Optional[NodeState] = None  # as last read (by the facts thread or an action)
    jobs: tuple[tuple[str, str], ...] = ()  # (job id, user)
    facts_ok: bool = False  # the last read of the node's state and jobs worked
    facts_error: str = ""
    verdict: Optional[Verdict] = None
    boot_id: str = ""
    boot_since: float = 0.0  # when the engine first heard of the current boot id
    booted: float = 0.0  # when the current boot started (``boot_time``; 0: unknown)
    domain: str = ""  # this node's NVLink domain (hma.topology.domain), published in its label


def boot_time(procfs: str) -> float:
    """When this boot started: ``btime`` of ``<procfs>/stat`` (unix seconds); 0.0 unknown."""
    try:
        lines = (Path(procfs) / "stat").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "btime" and value.strip().isdigit():
            return float(value)
    return 0.0


class Remediator:
    """Turns verdicts into labels, drains and recovery actions for this node (see module doc)."""

    def __init__(
        self,
        setup: Setup,
        store: Store,
        clock: Callable[[], float] = time.time,
        start: bool = True,
        node_name: Optional[str] = None,
        backend: Optional[Backend] = None,
        resume_gate: Optional[Callable[[str], str]] = None,
    ) -> None:
        section = setup.config.section("recovery")
        errors = options_mod.problems(section)
        if errors:
            raise ConfigError(errors)
        self.resume_gate = resume_gate  # boot id -> why a recovered node waits ("" = go)
        self.procfs = str(setup.config.section("paths")["procfs"])
        self.store = store
        self.clock = clock
        self.rec = options_mod.Recovery.of(section, scheduler_codes(setup))
        self.policy = Policy.of(section, reset_codes(setup), scheduler_codes(setup))
        self.backend = backend or make_backend(setup.config)
        self.enabled = self.backend.enabled
        self._lock = threading.Lock()  # taken to replace ``_known`` and to queue alerts
        self._known = Known(node_name=node_name or self.backend.node_name_configured())
        self._alerts: list[Alert] = []
        self._gpu_resets: list[tuple[str, float]] = []  # (GPU, end time) for the daemon
        self._runs: dict[str, float] = {}  # probe -> start of its last completed run
        self.on_alert: Callable[[], None] = lambda: None  # told when ``alerts`` has more
        self.outbox = Outbox(store)
        self.breaker = Breaker(
            self.backend,
            self._add_alert,
            clock,
            self.rec.max_drained_percent,
            self.rec.max_drained_nodes,
        )
        self.applier = Applier(
            self.backend,
            self.outbox,
            self.breaker,
            self.rec,
            clock,
            view=lambda: self._known,
            observed=self._observed,
            spares=int(setup.config.section("topology")["spares_per_domain"]),
            gpu_reset_done=self._gpu_reset_done,
        )
        self._wake = threading.Event()
        self._reread = threading.Event()  # an action was applied: read the node's state again
        self._stop = threading.Event()
        self._read_ahead = threading.Event()  # a drain may come: read the node's state now
        self._read_ahead_asked = float("-inf")  # monotonic time of the last read ahead asked
        self._stale_checked = False
        self._threads: list[threading.Thread] = []
        self._autoresume = AutoResume(clock)  # hma srun --auto-resume jobs (requeue.py)
        if start and self.enabled:
            for target, name in ((self._facts_loop, "facts"), (self._worker_loop, "outbox")):
                thread = threading.Thread(target=target, name=f"remediation-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _set(self, **changes: Any) -> None:
        """Replace what the engine knows with ``changes`` applied."""
        with self._lock:
            self._known = replace(self._known, **changes)

    def _observed(self, node: NodeState) -> None:
        """An action read the node's state or brought one about (the Applier tells)."""
        self._set(node=node)

    # --- the daemon's interface -----------------------------------------------------------------

    def facts(self) -> NodeFacts:
        """Cached node facts (never waits on the cluster)."""
        known = self._known
        node = known.node if known.facts_ok else None
        return NodeFacts(
            node_name=known.node_name or "",
            job_running=(bool(known.jobs) if known.facts_ok else None),
            job_ids=tuple(j for j, _u in known.jobs),
            slurm_configured=self.enabled,
            job_users=tuple(sorted({u for _j, u in known.jobs})),
            slurm_state=node.label_text if node is not None else "",
            slurm_reason=node.reason if node is not None else "",
        )

    def probe_ran(self, probe: str, started: float) -> None:
        """A run of ``probe`` that started at ``started`` completed (the daemon tells): what
        verifies a GPU after its reset, and a node after ``hma reset``."""
        with self._lock:  # replaced whole: the worker reads it without the lock
            self._runs = {**self._runs, probe: max(started, self._runs.get(probe, 0.0))}
        if self.enabled and self.outbox.episode() is not None:
            self._wake.set()

    def gpu_resets(self) -> list[tuple[str, float]]:
        """GPU resets done since the last call: (GPU component, when it ended). The daemon
        clears the faults a reset clears that were seen before it and runs the gpu probe."""
        with self._lock:
            out, self._gpu_resets = self._gpu_resets, []
        return out

    def _gpu_reset_done(self, gpu: str, at: float) -> None:
        with self._lock:
            self._gpu_resets.append((gpu, at))
        self.on_alert()

    def release(
        self, code: Optional[str], component: Optional[str], who: str, why: str
    ) -> dict[str, Any]:
        """``hma reset``: a human says the node was repaired. Clears the remediations and the
        reboot counts of ``code`` on ``component`` (None: all), and the hold for a human when
        the count left is within ``max_remediations`` (or all were cleared); records who and
        why; the label field is written again through the outbox. The node is resumed only
        after a completed probe run (the planner's ``released``). Returns what it did."""
        now = self.clock()
        with self.outbox.lock:
            cleared = self.store.delete_remediations(code=code, component=component)
            reboots = self.outbox.reboots()
            kept = [
                r
                for r in reboots
                if not ((code is None or r.code == code) and component in (None, r.component))
            ]
            self.outbox.save_reboots(kept)
            left = remediation_count(self.outbox.remediations(), now, self.rec.remediation_window)
            released = bool(self.outbox.human()) and (
                code is None or left <= self.rec.max_remediations
            )
            if released:
                self.outbox.set_human(0.0)
            seq, ep = self.outbox.load()
            name = self._known.node_name
            with self.store.transaction() as conn:
                if ep is not None and released and ep.held == "human":
                    for row_id, kind in self.outbox.open_rows(conn, ep.id):
                        if kind == "hold":
                            self.outbox.cancel(conn, row_id, now, f"hma reset by {who}")
                    ep = replace(ep, held="", released=now, reason=ep.reason.split(" : ")[0])
                    self.outbox.save(conn, seq, ep)
                if name is not None:
                    about = ep or Episode(0, code or "", component or "node")
                    mirror = Enqueue("mirror", f"reset:{now}", about, self._known.boot_id)
                    self.outbox.add(conn, name, mirror, now, self.policy.dry_run)
            note = f"remediation history reset by {who}: {why}"
            self.store.add_remediation(
                {
                    "ts": now,
                    "code": code or "",
                    "component": component or "",
                    "action": "reset",
                    "who": who,
                    "note": why,
                }
            )
            history.add(
                self.store,
                now,
                "reset",
                code or "",
                component or "",
                "ok",
                note,
                {"reason": why},
                who,
            )
        self._wake.set()
        return {
            "cleared": cleared,
            "reboots_cleared": len(reboots) - len(kept),
            "released": released,
            "left": left,
            "node": name,
        }

    def set_domain(self, domain: str) -> None:
        """This node's NVLink domain ("" unknown); the facts thread publishes a change."""
        self._set(domain=domain)

    def update(self, verdict: Verdict, boot_id: str) -> None:
        """Decide on the latest verdict; decisions go to the outbox. Returns at once."""
        with self._lock:
            known = self._known
            new = boot_id != known.boot_id
            since = self.clock() if new else known.boot_since
            booted = boot_time(self.procfs) if new else known.booted
            self._known = replace(
                known, verdict=verdict, boot_id=boot_id, boot_since=since, booted=booted
            )
        if self.enabled:
            self._plan()
        self._wake.set()

    def read_ahead(self) -> None:
        """A fault that drains at once is on its way (any thread; returns at once): the worker
        reads the node's state now, so that the drain finds a fresh read (``Applier.apply``)
        instead of making its own. At most once per ``facts_interval``, never during an
        episode (its state is read every ``facts_interval`` anyway)."""
        now = time.monotonic()
        if not self.enabled or now - self._read_ahead_asked < self.backend.facts_interval:
            return
        self._read_ahead_asked = now
        self._read_ahead.set()
        self._wake.set()

    def status(self) -> dict[str, Any]:
        """The ``remediation`` object of status.json (docs/status.md, docs/remediation.md)."""
        with self.outbox.lock:
            ep = self.outbox.episode()
            known = self._known
            node = known.node
            doc: dict[str, Any] = {
                "policy": self.rec.policy,
                "dry_run": self.rec.dry_run,
                "enabled": self.enabled,
                "node": known.node_name,
                "state": node.label_text if node is not None else "unknown",
                self.backend.name: {
                    "reachable": known.facts_ok,
                    "error": known.facts_error,
                    "state": node.label_text if node is not None else None,
                    "reason": node.reason if node is not None else None,
                    "owned": node.owned if node is not None else None,
                },
                "held": None,
                "jobs": list(ep.jobs) if ep else [j for j, _u in known.jobs],
                "episode": ep.to_json() if ep else None,
                "breaker": self.breaker.last.to_json() if self.breaker.last else None,
                "reboots": self._reboot_counts(),
                "remediations": remediation_count(
                    self.outbox.remediations(), self.clock(), self.rec.remediation_window
                ),
                "held_for_human": self.outbox.human() or None,
                "actions": self.outbox.recent(MAX_ROWS_SHOWN),
            }
        doc["pending"] = sum(1 for r in doc["actions"] if r["state"] in OPEN)
        held = [r for r in doc["actions"] if r["state"] == "held"]
        doc["held"] = held[0]["last_error"] if held else None
        return doc

    def alerts(self) -> list[Alert]:
        """Alerts since the last call (action_requested/applied/held/failed)."""
        with self._lock:
            out, self._alerts = self._alerts, []
        return out

    def close(self) -> None:
        """Stop the threads (an action in flight finishes in the background)."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(1.0)

    # --- synchronous use (hma healthcheck, tests) -----------------------------------------------

    def refresh(self) -> None:
        """Refresh node name, state and jobs now (blocking)."""
        self._refresh_facts()

    def flush(self, timeout: float = 30.0) -> None:
        """Plan and apply until nothing is due (blocking; for one-shot commands)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.enabled:
                self._plan()
            if not self.process_due():
                return

    def _reboot_counts(self) -> dict[str, int]:
        now, window = self.clock(), self.policy.reboot_window
        out: dict[str, int] = {}
        for r in self.outbox.reboots():
            if now - r.ts <= window:
                key = f"{r.code} {r.component}"
                out[key] = out.get(key, 0) + 1
        return out

    # --- alerts ---------------------------------------------------------------------------------

    def _add_alert(self, alert: Alert) -> None:
        """Queue an alert for the daemon (any thread)."""
        with self._lock:
            self._alerts.append(alert)
        self.on_alert()

    def _alert(
        self, kind: str, ep: Episode, message: str, action_kind: str, extra: dict[str, Any]
    ) -> None:
        """An alert about an action of episode ``ep``."""
        details = {
            "node": self._known.node_name,
            "action_kind": action_kind,
            "reason": ep.reason,
            "jobs": list(ep.jobs),
            "users": list(ep.users),
            "episode": ep.id,
            **extra,
        }
        jobs = f" (jobs {','.join(ep.jobs)})" if ep.jobs else ""
        self._add_alert(
            Alert(
                kind,
                ep.code,
                ep.component,
                Severity.parse(ep.severity or "critical"),
                message + jobs,
                Action.parse(ep.action or "none"),
                "remediation",
                details,
                self.clock(),
            )
        )
        log.info("%s: %s%s", kind, message, jobs)

    # --- deciding -------------------------------------------------------------------------------

    def _resume_hold(self, ep: Optional[Episode], boot_id: str, verdict: Verdict) -> str:
        """Why a node back from hma's reboot or replacement (a new boot, or an episode found in
        Slurm) must wait before its resume: ``resume_gate`` ([deep_check] after_recovery, given
        by the daemon), asked only once no draining fault is left."""
        if self.resume_gate is None or ep is None or not ep.owned or verdict.draining:
            return ""
        if ep.stale or (ep.acted is not None and ep.acted.boot_id != boot_id):
            return self.resume_gate(boot_id)
        return ""

    def _plan(self) -> None:
        """Bring the outbox in line with the verdict (under the outbox's lock): the planner
        decides, the outbox records, alerts say what was decided."""
        with self.outbox.lock:
            known = self._known
            name, verdict = known.node_name, known.verdict
            if name is None or verdict is None:
                return  # decided once the cluster told us who we are and the daemon gave a verdict
            now, runs = self.clock(), self._runs
            seq, ep = self.outbox.load()
            with self.store.transaction() as conn:
                situation = Situation(
                    now=now,
                    verdict=verdict,
                    node=known.node,
                    facts_ok=known.facts_ok,
                    jobs=known.jobs,
                    boot_id=known.boot_id,
                    boot_since=known.boot_since,
                    booted=known.booted,
                    reboots=tuple(self.outbox.reboots()),
                    auto_resume_jobs=frozenset(self._autoresume.marked),
                    open_rows=self.outbox.open_rows(conn, ep.id) if ep is not None else (),
                    resume_hold=self._resume_hold(ep, known.boot_id, verdict),
                    remediations=tuple(self.outbox.remediations()),
                    human=self.outbox.human(),
                    observed=max(runs.values(), default=0.0),
                    verified=runs.get(VERIFY_PROBE, 0.0),
                )
                result = plan(ep, seq, situation, self.policy, self._stale_checked)
                self._stale_checked = result.stale_checked
                for intent in result.intents:
                    if isinstance(intent, Cancel):
                        self.outbox.cancel(conn, intent.row_id, now, intent.why)
                    elif self.outbox.add(conn, name, intent, now, self.policy.dry_run):
                        self._requested(intent, name)
                self.outbox.save(conn, result.seq, result.episode)

    def _requested(self, intent: Enqueue, node: str) -> None:
        what = describe(intent.kind, intent.episode, node, self.rec)
        if self.policy.dry_run:
            held, message = "dry_run", f"dry run: would {what}"
        elif intent.kind == "label" and not self.policy.automatic:
            held, message = "policy", f"policy none: {what} only"
        else:
            self._alert("action_requested", intent.episode, what, intent.kind, {})
            return
        self._alert("action_held", intent.episode, message, intent.kind, {"held": held})

    # --- the worker -----------------------------------------------------------------------------

    def _worker_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._read_ahead.is_set():
                    self._read_ahead.clear()
                    self._read_node_ahead()
                self._plan()
                self.process_due()
                self.applier.recheck()
                self._plan()
            except Exception:  # noqa: BLE001 - the worker never dies
                log.exception("remediation worker error")
            wait = self.rec.recheck_interval
            nxt = self.outbox.next_due()
            if nxt is not None:
                wait = max(0.0, min(wait, nxt - self.clock()))
            self._wake.wait(wait)
            self._wake.clear()

    def _read_node_ahead(self) -> None:
        """The node's state for a drain about to be decided (``read_ahead``)."""
        name = self._known.node_name
        if name is not None and self.outbox.episode() is None:
            self.applier.read_ahead(name)

    def process_due(self) -> bool:
        """Apply due actions in order; returns whether any was attempted."""
        did = False
        while not self._stop.is_set():
            rows = self.outbox.due()
            if not rows:
                return did
            row = rows[0]  # strictly in order: a later action never overtakes an earlier one
            if row.next_try > self.clock():
                return did
            did = True
            self._attempt(row)
        return did

    def _attempt(self, row: Row) -> None:
        self.outbox.attempting(row.id, self.clock())
        try:
            # `hma maintenance on`: decided and alerted, not done
            window = maintenance_mode.load(self.store)
            if window is not None and window.active(self.clock()):
                outcome, note = "held", f"maintenance: hma maintenance on, {window.describe()}"
            else:
                outcome, note = self.applier.apply(row)
        except BackendError as exc:
            outcome, note = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - one bad action must not stop the worker
            log.exception("action %s failed", row.key)
            outcome, note = "failed", f"{type(exc).__name__}: {exc}"
        now = self.clock()
        attempts = row.attempts + 1
        with self.outbox.lock:
            ep = self.outbox.episode() or Episode.from_json(
                {**row.payload, "id": row.payload.get("episode"), "reason": row.reason}
            )
            with self.store.transaction() as conn:
                if self.outbox.cancelled(conn, row.id):
                    return
                if outcome == "failed":
                    delay = backoff(attempts, self.rec.retry_min, self.rec.retry_max)
                    self.outbox.retry(conn, row.id, "failed", note, now, now + delay)
                    self._alert(
                        "action_failed",
                        ep,
                        f"{row.kind} of {row.node} failed (attempt {attempts}, retry in "
                        f"{delay:.0f} s): {note}",
                        row.kind,
                        {"error": note, "attempts": attempts, "action_id": row.id},
                    )
                elif outcome == "held":
                    when = now + self.rec.recheck_interval
                    self.outbox.retry(conn, row.id, "held", note, now, when)
                    if row.state != "held":
                        self._alert(
                            "action_held",
                            ep,
                            f"{row.kind} of {row.node} held: {note}",
                            row.kind,
                            {"held": note.split(":")[0], "action_id": row.id},
                        )
                else:
                    self.outbox.finish(conn, row.id, outcome, now, note)
                    if outcome == "done":
                        self._reread.set()  # the node's state changed: status shows it soon
                        self._alert(
                            "action_applied",
                            ep,
                            f"{describe(row.kind, ep, row.node, self.rec)}: done"
                            + (f" ({note})" if note else ""),
                            row.kind,
                            {"action_id": row.id, "note": note},
                        )
        if outcome != "held":
            self.breaker.passed()

    # --- facts ----------------------------------------------------------------------------------

    def _facts_loop(self) -> None:
        """Jobs (local slurmd) every ``facts_interval``; the node's state from the controller
        every ``heartbeat`` (jittered) while nothing happens, every ``facts_interval`` while
        something does and once after each action applied (so a resume shows at once), backing
        off up to ``heartbeat`` while the controller cannot be reached."""
        due = 0.0  # monotonic time of the next node-state read
        failures = 0
        while not self._stop.is_set():
            now = time.monotonic()
            fast, heartbeat = self.backend.facts_interval, self.backend.heartbeat
            if now >= due or self._busy() or self._reread.is_set():
                self._reread.clear()
                ok = self._refresh_facts()
                failures = 0 if ok else failures + 1
                if ok:
                    wait = heartbeat * random.uniform(0.9, 1.1)  # noqa: S311
                else:
                    wait = min(fast * 2**failures, heartbeat)
                due = now + wait
            else:
                self._refresh_jobs()
            self._publish_domain()
            self._stop.wait(min(fast, max(0.0, due - time.monotonic())))

    def _publish_domain(self) -> None:
        """Publish the node's domain when the field last read says another (no request
        otherwise; a failed write is tried again on the next pass)."""
        known = self._known
        node = known.node
        if node is None or not known.facts_ok or self.policy.dry_run:
            return
        try:
            new = topology_domain.publish(self.backend, node, known.domain)
        except BackendError as exc:
            log.warning("cannot publish the domain of %s: %s", node.name, exc)
            return
        if new is not None:
            written = node.with_field(self.backend.label_field, new)
            with self._lock:
                if self._known.node is node:
                    self._known = replace(self._known, node=written)

    def _busy(self) -> bool:
        """Something is happening: an episode, an open action or a job auto-resume watches."""
        return self.outbox.episode() is not None or bool(self._autoresume.watch)

    def _refresh_facts(self) -> bool:
        """Read the node's state (one single-node query) and jobs; returns whether it worked."""
        try:
            name = self._known.node_name or self.backend.find_node_name()
            if name is None:
                raise BackendError(self.backend.no_node)
            node = self.backend.node(name)
        except BackendError as exc:
            return self._facts_failed(exc)
        self.applier.seed_reboots(node)  # before a plan can see the node
        with self._lock:
            first = self._known.node_name is None
            self._known = replace(self._known, node_name=name, node=node)
        ok = self._refresh_jobs()
        if first:
            self._wake.set()
        return ok

    def _facts_failed(self, exc: BackendError) -> bool:
        self._set(facts_ok=False, facts_error=str(exc))
        return False

    def _refresh_jobs(self) -> bool:
        """Read the node's jobs (no controller query in the steady state with Slurm)."""
        name = self._known.node_name
        if name is None:
            return False
        try:
            jobs = self.backend.jobs(name)
        except BackendError as exc:
            return self._facts_failed(exc)
        client = self.backend if isinstance(self.backend, RequeuesJobs) else None
        self._autoresume.observe(client, jobs)  # before the jobs are used by _plan
        with self._lock:
            known = self._known
            self._known = replace(
                known,
                jobs=tuple((j.id, j.user) for j in jobs),
                facts_ok=known.node is not None,
                facts_error="",
            )
        return True
