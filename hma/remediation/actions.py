"""Carrying out one outbox action through the cluster backend.

``KINDS`` is the one table of action kinds: what alerts call each kind (``describe``) and the
``Applier`` step that carries it out. ``Applier.apply`` reads the node's state first (one
single-node query) and checks that the action is still right and not already in effect (a restart
after ``kill -9`` must not act twice); then it makes the backend calls: label, drain (counted by
the breaker, undone beyond its limit), down, GPU reset (``nvidia-smi --gpu-reset``), reboot or
replace (through the backend's capability or the configured hook), resume. It returns the
outcome: ``done``, ``skipped``, ``held`` (with why, also when the backend lacks the capability the
action needs) or raises ``BackendError`` (retried). Each remediation is recorded in the state
store and mirrored, with the hold for a human, in the label field (``hmah=``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Protocol

from hma.adapters.command import CommandRunner
from hma.adapters.text import printable
from hma.contracts import label as label_mod
from hma.contracts.cluster import (
    Backend,
    BackendError,
    NodeState,
    Reboots,
    Replaces,
    SetsDown,
    TakesSpares,
)
from hma.contracts.label import Label
from hma.health.model import Verdict
from hma.remediation.breaker import Breaker, Count
from hma.remediation.options import Recovery
from hma.remediation.outbox import Outbox, Row
from hma.remediation.planner import Acted, Episode, Reboot, reboot_count

# A GPU component as hma names it (``gpu:<domain>:<bus>:<device>``, hex).
_GPU = re.compile(r"gpu:([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})")

log = logging.getLogger("hma.remediation")

# Oldest read ahead (seconds since it started) that may stand for a drain's own state read: the
# drain then follows the read as closely as when it reads itself (docs/remediation.md).
FRESH_S = 0.5
# Reboot/replace modes the engine carries out itself (the hook; leaving the node drained for a
# human); every other mode is the backend's to read (its ``Reboots``/``Replaces``).
ENGINE_MODES = ("command", "drain_only")


class EngineView(Protocol):
    """What the Applier reads of the engine's state (a snapshot it never changes)."""

    @property
    def node_name(self) -> Optional[str]:
        """This node's name in the cluster (None: not known yet)."""

    @property
    def boot_id(self) -> str:
        """The current boot's id."""

    @property
    def verdict(self) -> Optional[Verdict]:
        """The latest verdict."""

    @property
    def domain(self) -> str:
        """This node's NVLink domain ("" unknown)."""


class Applier:
    """Applies outbox actions for one engine (see module doc). ``view``: the engine's state now;
    ``observed``: told each node state an action read or brought about; ``spares``: ``[topology]
    spares_per_domain``. Only the engine's worker (or a one-shot caller) applies actions."""

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
        gpu_reset_done: Callable[[str, float], None] = lambda _gpu, _at: None,
    ) -> None:
        self.backend = backend
        self.gpu_reset_done = gpu_reset_done  # told (component, end time) of each GPU reset
        self.outbox = outbox
        self.breaker = breaker
        self.rec = recovery
        self.clock = clock
        self.view = view
        self.observed = observed
        self.spares = spares
        # A read ahead of the node's state (monotonic start time, state) a drain may use once
        self.ahead: Optional[tuple[float, NodeState]] = None
        self._spare: tuple[int, str] = (0, "")  # (episode, spare) resumed for its replace
        self._seeded = False
        self._last_recheck = 0.0
        self._recheck_every = recovery.recheck_interval

    # --- the episode ------------------------------------------------------------------------------

    def _reboots_of(self, ep: Episode) -> int:
        return reboot_count(
            self.outbox.reboots(), ep.code, ep.component, self.clock(), self.rec.reboot_window
        )

    def seed_reboots(self, node: NodeState) -> None:
        """After a wiped disk: take reboot counts from the label the cluster still holds, and
        the remediations and the hold for a human from its history mirror."""
        with self.outbox.lock:
            if self._seeded:
                return
            self._seeded = True
            mirror = label_mod.find_history(node.field(self.rec.label_field))
            if mirror is not None and self.outbox.seed_history(mirror):
                log.info("seeded %d remediation(s) from the node's history", len(mirror.entries))
            found = label_mod.find(node.field(self.rec.label_field))
            if found is None or not found.reboots or self.outbox.reboots():
                return
            ts = found.since or self.clock()
            if self.clock() - ts > self.rec.reboot_window:
                return
            self.outbox.save_reboots([Reboot(found.code, found.component, ts)] * found.reboots)
        log.info("seeded %d reboot(s) of %s from the node label", found.reboots, found.code)

    # --- the label --------------------------------------------------------------------------------

    def _label_for(self, node: NodeState, held: str = "", drained: float = 0.0) -> Optional[Label]:
        ep = self.outbox.episode()
        if ep is None or ep.phase == "resuming":
            return None
        previous = label_mod.find(node.field(self.rec.label_field))
        return Label(
            "unhealthy",
            ep.code,
            ep.action,
            ep.component,
            float(ep.since),
            self._reboots_of(ep),
            tuple(ep.jobs),
            held,
            drained or (previous.drained if previous and not held else 0.0),
        )

    def _label_text(self, node: NodeState, lab: Optional[Label]) -> Optional[str]:
        """The label field's new text (the label and the history mirror), or None when it stays
        as it is."""
        text = node.field(self.rec.label_field)
        history = self.outbox.history(self.clock(), self.rec.remediation_window)
        new = label_mod.edit_history(label_mod.edit(text, lab), history)
        return None if new == text else new

    def _record(self, action: str) -> None:
        """Record a remediation of the open episode (before the call that carries it, so that
        the label written with it mirrors it)."""
        ep = self.outbox.episode()
        if ep is not None:
            self.outbox.record(ep, action, self.view().boot_id, self.clock())

    def _write_label(self, node: NodeState, held: str = "", drained: float = 0.0) -> None:
        text = self._label_text(node, self._label_for(node, held, drained))
        if text is not None:
            self.backend.label(node.name, text)

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

    def apply(self, row: Row) -> tuple[str, str]:
        """Carry out one action; returns (outcome, note). Raises ``BackendError`` to retry.

        The node's state is read first; a first drain attempt takes the read ahead instead when
        it started at most ``FRESH_S`` ago (after the fault's event arrived)."""
        fresh = self._take_ahead(row.node) if row.kind == "drain" and row.attempts == 0 else None
        node = fresh or self.backend.node(row.node)
        self.seed_reboots(node)  # before a plan can see the node
        self.observed(node)
        if not node.understood:
            return "held", (
                f"unknown: Slurm state {node.base}+{'+'.join(sorted(node.flags))} not "
                "understood; doing nothing"
            )
        kind = KINDS.get(row.kind)
        if kind is None:
            return "skipped", f"unknown action kind {row.kind!r}"
        return kind.step(self, node, row)

    def _unsupported(self, what: str) -> str:
        """The held note of an action the backend has no capability for."""
        name = self.backend.name or type(self.backend).__name__
        return f"unsupported: the {name} backend cannot {what}"

    def _label(self, node: NodeState, row: Row) -> tuple[str, str]:
        self._write_label(node, held="policy" if self.rec.policy == "none" else "")
        return "done", ""

    def _hold(self, node: NodeState, row: Row) -> tuple[str, str]:
        """Keep a drain (``Episode.held``: taken up from Slurm, or a repeat offender's): label
        it ``h=<held>`` and stay held while the episode holds it in this boot and the drain is
        still hma's. A repeat offender's drain reason says so."""
        ep = self.outbox.episode()
        if ep is None or not ep.holds(self.view().boot_id) or not node.owned:
            return "skipped", "nothing to hold any more"
        if ep.held == "human":
            if not self.outbox.human():
                self.outbox.set_human(self.clock())
            if not node.reason.startswith(ep.reason):
                text = self._label_text(node, self._label_for(node, held=ep.held))
                self.backend.drain(node.name, ep.reason, text)
                return "held", f"{ep.held}: {ep.message}"
        self._write_label(node, held=ep.held, drained=float(ep.drained_at or 0.0))
        return "held", f"{ep.held}: {ep.message}"

    def _mirror(self, node: NodeState, row: Row) -> tuple[str, str]:
        """Write the label field again from the state store (after ``hma reset``)."""
        ep = self.outbox.episode()
        lab = self._label_for(node, held=ep.held if ep is not None else "")
        if lab is None and ep is not None:
            lab = self._resume_label(ep)
        text = self._label_text(node, lab)
        if text is None:
            return "done", "the label field is up to date"
        self.backend.label(node.name, text)
        return "done", ""

    def _drain(self, node: NodeState, row: Row) -> tuple[str, str]:
        reason, clock = row.reason, self.clock
        if node.owned and node.out_of_service:
            self.outbox.change(owned=True, drained_at=node.reason_time or clock())
            self._record("drain")
            self._write_label(node)
            return "done", "already drained by hma"
        if node.out_of_service and self._may_adopt(node):
            self._record("drain")
            self.backend.drain(node.name, reason)
            self.outbox.change(owned=True, drained_at=clock(), adopted=node.reason)
            self._write_label(replace(node, reason=reason))
            return "done", f"took over Slurm's drain {node.reason!r}"
        if node.out_of_service:
            self.outbox.change(owned=False)
            self._write_label(node, held="not_owned")
            return "done", f"not owned: left {node.label_text} ({node.reason!r}); labelled only"
        if node.maintenance:
            self._write_label(node, held="maintenance")
            return "held", "maintenance: node is in a maintenance reservation"
        # Count first only when the breaker was open (a held drain, or the last count blocked):
        # otherwise drain at once and count after, undoing a drain beyond the limit (the drain
        # is what a fault needs fast; the count reads the node table).
        if row.state == "held" or self.breaker.was_open(node.name):
            count = self.breaker.count(node)
            if count.blocks(node.name):
                self.breaker.alert(self.outbox.episode(), count, f"drain of {node.name}")
                self._write_label(node, held="breaker")
                return "held", (
                    f"breaker: {count.others(node.name)} node(s) held, limit {count.limit}"
                )
        self._record("drain")
        label = self._label_text(node, self._label_for(node, drained=round(clock(), 3)))
        self.backend.drain(node.name, reason, label)
        self.outbox.change(owned=True, drained_at=clock())
        drained = replace(node, flags=node.flags | {"DRAIN"}, reason=reason)
        self.observed(drained)
        # Count: nodes failing at the same instant (or past an open breaker) must not get through.
        after = self.breaker.count(drained)
        if after.beyond(node.name):
            return self.undo(node.name, after)
        return "done", ""

    def undo(self, name: str, count: Count) -> tuple[str, str]:
        """Resume a drain beyond the breaker's limit; the drain is decided again and held."""
        ep = self.outbox.episode()
        if ep is not None:  # not a remediation after all
            self.outbox.store.delete_remediations(episode=ep.id, action="drain")
        current = self.backend.node(name)
        if current.owned:
            self.backend.resume(
                name, self._label_text(current, self._label_for(current, held="breaker"))
            )
        self.outbox.change(owned=None, drained_at=None)
        self.breaker.alert(self.outbox.episode(), count, f"drain of {name} (undone)")
        return "held", (
            f"breaker: {count.held.index(name)} node(s) held before it; drain undone "
            f"(limit {count.limit})"
        )

    def _may_adopt(self, node: NodeState) -> bool:
        if not self.rec.adopt_slurm_drains or not node.drain or node.owned:
            return False
        ep = self.outbox.episode()
        return ep is not None and ep.code in self.rec.scheduler_codes

    def _down(self, node: NodeState, row: Row) -> tuple[str, str]:
        if not node.owned:
            return "skipped", f"not owned: reason is {node.reason!r}"
        if not isinstance(self.backend, SetsDown):
            if not node.busy:
                return "skipped", "the drain completed: no job left to kill"
            return "held", self._unsupported("set a node down; the drain waits for its jobs")
        self.backend.down(node.name, row.reason)
        self.outbox.change(down_at=self.clock())
        return "done", "drain did not complete within drain_timeout"

    def _backend_step(self, kind: str) -> Optional[Callable[[str, str, str], None]]:
        """The backend's own reboot or replace, None when it has not that capability."""
        if kind == "reboot":
            return self.backend.reboot if isinstance(self.backend, Reboots) else None
        return self.backend.replace if isinstance(self.backend, Replaces) else None

    def _in_effect(self, kind: str, node: NodeState, mode: str) -> str:
        """Why the backend's reboot or replace in ``mode`` is in effect already ("" not)."""
        if kind == "reboot" and isinstance(self.backend, Reboots):
            return self.backend.rebooting(node, mode)
        if kind == "replace" and isinstance(self.backend, Replaces):
            return self.backend.replacing(node, mode)
        return ""

    def _act(self, node: NodeState, row: Row) -> tuple[str, str]:
        """A reboot or replace (``row.kind``)."""
        kind, mode = row.kind, self.rec.mode(row.kind)
        boot_now = self.view().boot_id
        ep = self.outbox.episode()
        by_backend = mode not in ENGINE_MODES
        # Already in effect? (a restart after kill -9 must not act twice)
        if row.payload.get("boot_id") and boot_now and row.payload["boot_id"] != boot_now:
            return "done", "the node rebooted since"
        done = self._in_effect(kind, node, mode) if by_backend else ""
        if done:
            self._record(kind)
            if kind == "reboot":
                self._count_reboot(ep)
            return "done", done
        if not (node.owned and node.out_of_service):
            return "skipped", f"not owned: reason is {node.reason!r}"
        step = self._backend_step(kind) if by_backend else None
        if by_backend and step is None:
            self._write_label(node, held="unsupported")
            return "held", self._unsupported(f"{kind} a node ({kind}_mode = {mode})")
        acted = Acted(kind, boot_now, self.clock())
        if kind == "replace":
            self._take_spare(node.name, ep)
        if kind == "replace" and mode == "drain_only":
            self._record(kind)
            self._write_label(node)
            self.outbox.change(acted=acted)
            return "done", "left drained for a human (replace_mode = drain_only)"
        count = self.breaker.count(node)
        if count.blocks(node.name):
            self.breaker.alert(ep, count, f"{kind} of {node.name}")
            self._write_label(node, held="breaker")
            return "held", f"breaker: {count.others(node.name)} node(s) held, limit {count.limit}"
        if kind == "reboot":
            last = self.outbox.last_reboot()
            interval = self.rec.min_reboot_interval
            since = self.clock() - last
            if last and since < interval:
                self._write_label(node, held="rate")
                return "held", (
                    f"rate: last reboot {since:.0f} s ago, min_reboot_interval {interval:.0f} s"
                )
        self._record(kind)
        self._write_label(node)
        if step is None:  # mode "command" (drain_only is done above)
            self._hook(kind, node.name, row, ep)
        else:
            step(node.name, row.reason, mode)
        self.outbox.change(acted=replace(acted, at=self.clock()))
        if kind == "reboot":
            self._count_reboot(ep)
            self.observed(replace(node, flags=node.flags | {"REBOOT_REQUESTED"}))
        return "done", f"{kind} via {mode}"

    def _reset_gpu(self, node: NodeState, row: Row) -> tuple[str, str]:
        """The GPU reset of the episode's GPU (``nvidia-smi --gpu-reset -i <bus id>``): only on
        a drained node hma owns, past the breaker. Refused (a process holds the GPU) or failed,
        the episode records it and the planner goes on to the reboot."""
        ep = self.outbox.episode()
        gpu = str(row.payload.get("gpu") or "")
        reset = ep.gpu_reset if ep is not None else None
        if ep is None or reset is None or reset.component != gpu:
            return "skipped", "no GPU reset is asked for any more"
        if reset.ok is not None:
            return "done", "carried out already"  # a restart after kill -9: not twice
        bus = pci_bus_id(gpu)
        why = ""
        if not (node.owned and node.out_of_service):
            why = f"not owned: reason is {node.reason!r}"
        elif node.busy:
            why = f"jobs still on the node ({node.label_text})"
        elif bus is None:
            why = f"{gpu!r} is not a GPU's PCI address"
        if why:
            self.outbox.change(gpu_reset=replace(reset, ok=False, note=why))
            return "skipped", f"GPU reset not done: {why}; the next rung follows"
        count = self.breaker.count(node)
        if count.blocks(node.name):
            self.breaker.alert(ep, count, f"GPU reset on {node.name}")
            self._write_label(node, held="breaker")
            return "held", f"breaker: {count.others(node.name)} node(s) held, limit {count.limit}"
        self._record("reset_gpu")
        self._write_label(node)
        argv = [*self.rec.gpu_reset_command, "--gpu-reset", "-i", str(bus)]
        result = CommandRunner().run(argv, self.rec.gpu_reset_timeout)
        at, boot = self.clock(), self.view().boot_id
        out = printable((result.stdout.strip() + " " + result.stderr.strip()).strip())[:300]
        if not result.ok:
            what = "timed out" if result.timed_out else f"exited {result.rc}"
            note = f"GPU reset of {gpu} failed ({what}): {out or result.error}"
            self.outbox.change(gpu_reset=replace(reset, at=at, boot_id=boot, ok=False, note=note))
            return "skipped", f"{note}; the next rung follows"
        self.outbox.change(gpu_reset=replace(reset, at=at, boot_id=boot, ok=True, note=out))
        self.gpu_reset_done(gpu, at)
        return "done", f"GPU reset of {gpu}: {out}" if out else f"GPU reset of {gpu}"

    def _take_spare(self, name: str, ep: Optional[Episode]) -> str:
        """A healthy spare of the node's domain resumed in its place, once per episode
        (``[topology] spares_per_domain``); its name, "" when none."""
        domain = self.view().domain
        taken_for, spare = self._spare
        key = ep.id if ep is not None else 0
        if spare and taken_for == key:
            return spare
        if not domain or not self.spares:
            return ""
        if not isinstance(self.backend, TakesSpares):
            log.warning("replace of %s: %s", name, self._unsupported("take a spare"))
            return ""
        spare = self.backend.take_spare(name, domain) or ""
        self._spare = (key, spare)
        log.info("replace of %s: spare %s of domain %s", name, spare or "(none)", domain)
        return spare

    def _count_reboot(self, ep: Optional[Episode]) -> None:
        """Count one reboot of the episode's fault (once per episode and boot)."""
        if ep is None:
            return
        with self.outbox.lock:
            now, boot = self.clock(), self.view().boot_id
            rows = [r for r in self.outbox.reboots() if now - r.ts <= self.rec.reboot_window]
            if any(r.episode == ep.id and r.boot_id == boot for r in rows):
                return
            rows.append(Reboot(ep.code, ep.component, now, ep.id, boot))
            self.outbox.save_reboots(rows, last_reboot=now)
            self.outbox.change(acted=Acted("reboot", boot, now))

    def _hook(self, kind: str, node: str, row: Row, ep: Optional[Episode]) -> None:
        known = self.view()
        verdict = known.verdict
        findings = [f.to_json() for f in (verdict.draining if verdict is not None else ())]
        fd, path = tempfile.mkstemp(prefix="hma-findings-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(
                    {
                        "node": node,
                        "action": kind,
                        "reason": row.reason,
                        "jobs": list(ep.jobs) if ep else [],
                        "findings": findings,
                        "domain": known.domain,
                        "spare": self._take_spare(node, ep) if kind == "replace" else "",
                    },
                    fh,
                )
            env = {**os.environ, **self.backend.env()}
            env.update(
                HMA_NODE=node,
                HMA_ACTION=kind,
                HMA_REASON=row.reason,
                HMA_ACTION_ID=row.key,
                HMA_FINDINGS_FILE=path,
                HMA_DOMAIN=known.domain,
                HMA_SPARE=self._take_spare(node, ep) if kind == "replace" else "",
            )
            argv = list(self.rec.command(kind))
            result = CommandRunner().run(argv, self.rec.command_timeout, env=env)
        finally:
            os.unlink(path)
        if not result.ok:
            err = (result.stderr.strip() or result.stdout.strip() or result.error)[-300:]
            what = "timed out" if result.timed_out else f"exited {result.rc}"
            raise BackendError(f"{kind} hook {what}: {err}")

    def _resume(self, node: NodeState, row: Row) -> tuple[str, str]:
        ep = self.outbox.episode()
        ours_recovery = bool(node.recovery) and ep is not None and ep.acted is not None
        label = self._label_text(node, self._resume_label(ep))
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
        with self.outbox.lock:
            seq, current = self.outbox.load()
            if current is not None and ep is not None and current.id == ep.id:
                if current.phase == "resuming":
                    current = None
                else:  # the fault came back while resuming: decide the drain again
                    current = replace(current, owned=None, drained_at=None, acted=None)
                with self.outbox.store.transaction() as conn:
                    self.outbox.save(conn, seq, current)
        self.breaker.passed()
        return "done", note

    def _resume_label(self, ep: Optional[Episode]) -> Optional[Label]:
        """After recovery: keep the reboot count in the label while it is inside the window."""
        if ep is None:
            return None
        count = self._reboots_of(ep)
        if not count:
            return None
        last = max(
            (r.ts for r in self.outbox.reboots() if r.code == ep.code),
            default=self.clock(),
        )
        return Label("recovered", ep.code, "reboot", ep.component, last, count)

    # --- the breaker's recheck --------------------------------------------------------------------

    def recheck(self) -> None:
        """Every cycle while hma holds a drain it has not acted on yet: if the node turns out to
        be beyond the limit (drains that raced past the recount), undo it; the drain is decided
        again and held by the breaker."""
        now = self.clock()
        if now - self._last_recheck < self._recheck_every or self.rec.dry_run:
            return
        self._last_recheck = now
        ep, name = self.outbox.episode(), self.view().node_name
        if ep is None or ep.phase != "open" or not ep.owned or ep.acted or ep.held or not name:
            self._recheck_every = self.rec.recheck_interval
            return
        if self.outbox.due():
            return  # the outbox is busy with this episode; its rows do their own counting
        # a race shows soon after the drain: check often at first, then less (up to heartbeat)
        self._recheck_every = min(2 * self._recheck_every, self.backend.heartbeat)
        try:
            count = self.breaker.count(self.backend.node(name))
            if count.beyond(name):
                self.undo(name, count)
        except BackendError as exc:
            log.info("breaker recheck skipped: %s", exc)


@dataclass(frozen=True)
class Kind:
    """One kind of outbox action: what alerts call it and the ``Applier`` step doing it."""

    text: str  # formatted with node, reason, code, action and mode (``Recovery.mode``)
    step: Callable[[Applier, NodeState, Row], tuple[str, str]]


# Every kind the planner enqueues.
KINDS: dict[str, Kind] = {
    "label": Kind("label {node} {code}:{action}", Applier._label),
    "hold": Kind("keep {node} drained ({reason})", Applier._hold),
    "drain": Kind("drain {node} ({reason})", Applier._drain),
    "down": Kind("set {node} DOWN ({reason}): drain_timeout passed", Applier._down),
    "reset_gpu": Kind("reset the GPU of {code} on {node}", Applier._reset_gpu),
    "mirror": Kind("write {node}'s label and history again (hma reset)", Applier._mirror),
    "reboot": Kind("reboot {node} ({mode})", Applier._act),
    "replace": Kind("replace {node} ({mode})", Applier._act),
    "resume": Kind("resume {node} and clear its label", Applier._resume),
}


def pci_bus_id(component: str) -> Optional[str]:
    """The PCI bus id nvidia-smi names a GPU by (``00000000:3B:00.0``) of a GPU component
    (``gpu:0000:3b:00``); None when ``component`` is not one."""
    m = _GPU.fullmatch(component)
    if m is None:
        return None
    return f"{m.group(1).zfill(8)}:{m.group(2)}:{m.group(3)}.0".upper()


def describe(kind: str, ep: Episode, node: str, rec: Recovery) -> str:
    """What alerts call action ``kind`` of episode ``ep`` on ``node``."""
    known = KINDS.get(kind)
    if known is None:
        return f"{kind} {node}"
    mode = rec.mode(kind)
    return known.text.format(node=node, reason=ep.reason, code=ep.code, action=ep.action, mode=mode)
