"""Carrying out one outbox action through the cluster backend.

``KINDS`` is the one table of action kinds: what alerts call each kind (``describe``) and the
``Applier`` step that carries it out. ``Applier.apply`` reads the node's state first (one
single-node query) and checks that the action is still right and not already in effect (a restart
after ``kill -9`` must not act twice); then it makes the backend calls: label, drain (counted by
the breaker, undone beyond its limit), down, the repairs (``repair``: GPU reset, reboot, replace),
resume. Each step returns a typed outcome (``transitions``): what it observed and did, which the
worker folds into the episode; a ``BackendError`` is retried. Each remediation is recorded in the
state store and mirrored, with the hold for a human, in the label field (``labels``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from hma.contracts.cluster import (
    Backend,
    BackendError,
    NodeState,
    SetsDown,
)
from hma.remediation import remediations
from hma.remediation.breaker import Breaker, Count
from hma.remediation.facts import EngineView
from hma.remediation.labels import Labels
from hma.remediation.options import Recovery
from hma.remediation.outbox import Outbox, Row
from hma.remediation.planner import HONOURED, Episode, occurrences
from hma.remediation.repair import GpuResetter, Repairer
from hma.remediation.spares import Spares, unsupported
from hma.remediation.transitions import (
    Adopted,
    Done,
    Drained,
    Held,
    HeldByBreaker,
    Honoured,
    NotOwned,
    Outcome,
    Resumed,
    SetDown,
    Skipped,
    Undone,
)

log = logging.getLogger("hma.remediation")

# Oldest read ahead (seconds since it started) that may stand for a drain's own state read: the
# drain then follows the read as closely as when it reads itself (docs/remediation.md).
FRESH_S = 0.5


class Applier:
    """Applies outbox actions for one engine (see module doc). ``view``: the engine's state now;
    ``observed``: told each node state an action read or brought about; ``spares``: ``[topology]
    spares_per_domain``; ``gpu_reset``: makes the GPU reset (asked when the first is due);
    ``evidence``: gathers a bundle before a repair (``repair.Repairer``). Only
    the engine's worker (or a one-shot caller) applies actions."""

    def __init__(
        self,
        backend: Backend,
        outbox: Outbox,
        breaker: Breaker,
        recovery: Recovery,
        clock: Callable[[], float],
        view: Callable[[], EngineView],
        observed: Callable[[NodeState], None],
        spares: int,
        gpu_reset: Callable[[], GpuResetter],
        evidence: Callable[[str, str], str],
    ) -> None:
        self.backend = backend
        self.outbox = outbox
        self.breaker = breaker
        self.rec = recovery
        self.clock = clock
        self.view = view
        self.observed = observed
        self.labels = Labels(backend, outbox, recovery, clock)
        self.repairs = Repairer(
            backend,
            outbox,
            self.labels,
            recovery,
            clock,
            view,
            observed,
            Spares(backend, spares, lambda: self.view().domain),
            gpu_reset,
            guard=self._breaker_holds,
            record=self._record,
            evidence=evidence,
        )
        # A read ahead of the node's state (monotonic start time, state) a drain may use once
        self.ahead: Optional[tuple[float, NodeState]] = None
        self._last_recheck = 0.0
        self._recheck_every = recovery.recheck_interval

    def _record(self, action: str) -> bool:
        """Record a remediation of the open episode (before the call that carries it, so that
        the label written with it mirrors it); False when it was recorded already (or no
        episode is open)."""
        ep = self.outbox.episode()
        return ep is not None and self.outbox.record(ep, action, self.view().boot_id, self.clock())

    def _breaker_holds(self, node: NodeState, what: str) -> Optional[Outcome]:
        """The breaker's check before a drain, reboot, replace or GPU reset of ``node``: held
        (alerted, labelled ``h=breaker``) when too many nodes are out; None: go on."""
        count = self.breaker.count(node)
        if not count.blocks(node.name):
            return None
        self.breaker.alert(self.outbox.episode(), count, f"{what} {node.name}")
        self.labels.write(node, held="breaker")
        return HeldByBreaker(
            f"breaker: {count.others(node.name)} node(s) held, limit {count.limit}"
        )

    # --- applying ---------------------------------------------------------------------------------

    def read_ahead(self, name: str) -> None:
        """Read node ``name``'s state now, for a drain about to be decided
        (``Remediator.read_ahead``); a failed read is left to the drain."""
        started = time.monotonic()
        try:
            node = self.backend.node(name)
        except BackendError as exc:
            log.info("read ahead failed (the drain reads again): %s", exc)
            return
        self.observed(node)
        self.ahead = (started, node)

    def _take_ahead(self, name: str) -> Optional[NodeState]:
        """The read ahead of node ``name`` if it started at most ``FRESH_S`` ago (used once,
        then forgotten)."""
        ahead, self.ahead = self.ahead, None
        if ahead is None or ahead[1].name != name or time.monotonic() - ahead[0] > FRESH_S:
            return None
        return ahead[1]

    def apply(self, row: Row) -> Outcome:
        """Carry out one action; returns what it observed and did. Raises ``BackendError`` to
        retry.

        The node's state is read first; a first drain attempt takes the read ahead instead when
        it started at most ``FRESH_S`` ago (after the fault's event arrived)."""
        fresh = self._take_ahead(row.node) if row.kind == "drain" and row.attempts == 0 else None
        node = fresh or self.backend.node(row.node)
        self.labels.seed(node)  # before a plan can see the node
        self.observed(node)
        if not node.understood:
            return Held(
                f"unknown: Slurm state {node.base}+{'+'.join(sorted(node.flags))} not "
                "understood; doing nothing"
            )
        kind = KINDS.get(row.kind)
        if kind is None:
            return Skipped(f"unknown action kind {row.kind!r}")
        return kind.step(self, node, row)

    def _label(self, node: NodeState, row: Row) -> Outcome:
        self.labels.write(node, held="policy" if self.rec.policy == "none" else "")
        return Done()

    def _hold(self, node: NodeState, row: Row) -> Outcome:
        """Keep a drain (``Episode.held``: taken up from Slurm, or a repeat offender's): label
        it ``h=<held>`` and stay held while the episode holds it in this boot and the drain is
        still hma's. A repeat offender's drain reason says so."""
        ep = self.outbox.episode()
        if ep is None or not ep.holds(self.view().boot_id) or not node.owned:
            return Skipped("nothing to hold any more")
        if ep.held == "human":
            if not self.outbox.human():
                self.outbox.set_human(self.clock())
            if not node.reason.startswith(ep.reason):
                text = self.labels.text(node, self.labels.label_for(node, held=ep.held))
                self.backend.drain(node.name, ep.reason, text)
                return Held(f"{ep.held}: {ep.message}")
        self.labels.write(node, held=ep.held, drained=float(ep.drained_at or 0.0))
        return Held(f"{ep.held}: {ep.message}")

    def _honour(self, node: NodeState, row: Row) -> Outcome:
        """An operator's resume of hma's drain (``planner.operator_resumed``), confirmed on this
        read: labelled ``h=operator`` and honoured for the faults active now."""
        ep, verdict = self.outbox.episode(), self.view().verdict
        if ep is None or ep.id != row.payload.get("episode") or not ep.owned:
            return Skipped("nothing to honour any more")
        if node.out_of_service:
            return Skipped(f"not back in service: {node.label_text} ({node.reason!r})")
        self.labels.write(node, held="operator")
        marks = occurrences(verdict.draining if verdict is not None else ())
        return Honoured(ep.id, self.clock(), marks, HONOURED.format(code=ep.code))

    def _mirror(self, node: NodeState, row: Row) -> Outcome:
        """Write the label field again from the state store (after ``hma reset``)."""
        ep = self.outbox.episode()
        lab = self.labels.label_for(node, held=ep.held if ep is not None else "")
        if lab is None and ep is not None:
            lab = self.labels.recovered(ep)
        text = self.labels.text(node, lab)
        if text is None:
            return Done("the label field is up to date")
        self.backend.label(node.name, text)
        return Done()

    def _drain(self, node: NodeState, row: Row) -> Outcome:
        reason, clock = row.reason, self.clock
        if node.owned and node.out_of_service:
            at = node.reason_time or clock()
            self._record("drain")
            self.labels.write(node)
            return Drained(at, "already drained by hma")
        if node.out_of_service and self._may_adopt(node):
            self._record("drain")
            self.backend.drain(node.name, reason)
            at = clock()
            self.labels.write(replace(node, reason=reason))
            return Adopted(at, node.reason, f"took over Slurm's drain {node.reason!r}")
        if node.out_of_service:
            self.labels.write(node, held="not_owned")
            return NotOwned(f"not owned: left {node.label_text} ({node.reason!r}); labelled only")
        if node.maintenance:
            self.labels.write(node, held="maintenance")
            return Held("maintenance: node is in a maintenance reservation")
        # Count first only when the breaker was open (a held drain, or the last count blocked):
        # otherwise drain at once and count after, undoing a drain beyond the limit (the drain
        # is what a fault needs fast; the count reads the node table).
        if row.state == "held" or self.breaker.was_open(node.name):
            held = self._breaker_holds(node, "drain of")
            if held is not None:
                return held
        self._record("drain")
        label = self.labels.text(node, self.labels.label_for(node, drained=round(clock(), 3)))
        self.backend.drain(node.name, reason, label)
        at = clock()
        drained = replace(node, flags=node.flags | {"DRAIN"}, reason=reason)
        self.observed(drained)
        # Count: nodes failing at the same instant (or past an open breaker) must not get through.
        after = self.breaker.count(drained)
        if after.beyond(node.name):
            return self.undo(node.name, after)
        return Drained(at)

    def undo(self, name: str, count: Count) -> Undone:
        """Resume a drain beyond the breaker's limit; the drain is decided again and held."""
        ep = self.outbox.episode()
        if ep is not None:  # not a remediation after all
            remediations.delete(self.outbox.store, episode=ep.id, action="drain")
        current = self.backend.node(name)
        if current.owned:
            self.backend.resume(
                name, self.labels.text(current, self.labels.label_for(current, held="breaker"))
            )
        self.breaker.alert(self.outbox.episode(), count, f"drain of {name} (undone)")
        return Undone(
            f"breaker: {count.ranked.index(name)} node(s) drained before it; drain undone "
            f"(limit {count.limit})"
        )

    def _may_adopt(self, node: NodeState) -> bool:
        if not self.rec.adopt_slurm_drains or not node.drain or node.owned:
            return False
        ep = self.outbox.episode()
        return ep is not None and ep.code in self.rec.scheduler_codes

    def _down(self, node: NodeState, row: Row) -> Outcome:
        if not node.owned:
            return Skipped(f"not owned: reason is {node.reason!r}")
        if not isinstance(self.backend, SetsDown):
            if not node.busy:
                return Skipped("the drain completed: no job left to kill")
            return Held(unsupported(self.backend, "set a node down; the drain waits for its jobs"))
        self.backend.down(node.name, row.reason)
        return SetDown(self.clock(), "drain did not complete within drain_timeout")

    def _resume(self, node: NodeState, row: Row) -> Outcome:
        ep = self.outbox.episode()
        ours_recovery = bool(node.recovery) and ep is not None and ep.acted is not None
        label = self.labels.text(node, self.labels.recovered(ep))
        if (node.owned and node.out_of_service) or ours_recovery:
            self.backend.resume(node.name, label)
            note = f"resumed ({node.label_text}, {node.reason!r})"
        else:
            if label is not None:
                self.backend.label(node.name, label)
            note = (
                f"label cleared; {node.label_text} ({node.reason!r}) is not hma's, left alone"
                if node.out_of_service
                else "label cleared"
            )
        self.breaker.passed()
        return Resumed(ep.id, note) if ep is not None else Done(note)

    # --- the breaker's recheck --------------------------------------------------------------------

    def recheck(self) -> Optional[Undone]:
        """Every cycle while hma holds a drain it has not acted on yet: if the node turns out to
        be beyond the limit (drains that raced past the recount), undo it (returned, for the
        worker to fold); the drain is decided again and held by the breaker."""
        now = self.clock()
        if now - self._last_recheck < self._recheck_every or self.rec.dry_run:
            return None
        self._last_recheck = now
        ep, name = self.outbox.episode(), self.view().node_name
        if ep is None or ep.phase != "open" or not ep.owned or ep.acted or ep.held or not name:
            self._recheck_every = self.rec.recheck_interval
            return None
        if self.outbox.due():
            return None  # the outbox is busy with this episode; its rows do their own counting
        # a race shows soon after the drain: check often at first, then less (up to heartbeat)
        self._recheck_every = min(2 * self._recheck_every, self.backend.heartbeat)
        try:
            count = self.breaker.count(self.backend.node(name))
            if count.beyond(name):
                return self.undo(name, count)
        except BackendError as exc:
            log.info("breaker recheck skipped: %s", exc)
        return None


@dataclass(frozen=True)
class Kind:
    """One kind of outbox action: what alerts call it and the ``Applier`` step doing it."""

    text: str  # formatted with node, reason, code, action and mode (``Recovery.mode``)
    step: Callable[[Applier, NodeState, Row], Outcome]


# Every kind the planner enqueues.
KINDS: dict[str, Kind] = {
    "label": Kind("label {node} {code}:{action}", Applier._label),
    "hold": Kind("keep {node} drained ({reason})", Applier._hold),
    "drain": Kind("drain {node} ({reason})", Applier._drain),
    "down": Kind("set {node} DOWN ({reason}): drain_timeout passed", Applier._down),
    "reset_gpu": Kind(
        "reset the GPU of {code} on {node}", lambda a, n, r: a.repairs.reset_gpu(n, r)
    ),
    "mirror": Kind("write {node}'s label and history again (hma reset)", Applier._mirror),
    "reboot": Kind("reboot {node} ({mode})", lambda a, n, r: a.repairs.act(n, r)),
    "replace": Kind("replace {node} ({mode})", lambda a, n, r: a.repairs.act(n, r)),
    "resume": Kind("resume {node} and clear its label", Applier._resume),
    "honour": Kind("honour the operator's resume of {node} ({code} active)", Applier._honour),
}


def describe(kind: str, ep: Episode, node: str, rec: Recovery) -> str:
    """What alerts call action ``kind`` of episode ``ep`` on ``node``."""
    known = KINDS.get(kind)
    if known is None:
        return f"{kind} {node}"
    mode = rec.mode(kind)
    return known.text.format(node=node, reason=ep.reason, code=ep.code, action=ep.action, mode=mode)
