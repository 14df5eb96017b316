"""The remediation engine: verdicts in, cluster actions out, through a persistent outbox.

It only wires the parts: ``update()`` (called by the daemon after every change) asks the pure
planner what to do (``deciding``) and writes its intents to the outbox (``outbox``), which takes
milliseconds. The outbox worker thread (``worker``) applies due actions in order through the
cluster backend (``actions.Applier``, behind the circuit breaker of ``breaker``) and writes
their outcome, folded into the episode (``transitions``), retrying failures with backoff (a
failing scontrol takes about 9 s while slurmctld is unreachable). The facts thread (``facts``)
refreshes the node facts (state, jobs) that probes and decisions use. See docs/remediation.md.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, Callable, Optional

from hma.adapters.files import boot_time
from hma.config.schema import ConfigError
from hma.contracts.alert import Alert
from hma.contracts.cluster import Backend, NodeState
from hma.contracts.model import Severity
from hma.contracts.probe import NodeFacts
from hma.detection.registry import make_backend
from hma.detection.setup import Setup
from hma.health.model import Verdict
from hma.health.store import Store
from hma.remediation import evidence, options, repair
from hma.remediation.actions import Applier
from hma.remediation.alerts import Alerts
from hma.remediation.breaker import Breaker
from hma.remediation.deciding import Decider
from hma.remediation.facts import Facts, Known, Shared, node_facts
from hma.remediation.outbox import OPEN, Outbox
from hma.remediation.planner import HONOURED, Policy, remediation_count
from hma.remediation.requeue import AutoResume
from hma.remediation.worker import Worker

MAX_ROWS_SHOWN = 20


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


def marked_codes(setup: Setup) -> tuple[frozenset[str], frozenset[str]]:
    """The catalogue's codes a GPU reset may clear (``reset_gpu = true``) and its codes of drains
    the scheduler made itself (``scheduler = true``), in one pass over the catalogue."""
    entries = list(setup.catalogue)
    return (
        frozenset(e.code for e in entries if e.reset_gpu),
        frozenset(e.code for e in entries if e.scheduler),
    )


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
        errors = options.problems(section)
        if errors:
            raise ConfigError(errors)
        self.resume_gate = resume_gate  # boot id -> why a recovered node waits ("" = go)
        self.procfs = str(setup.config.section("paths")["procfs"])
        self.evidence = evidence.Settings.of(section, setup.config.section("agent"))
        self.store = store
        self.clock = clock
        resettable, scheduler = marked_codes(setup)
        self.rec = options.Recovery.of(section, scheduler)
        self.policy = Policy.of(section, resettable, scheduler)
        self.backend = backend or make_backend(setup.config)
        self.enabled = self.backend.enabled
        self._lock = threading.Lock()  # taken to change ``_runs`` and ``_gpu_resets``
        self._known = Shared(Known(node_name=node_name or self.backend.node_name_configured()))
        self._gpu_resets: list[tuple[str, float]] = []  # (GPU, end time) for the daemon
        self._runs: dict[str, float] = {}  # probe -> start of its last completed run
        self.on_alert: Callable[[], None] = lambda: None  # told when ``alerts`` has more
        self._alerts = Alerts(clock, lambda: self._known.now.node_name, lambda: self.on_alert())
        self.outbox = Outbox(store)
        self.breaker = Breaker(
            self.backend,
            self._alerts.add,
            clock,
            self.rec.max_drained_percent,
            self.rec.max_drained_nodes,
        )
        self._stop = threading.Event()
        self._read_ahead_asked = float("-inf")  # monotonic time of the last read ahead asked
        self._autoresume = AutoResume(clock)  # hma srun --auto-resume jobs (requeue.py)
        self._decider = Decider(
            store,
            self.outbox,
            self._known,
            self.policy,
            self.rec,
            self._alerts,
            self._autoresume,
            clock,
            runs=lambda: self._runs,
            gate=lambda: self.resume_gate,
        )
        self._wire(int(setup.config.section("topology")["spares_per_domain"]))
        self._threads: list[threading.Thread] = []
        if start and self.enabled:
            loops = ((lambda: self._facts.loop(self._stop), "facts"), (self.worker.loop, "outbox"))
            for target, name in loops:
                thread = threading.Thread(target=target, name=f"remediation-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _wire(self, spares: int) -> None:
        """The applier, the facts thread and the outbox worker (``spares``: ``[topology]
        spares_per_domain``)."""
        rec = self.rec
        self.applier = Applier(
            self.backend,
            self.outbox,
            self.breaker,
            rec,
            self.clock,
            view=lambda: self._known.now,
            observed=self._observed,
            spares=spares,
            gpu_reset=lambda: repair.gpu_reset(rec.gpu_reset_command, rec.gpu_reset_timeout),
            evidence=self._evidence,
        )
        self._facts = Facts(
            self.backend,
            self._known,
            self._autoresume,
            seed=self.applier.labels.seed,
            busy=lambda: self.outbox.episode() is not None,
            first=lambda: self.worker.wake.set(),
            dry_run=self.policy.dry_run,
        )
        self.worker = Worker(
            self.store,
            self.outbox,
            self.applier,
            self.breaker,
            rec,
            self._alerts,
            self.clock,
            plan=self._plan_if_enabled,
            node_name=lambda: self._known.now.node_name,
            gpu_reset_done=self._gpu_reset_done,
            applied=self._facts.reread,
            stop=self._stop,
        )

    def _evidence(self, kind: str, node: str) -> str:
        """The evidence bundle before a repair of ``kind`` on ``node`` (hma.remediation.evidence:
        the bug report, the kernel log, the node's record, hma's findings and status); its path,
        "" when ``[recovery] evidence`` is off or none could be made."""
        if not self.evidence.enabled or self.rec.dry_run:
            return ""
        verdict = self._known.now.verdict
        state = {
            "findings": [f.to_json() for f in (verdict.faults if verdict is not None else ())],
            "remediation": self.status(),
        }
        folder, env = self.evidence.folder, self.backend.env()
        return evidence.bundle(node, folder, self.evidence, kind, state, env=env)

    def _plan_if_enabled(self) -> None:
        """The planner's pass (``Decider.plan``), when remediation is on."""
        if self.enabled:
            self._decider.plan()

    def _observed(self, node: NodeState) -> None:
        """An action read the node's state or brought one about (the Applier tells)."""
        self._known.set(node=node)

    # --- the daemon's interface -----------------------------------------------------------------

    def facts(self) -> NodeFacts:
        """Cached node facts (never waits on the cluster)."""
        return node_facts(self._known.now, self.enabled)

    def probe_ran(self, probe: str, started: float) -> None:
        """A run of ``probe`` that started at ``started`` completed (the daemon tells): what
        verifies a GPU after its reset, and a node after ``hma reset``."""
        with self._lock:  # replaced whole: the worker reads it without the lock
            self._runs = {**self._runs, probe: max(started, self._runs.get(probe, 0.0))}
        if self.enabled and self.outbox.episode() is not None:
            self.worker.wake.set()

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
        """``hma reset``: a human says the node was repaired (``Decider.release``). Returns
        what it did."""
        done = self._decider.release(code, component, who, why)
        self.worker.wake.set()
        return done

    def set_domain(self, domain: str) -> None:
        """This node's NVLink domain ("" unknown); the facts thread publishes a change."""
        self._known.set(domain=domain)

    def update(self, verdict: Verdict, boot_id: str) -> None:
        """Decide on the latest verdict; decisions go to the outbox. Returns at once."""

        def change(known: Known) -> Known:
            new = boot_id != known.boot_id
            since = self.clock() if new else known.boot_since
            booted = boot_time(self.procfs) if new else known.booted
            return replace(known, verdict=verdict, boot_id=boot_id, boot_since=since, booted=booted)

        self._known.swap(change)
        self._plan_if_enabled()
        self.worker.wake.set()

    def read_ahead(self) -> None:
        """A fault that drains at once is on its way (any thread; returns at once): the worker
        reads the node's state now, so that the drain finds a fresh read (``Applier.apply``)
        instead of making its own. At most once per ``facts_interval``, never during an
        episode (its state is read every ``facts_interval`` anyway)."""
        now = time.monotonic()
        if not self.enabled or now - self._read_ahead_asked < self.backend.facts_interval:
            return
        self._read_ahead_asked = now
        self.worker.read_ahead.set()
        self.worker.wake.set()

    def status(self) -> dict[str, Any]:
        """The ``remediation`` object of status.json (docs/status.md, docs/remediation.md)."""
        with self.outbox.lock:
            ep = self.outbox.episode()
            known = self._known.now
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
                "honoured": HONOURED.format(code=ep.code) if ep and ep.honoured else None,
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
        return self._alerts.take()

    def close(self) -> None:
        """Stop the threads (an action in flight finishes in the background)."""
        self._stop.set()
        self.worker.wake.set()
        for thread in self._threads:
            thread.join(1.0)

    # --- synchronous use (hma healthcheck, tests) -----------------------------------------------

    def refresh(self) -> None:
        """Refresh node name, state and jobs now (blocking)."""
        self._facts.refresh()

    def flush(self, timeout: float = 30.0) -> None:
        """Plan and apply until nothing is due (blocking; for one-shot commands)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._plan_if_enabled()
            if not self.process_due():
                return

    def process_due(self) -> bool:
        """Apply due actions in order; returns whether any was attempted (``Worker``)."""
        return self.worker.process_due()

    def _reboot_counts(self) -> dict[str, int]:
        now, window = self.clock(), self.policy.reboot_window
        out: dict[str, int] = {}
        for r in self.outbox.reboots():
            if now - r.ts <= window:
                key = f"{r.code} {r.component}"
                out[key] = out.get(key, 0) + 1
        return out
