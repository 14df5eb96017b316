"""One pass of the watcher (read the node table once, decide, act where this watcher holds the
claim, tell journald, save the state) and the service's loop around it."""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from hma.adapters.command import CommandRunner
from hma.adapters.text import printable
from hma.cluster.slurm.parse import SlurmError
from hma.contracts.alert import Alert
from hma.contracts.model import Action as Recommended
from hma.contracts.model import Severity
from hma.contracts.reporter import Reporter
from hma.remediation.evidence import Settings
from hma.remediation.options import Recovery
from hma.watch import act, claim, decide, state
from hma.watch.options import Watch

if TYPE_CHECKING:
    from hma.cluster.slurm.backend import SlurmBackend

log = logging.getLogger("hma.watch")
DEFAULT_DEADLINE = 600.0  # the reboot deadline when Slurm has no ResumeTimeout
_RESUME = re.compile(r"^ResumeTimeout\s*=\s*(\d+)", re.M)
RECOMMENDED = {"reboot": Recommended.REBOOT, "replace": Recommended.REPLACE}


class Watcher:
    """The watcher of one cluster (module doc); ``reporters``: journald and the others
    configured, told every decision once (when it changes)."""

    def __init__(
        self,
        cfg: Watch,
        rec: Recovery,
        limits: decide.Limits,
        backend: SlurmBackend,
        reporters: Sequence[Reporter] = (),
        clock: Callable[[], float] = time.time,
        evidence: Optional[Settings] = None,
    ) -> None:
        self.cfg = cfg
        self.evidence = evidence  # the bundles' settings; None: no bundles (dry run, off)
        self.rec = rec
        self.limits = limits
        self.backend = backend
        self.client = backend.client
        self.reporters = list(reporters)
        self.clock = clock
        self._deadline: Optional[float] = cfg.reboot_deadline

    def deadline(self) -> float:
        """The reboot deadline: ``[watch] reboot_deadline``, else ResumeTimeout (read once)."""
        if self._deadline is None:
            argv = [*self.client.scontrol, "show", "config"]
            out = CommandRunner().run(argv, self.client.timeout, env=self.client.env())
            found = _RESUME.search(out.stdout) if out.ok else None
            value = float(found.group(1)) if found else 0.0
            self._deadline = value or DEFAULT_DEADLINE
        return self._deadline

    def once(self) -> dict[str, Any]:
        """One pass; the document it saved as ``last`` (``error`` set when Slurm could not be
        read: nothing decided)."""
        st = state.load(self.cfg.state_dir)
        for node, left in st.actions.items():
            if left.state == "running":  # a watcher stopped during it: never run it twice
                log.warning(
                    "%s of %s (%s) was under way when the watcher stopped: counted as issued",
                    left.kind, printable(node), left.id,
                )  # fmt: skip
                left.state = "issued"
        now = self.clock()
        try:
            nodes = self.client.nodes()  # the pass's one read of the node table
        except SlurmError as exc:
            log.error("node table not read: %s", printable(str(exc)))
            st.last = {**st.last, "time": now, "error": str(exc)}
            state.save(self.cfg.state_dir, st)
            return st.last
        deadline = self.deadline()
        made = decide.plan(nodes, st.seen, st.actions, self.cfg, deadline, self.limits, now)
        lease = claim.Claim(Path(self.cfg.claim_file), st.holder, 3 * self.cfg.interval)
        passive = self._passive(lease, now)
        try:
            items = [self._final(d, passive) for d in made.decisions]
            self._carry_out(items, {n.name: n for n in nodes}, st)
            st.seen = made.seen
            self._tell(items, made, st.last, passive, now)
            st.last = {
                "time": now,
                "role": "passive" if passive else "active",
                "passive": passive or None,
                "holder": st.holder,
                "nodes": len(nodes),
                "reboot_deadline": deadline,
                "breaker": made.breaker(),
                "decisions": [d.to_json() for d in items],
            }
            state.save(self.cfg.state_dir, st)
        finally:
            lease.release()
        return st.last

    def _passive(self, lease: claim.Claim, now: float) -> str:
        """Why this watcher must not act ("" when it acts): not the slurmctld in service, or the
        claim is another's (taken or renewed every pass, held until ``release``)."""
        here, why = claim.primary_here(
            self.client.scontrol, self.client.env(), self.client.timeout, self.cfg.controller_names
        )
        if not here:
            return why
        return lease.take(now)

    def _final(self, item: decide.Decision, passive: str) -> decide.Decision:
        """``item`` with the holds the plan cannot see: a passive watcher, dry run, no way."""
        if item.kind not in ("reboot", "replace") or item.held:
            return item
        if passive:
            return replace(item, held="passive")
        if self.rec.dry_run:
            return replace(item, held="dry_run")
        if not act.method(self.rec, item.kind):
            return replace(item, held="unsupported")
        return item

    def _carry_out(
        self, items: Sequence[decide.Decision], nodes: dict[str, Any], st: state.State
    ) -> None:
        bundles = act.Bundles(
            self.evidence, self.cfg.evidence_remote, self.cfg.interval, self.backend.env
        )
        actor = act.Actor(
            self.backend,
            self.rec,
            st,
            lambda: state.save(self.cfg.state_dir, st),
            self.clock,
            bundles,
        )
        for item in items:
            if item.kind == "back" and item.node in st.actions and not item.held:
                del st.actions[item.node]
            elif item.acts:
                self._alert(item, "action_requested")
                done = actor.act(item, nodes[item.node])
                kind = "action_applied" if done.state == "issued" else "action_failed"
                extra = f": {done.error}" if done.error else ""
                self._alert(replace(item, action=done), kind, extra)

    def _tell(
        self,
        items: Sequence[decide.Decision],
        made: decide.Plan,
        last: dict[str, Any],
        passive: str,
        now: float,
    ) -> None:
        """journald (and the other reporters): each decision once while it stays the same, the
        breaker when it opens, a change of role."""
        before = {(d.get("node"), d.get("kind"), d.get("held")) for d in last.get("decisions", [])}
        for item in items:
            if item.acts or (item.node, item.kind, item.held or None) in before:
                continue
            if item.kind == "back":
                self._alert(item, "cleared")
            elif item.kind in ("report", "postmortem"):
                self._alert(item, "raised")
            else:
                self._alert(item, "action_held", f" (held: {item.held})")
        was_open = bool(last.get("breaker", {}).get("open"))
        if made.open and not was_open:
            self._breaker(made, now)
        role = "passive" if passive else "active"
        if last.get("role") != role:
            log.info("watcher %s%s", role, f": {printable(passive)}" if passive else "")

    def _breaker(self, made: decide.Plan, now: float) -> None:
        msg = (
            f"{len(made.affected)} of {made.total} nodes not responding or not back (limit "
            f"{made.limit}): the network, the controller or the power; every action held"
        )
        alert = Alert(
            "action_held", decide.BREAKER, "cluster", Severity.CRITICAL, msg, Recommended.NONE,
            "watch", made.breaker(), now,
        )  # fmt: skip
        self._send(alert)

    def _alert(self, item: decide.Decision, kind: str, extra: str = "") -> None:
        """One decision as an alert (component: the node's name)."""
        quiet = item.kind in ("report", "back", "postmortem")
        severity = Severity.WARNING if quiet else Severity.CRITICAL
        details = item.to_json()
        msg = f"{item.kind} {item.node}: {item.why}{extra}"
        recommended = RECOMMENDED.get(item.kind, Recommended.NONE)
        alert = Alert(
            kind, item.code, item.node, severity, msg, recommended, "watch", details, self.clock()
        )
        self._send(alert)

    def _send(self, alert: Alert) -> None:
        level = logging.INFO if alert.kind in ("cleared", "action_applied") else logging.WARNING
        log.log(level, "%s %s: %s", alert.code, alert.kind, printable(alert.message))
        for rep in self.reporters:
            try:
                rep.alert(alert)
            except Exception as exc:  # noqa: BLE001 - a bad reporter must not stop the watcher
                log.error("reporter %s failed: %s", rep.name, exc)

    def run(self, stop: threading.Event) -> None:
        """Passes every ``interval`` until ``stop`` is set."""
        while not stop.is_set():
            started = self.clock()
            try:
                self.once()
            except OSError as exc:  # the state folder: logged, tried again next interval
                log.error("watcher pass failed: %s", exc)
            stop.wait(max(0.0, self.cfg.interval - (self.clock() - started)))
