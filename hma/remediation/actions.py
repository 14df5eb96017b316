"""Carrying out one outbox action through the cluster backend.

``Applier.apply`` reads the node's state first (one single-node query) and checks that the action
is still right and not already in effect (a restart after ``kill -9`` must not act twice); then it
makes the backend calls: label, drain (counted by the breaker, undone beyond its limit), down,
reboot or replace (through the backend or the configured hook), resume. It returns the outcome:
``done``, ``skipped``, ``held`` (with why) or raises ``BackendError`` (retried).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import replace
from typing import Any, Mapping, Optional

from hma.adapters.command import CommandRunner
from hma.contracts import label as label_mod
from hma.contracts.cluster import (
    HYPERPOD_REBOOT,
    HYPERPOD_REPLACE,
    Backend,
    BackendError,
    NodeState,
)
from hma.contracts.label import Label
from hma.remediation.breaker import Breaker, Count
from hma.remediation.outbox import Outbox, Row
from hma.remediation.planner import Acted, Episode, Reboot, reboot_count
from hma.remediation.shared import Shared

log = logging.getLogger("hma.remediation")

# Oldest read ahead (seconds since it started) that may stand for a drain's own state read: the
# drain then follows the read as closely as when it reads itself (docs/remediation.md).
FRESH_S = 0.5


class Applier:
    """Applies outbox actions for one engine (see module doc)."""

    def __init__(
        self,
        backend: Backend,
        outbox: Outbox,
        breaker: Breaker,
        shared: Shared,
        recovery: Mapping[str, Any],
    ) -> None:
        self.backend = backend
        self.outbox = outbox
        self.breaker = breaker
        self.shared = shared
        self.rec = recovery
        self.field = str(recovery["label_field"])
        self._seeded = False
        self._last_recheck = 0.0
        self._recheck_every = float(recovery["recheck_interval"])

    # --- the episode ------------------------------------------------------------------------------

    def episode(self) -> Optional[Episode]:
        """The open episode."""
        with self.shared.lock:
            return self.outbox.load()[1]

    def _episode_update(self, **changes: Any) -> None:
        with self.shared.lock:
            seq, ep = self.outbox.load()
            if ep is not None:
                with self.outbox.store.transaction() as conn:
                    self.outbox.save(conn, seq, replace(ep, **changes))

    def _reboots_of(self, ep: Episode) -> int:
        window = float(self.rec["reboot_window"])
        return reboot_count(
            self.outbox.reboots(), ep.code, ep.component, self.shared.clock(), window
        )

    def seed_reboots(self, node: NodeState) -> None:
        """After a wiped disk: take reboot counts from the label the cluster still holds."""
        if self._seeded:
            return
        self._seeded = True
        found = label_mod.find(node.field(self.field))
        if found is None or not found.reboots or self.outbox.reboots():
            return
        ts = found.since or self.shared.clock()
        if self.shared.clock() - ts > float(self.rec["reboot_window"]):
            return
        self.outbox.save_reboots([Reboot(found.code, found.component, ts)] * found.reboots)
        log.info("seeded %d reboot(s) of %s from the node label", found.reboots, found.code)

    # --- the label --------------------------------------------------------------------------------

    def _label_for(self, held: str = "", drained: float = 0.0) -> Optional[Label]:
        with self.shared.lock:
            ep = self.episode()
            if ep is None or ep.phase == "resuming":
                return None
            node = self.shared.node
            previous = label_mod.find(node.field(self.field)) if node else None
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
        """The label field's new text, or None when it stays as it is."""
        text = node.field(self.field)
        new = label_mod.edit(text, lab)
        return None if new == text else new

    def _write_label(self, node: NodeState, held: str = "") -> None:
        text = self._label_text(node, self._label_for(held))
        if text is not None:
            self.backend.label(node.name, text)

    # --- applying ---------------------------------------------------------------------------------

    def apply(self, row: Row) -> tuple[str, str]:
        """Carry out one action; returns (outcome, note). Raises ``BackendError`` to retry.

        The node's state is read first; a first drain attempt takes the engine's read ahead
        instead when it started at most ``FRESH_S`` ago (after the fault's event arrived)."""
        fresh = None
        if row.kind == "drain" and row.attempts == 0:
            fresh = self.shared.take_fresh(row.node, FRESH_S)
        node = fresh or self.backend.node(row.node)
        with self.shared.lock:
            self.shared.node = node
            self.seed_reboots(node)
        if not node.understood:
            return "held", (
                f"unknown: Slurm state {node.base}+{'+'.join(sorted(node.flags))} not "
                "understood; doing nothing"
            )
        if row.kind == "label":
            self._write_label(node, held="policy" if self.rec["policy"] == "none" else "")
            return "done", ""
        if row.kind == "resume":
            return self._resume(node)
        if row.kind == "drain":
            return self._drain(node, row)
        if row.kind == "down":
            if not node.owned:
                return "skipped", f"not owned: reason is {node.reason!r}"
            self.backend.down(node.name, row.reason)
            self._episode_update(down_at=self.shared.clock())
            return "done", "drain did not complete within drain_timeout"
        if row.kind in ("reboot", "replace"):
            return self._act(row.kind, node, row)
        return "skipped", f"unknown action kind {row.kind!r}"

    def _drain(self, node: NodeState, row: Row) -> tuple[str, str]:
        reason, clock = row.reason, self.shared.clock
        if node.owned and node.out_of_service:
            self._episode_update(owned=True, drained_at=node.reason_time or clock())
            self._write_label(node)
            return "done", "already drained by hma"
        if node.out_of_service and self._may_adopt(node):
            self.backend.drain(node.name, reason)
            self._episode_update(owned=True, drained_at=clock(), adopted=node.reason)
            self._write_label(replace(node, reason=reason))
            return "done", f"took over Slurm's drain {node.reason!r}"
        if node.out_of_service:
            self._episode_update(owned=False)
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
                self.breaker.alert(self.episode(), count, f"drain of {node.name}")
                self._write_label(node, held="breaker")
                return "held", (
                    f"breaker: {count.others(node.name)} node(s) held, limit {count.limit}"
                )
        label = self._label_text(node, self._label_for(drained=round(clock(), 3)))
        self.backend.drain(node.name, reason, label)
        self._episode_update(owned=True, drained_at=clock())
        drained = replace(node, flags=node.flags | {"DRAIN"}, reason=reason)
        with self.shared.lock:
            self.shared.node = drained
        # Count: nodes failing at the same instant (or past an open breaker) must not get through.
        after = self.breaker.count(drained)
        if after.beyond(node.name):
            return self.undo(node.name, after)
        return "done", ""

    def undo(self, name: str, count: Count) -> tuple[str, str]:
        """Resume a drain beyond the breaker's limit; the drain is decided again and held."""
        current = self.backend.node(name)
        if current.owned:
            self.backend.resume(name, self._label_text(current, self._label_for(held="breaker")))
        self._episode_update(owned=None, drained_at=None)
        self.breaker.alert(self.episode(), count, f"drain of {name} (undone)")
        return "held", (
            f"breaker: {count.held.index(name)} node(s) held before it; drain undone "
            f"(limit {count.limit})"
        )

    def _may_adopt(self, node: NodeState) -> bool:
        if not self.rec["adopt_slurm_drains"] or not node.drain or node.owned:
            return False
        ep = self.episode()
        return ep is not None and ep.code.startswith("SLURM_")

    def _act(self, kind: str, node: NodeState, row: Row) -> tuple[str, str]:
        with self.shared.lock:
            boot_now = self.shared.boot_id
            ep = self.episode()
        mode = str(self.rec["reboot_mode"] if kind == "reboot" else self.rec["replace_mode"])
        hyper = HYPERPOD_REBOOT if kind == "reboot" else HYPERPOD_REPLACE
        # Already in effect? (a restart after kill -9 must not act twice)
        if row.payload.get("boot_id") and boot_now and row.payload["boot_id"] != boot_now:
            return "done", "the node rebooted since"
        if kind == "reboot" and mode == "scontrol" and node.reboot_pending:
            self._count_reboot(ep)
            return "done", "reboot already requested"
        if mode == "hyperpod" and node.fail and node.reason == hyper:
            if kind == "reboot":
                self._count_reboot(ep)
            return "done", f"already State=FAIL Reason={hyper}"
        if not (node.owned and node.out_of_service):
            return "skipped", f"not owned: reason is {node.reason!r}"
        acted = Acted(kind, boot_now, self.shared.clock())
        if kind == "replace":
            self._take_spare(node.name, ep)
        if kind == "replace" and mode == "drain_only":
            self._write_label(node)
            self._episode_update(acted=acted)
            return "done", "left drained for a human (replace_mode = drain_only)"
        count = self.breaker.count(node)
        if count.blocks(node.name):
            self.breaker.alert(ep, count, f"{kind} of {node.name}")
            self._write_label(node, held="breaker")
            return "held", f"breaker: {count.others(node.name)} node(s) held, limit {count.limit}"
        if kind == "reboot":
            last = self.outbox.last_reboot()
            interval = float(self.rec["min_reboot_interval"])
            since = self.shared.clock() - last
            if last and since < interval:
                self._write_label(node, held="rate")
                return "held", (
                    f"rate: last reboot {since:.0f} s ago, min_reboot_interval {interval:.0f} s"
                )
        self._write_label(node)
        if mode == "command":
            self._hook(kind, node.name, row, ep)
        elif kind == "reboot":
            self.backend.reboot(node.name, row.reason, mode)
        else:
            self.backend.replace(node.name, row.reason, mode)
        self._episode_update(acted=replace(acted, at=self.shared.clock()))
        if kind == "reboot":
            self._count_reboot(ep)
            with self.shared.lock:
                self.shared.node = replace(node, flags=node.flags | {"REBOOT_REQUESTED"})
        return "done", f"{kind} via {mode}"

    def _take_spare(self, name: str, ep: Optional[Episode]) -> str:
        """A healthy spare of the node's domain resumed in its place, once per episode
        (``[topology] spares_per_domain``); its name, "" when none."""
        with self.shared.lock:
            domain, wanted, (taken_for, spare) = (
                self.shared.domain,
                self.shared.spares,
                self.shared.spare,
            )
        key = ep.id if ep is not None else 0
        if spare and taken_for == key:
            return spare
        if not domain or not wanted:
            return ""
        spare = self.backend.take_spare(name, domain) or ""
        with self.shared.lock:
            self.shared.spare = (key, spare)
        log.info("replace of %s: spare %s of domain %s", name, spare or "(none)", domain)
        return spare

    def _count_reboot(self, ep: Optional[Episode]) -> None:
        """Count one reboot of the episode's fault (once per episode and boot)."""
        if ep is None:
            return
        with self.shared.lock:
            now, boot = self.shared.clock(), self.shared.boot_id
            window = float(self.rec["reboot_window"])
            rows = [r for r in self.outbox.reboots() if now - r.ts <= window]
            if any(r.episode == ep.id and r.boot_id == boot for r in rows):
                return
            rows.append(Reboot(ep.code, ep.component, now, ep.id, boot))
            self.outbox.save_reboots(rows, last_reboot=now)
            self._episode_update(acted=Acted("reboot", boot, now))

    def _hook(self, kind: str, node: str, row: Row, ep: Optional[Episode]) -> None:
        argv = self.rec["reboot_command"] if kind == "reboot" else self.rec["replace_command"]
        verdict = self.shared.verdict
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
                        "domain": self.shared.domain,
                        "spare": self._take_spare(node, ep) if kind == "replace" else "",
                    },
                    fh,
                )
            env = self.backend.env()
            env.update(
                HMA_NODE=node,
                HMA_ACTION=kind,
                HMA_REASON=row.reason,
                HMA_ACTION_ID=row.key,
                HMA_FINDINGS_FILE=path,
                HMA_DOMAIN=self.shared.domain,
                HMA_SPARE=self._take_spare(node, ep) if kind == "replace" else "",
            )
            result = CommandRunner().run(list(argv), float(self.rec["command_timeout"]), env=env)
        finally:
            os.unlink(path)
        if not result.ok:
            err = (result.stderr.strip() or result.stdout.strip() or result.error)[-300:]
            what = "timed out" if result.timed_out else f"exited {result.rc}"
            raise BackendError(f"{kind} hook {what}: {err}")

    def _resume(self, node: NodeState) -> tuple[str, str]:
        ep = self.episode()
        ours_hyper = (
            node.fail
            and node.reason in (HYPERPOD_REBOOT, HYPERPOD_REPLACE)
            and ep is not None
            and ep.acted is not None
        )
        label = self._label_text(node, self._resume_label(ep))
        if (node.owned and node.out_of_service) or ours_hyper:
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
        with self.shared.lock:
            seq, current = self.outbox.load()
            if current is not None and ep is not None and current.id == ep.id:
                if current.phase == "resuming":
                    current = None
                else:  # the fault came back while resuming: decide the drain again
                    current = replace(current, owned=None, drained_at=None, acted=None)
                with self.outbox.store.transaction() as conn:
                    self.outbox.save(conn, seq, current)
            self.breaker.alerted = False
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
            default=self.shared.clock(),
        )
        return Label("recovered", ep.code, "reboot", ep.component, last, count)

    # --- the breaker's recheck --------------------------------------------------------------------

    def recheck(self) -> None:
        """Every cycle while hma holds a drain it has not acted on yet: if the node turns out to
        be beyond the limit (drains that raced past the recount), undo it; the drain is decided
        again and held by the breaker."""
        now = self.shared.clock()
        if now - self._last_recheck < self._recheck_every or self.rec["dry_run"]:
            return
        self._last_recheck = now
        with self.shared.lock:
            ep = self.episode()
            name = self.shared.node_name
        if ep is None or ep.phase != "open" or not ep.owned or ep.acted or not name:
            self._recheck_every = float(self.rec["recheck_interval"])
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
