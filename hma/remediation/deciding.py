"""Deciding: the planner's pass over the engine's state, and ``hma reset``.

``Decider.plan`` gathers the situation (the node's state and jobs, the verdict, the records of
the outbox), asks the pure planner (``planner.plan``) and writes its episode and intents, and
says in alerts what was decided. ``Decider.release`` carries out what ``transitions.release``
decides for ``hma reset``. Both run under the outbox's lock.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from hma.contracts.label import POSTMORTEM_CODE
from hma.health import history
from hma.health.model import Verdict
from hma.health.store import Store
from hma.remediation import remediations, transitions
from hma.remediation.actions import describe
from hma.remediation.alerts import Alerts
from hma.remediation.facts import Shared
from hma.remediation.options import Recovery
from hma.remediation.outbox import Outbox
from hma.remediation.planner import (
    VERIFY_PROBE,
    Cancel,
    Enqueue,
    Episode,
    Intent,
    Policy,
    Situation,
    plan,
)
from hma.remediation.requeue import AutoResume


class Decider:
    """The deciding of one engine. ``runs``: probe -> start of its last completed run;
    ``gate``: the engine's ``resume_gate`` now (boot id -> why a recovered node waits)."""

    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        known: Shared,
        policy: Policy,
        recovery: Recovery,
        alerts: Alerts,
        autoresume: AutoResume,
        clock: Callable[[], float],
        runs: Callable[[], dict[str, float]],
        gate: Callable[[], Optional[Callable[[str], str]]],
    ) -> None:
        self.store = store
        self.outbox = outbox
        self.known = known
        self.policy = policy
        self.rec = recovery
        self.alerts = alerts
        self.autoresume = autoresume
        self.clock = clock
        self.runs = runs
        self.gate = gate
        self._stale_checked = False

    def release(
        self, code: Optional[str], component: Optional[str], who: str, why: str
    ) -> dict[str, Any]:
        """``hma reset``: a human says the node was repaired. Clears the remediations and the
        reboot counts of ``code`` on ``component`` (None: all), and the hold for a human when
        the count left is within ``max_remediations`` (or all were cleared); records who and
        why; the label field is written again through the outbox. The node is resumed only
        after a completed probe run (the planner's ``released``; ``transitions.release``
        decides). Returns what it did."""
        now = self.clock()
        known = self.known.now
        reset = transitions.Reset(code, component, who, now, known.boot_id)
        with self.outbox.lock:
            cleared = remediations.delete(self.store, code=code, component=component)
            reboots = self.outbox.reboots()
            seq, ep = self.outbox.load()
            remaining = self.outbox.remediations()
            with self.store.transaction() as conn:
                done = transitions.release(
                    ep,
                    reset,
                    self.policy,
                    remaining,
                    reboots,
                    self.outbox.human(),
                    self.outbox.open_rows(conn, ep.id) if ep is not None else (),
                    known.node_name,
                )
            self.outbox.save_reboots(list(done.reboots))
            if done.released:
                self.outbox.set_human(0.0)
            with self.store.transaction() as conn:
                self._carry_out(conn, done.intents, known.node_name or "", now)
                if done.episode is not ep:
                    self.outbox.save(conn, seq, done.episode)
            note = f"remediation history reset by {who}: {why}"
            row = {"ts": now, "code": code or "", "component": component or "", "action": "reset"}
            remediations.add(self.store, {**row, "who": who, "note": why})
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
        return {
            "cleared": cleared,
            "reboots_cleared": len(reboots) - len(done.reboots),
            "released": done.released,
            "left": done.left,
            "node": known.node_name,
        }

    def _resume_hold(self, ep: Optional[Episode], boot_id: str, verdict: Verdict) -> str:
        """Why a node back from hma's reboot or replacement (a new boot, or an episode found in
        Slurm) must wait before its resume: ``resume_gate`` ([deep_check] after_recovery, given
        by the daemon), asked only once no draining fault is left."""
        gate = self.gate()
        if gate is None or ep is None or not ep.owned or verdict.draining:
            return ""
        if ep.stale or (ep.acted is not None and ep.acted.boot_id != boot_id):
            return gate(boot_id)
        return ""

    def plan(self) -> None:
        """Bring the outbox in line with the verdict (under the outbox's lock): the planner
        decides, the outbox records, alerts say what was decided."""
        with self.outbox.lock:
            known = self.known.now
            name, verdict = known.node_name, known.verdict
            if name is None or verdict is None:
                return  # decided once the cluster told us who we are and the daemon gave a verdict
            now, runs = self.clock(), self.runs()
            self._postmortem(verdict, known.boot_id, name, now)
            seq, ep = self.outbox.load()
            done_before = tuple(self.outbox.remediations())
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
                    auto_resume_jobs=frozenset(self.autoresume.marked),
                    open_rows=self.outbox.open_rows(conn, ep.id) if ep is not None else (),
                    resume_hold=self._resume_hold(ep, known.boot_id, verdict),
                    remediations=done_before,
                    human=self.outbox.human(),
                    observed=max(runs.values(), default=0.0),
                    verified=runs.get(VERIFY_PROBE, 0.0),
                )
                result = plan(ep, seq, situation, self.policy, self._stale_checked)
                self._stale_checked = result.stale_checked
                self._carry_out(conn, result.intents, name, now, alert=True)
                self.outbox.save(conn, result.seq, result.episode)

    def _postmortem(self, verdict: Verdict, boot_id: str, node: str, now: float) -> None:
        """A crash of the previous boot the post-mortem read (``POSTMORTEM_CODE``) counts once
        per boot in the remediations, and the label field is written again (``hmah=``,
        ``hmap=``) through the outbox's ``mirror`` action."""
        for fault in verdict.faults:
            if fault.code != POSTMORTEM_CODE or not fault.details.get("previous_boot"):
                continue
            cause = str(fault.details.get("cause") or fault.code)
            if self.outbox.crash(cause, fault.component, boot_id, now):
                intent = Enqueue(
                    "mirror", f"crash:{boot_id}", Episode(0, cause, fault.component), boot_id
                )
                with self.store.transaction() as conn:
                    self._carry_out(conn, [intent], node, now)
            return  # one crash per boot, whatever number of records told it

    def _carry_out(
        self, conn: Any, intents: Sequence[Intent], node: str, now: float, alert: bool = False
    ) -> None:
        """Write ``intents`` to the outbox (``alert``: say what was decided)."""
        for intent in intents:
            if isinstance(intent, Cancel):
                self.outbox.cancel(conn, intent.row_id, now, intent.why)
            elif self.outbox.add(conn, node, intent, now, self.policy.dry_run) and alert:
                self._requested(intent, node)

    def _requested(self, intent: Enqueue, node: str) -> None:
        what = describe(intent.kind, intent.episode, node, self.rec)
        if self.policy.dry_run:
            held, message = "dry_run", f"dry run: would {what}"
        elif intent.kind == "label" and not self.policy.automatic:
            held, message = "policy", f"policy none: {what} only"
        else:
            self.alerts.about("action_requested", intent.episode, what, intent.kind, {})
            return
        self.alerts.about("action_held", intent.episode, message, intent.kind, {"held": held})
