"""What the watcher does about each node, decided from one read of the node table and its own
state (pure: no I/O).

A node is watched for three conditions, each timed from the pass that first saw it (whatever
the node's reason says: an ``HMA:`` drain, an admin's, none): ``not_responding`` (slurmctld
cannot reach its slurmd: ``DOWN*``, ``NOT_RESPONDING``), ``reboot_issued`` (``REBOOT_ISSUED``)
and ``completing``. Not responding past ``down_after``: a reboot out of band; ``REBOOT_ISSUED``
past the reboot deadline, or not back that long after the watcher's own reboot: a replace;
``COMPLETING`` past ``completing_after``: a report (a reboot with ``completing_action``). A node
whose agent read a crash of its previous boot (its post-mortem, ``hmap=``: docs/watch.md) is
reported while the token stays: what ended the boot the watcher may have power-cycled.

Holds, in order: maintenance (a maintenance reservation, an active ``hma-maint=`` word, any
reservation with ``hold_reserved``), the repeat-offender memory the agents keep in ``hmah=``
(held for a human, or this remediation would be one more than ``max_remediations`` within
``remediation_window``), and the fleet-wide breaker: when more nodes are not responding (or
not back from the watcher's action) than ``breaker.limit_for`` allows of the whole node table
(``max_drained_percent``, ``max_drained_nodes``), the cause is the network, the controller or the
power: the watcher holds every action of the pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from hma.contracts import label, maintenance
from hma.contracts.cluster import NodeState
from hma.remediation.breaker import limit_for
from hma.watch.options import Watch
from hma.watch.state import Action

NOT_RESPONDING = "HMA_WATCH_NOT_RESPONDING"
NO_BOOT = "HMA_WATCH_NO_BOOT"
COMPLETING = "HMA_WATCH_COMPLETING"
BREAKER = "HMA_WATCH_BREAKER_OPEN"
POWER_FLAGS = frozenset({"POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP"})


@dataclass(frozen=True)
class Limits:
    """The ``[recovery]`` keys the watcher shares with the agents."""

    label_field: str
    percent: float
    max_nodes: Optional[int]
    max_remediations: int
    window: float


@dataclass(frozen=True)
class Decision:
    """What the watcher does (or would do) about one node this pass."""

    node: str
    kind: str  # reboot, replace, report, back, postmortem
    code: str
    why: str
    held: str = ""  # why it is not done: passive, maintenance, reservation, ...
    action: Optional[Action] = None  # the record a retry or an escalation continues
    count: bool = True  # a new remediation for the repeat-offender memory

    @property
    def acts(self) -> bool:
        """A reboot or replace to carry out now."""
        return self.kind in ("reboot", "replace") and not self.held

    def to_json(self) -> dict[str, Any]:
        """The form kept in the state file and shown by ``hma fleet``."""
        return {
            "node": self.node,
            "kind": self.kind,
            "code": self.code,
            "why": self.why,
            "held": self.held or None,
            "action_id": self.action.id if self.action is not None else None,
        }


@dataclass(frozen=True)
class Plan:
    """One pass's decisions, what it saw since when, and the breaker."""

    decisions: tuple[Decision, ...]
    seen: dict[str, dict[str, float]]
    affected: tuple[str, ...]
    total: int
    limit: int

    @property
    def open(self) -> bool:
        """The fleet-wide breaker holds every action."""
        return len(self.affected) > self.limit

    def breaker(self) -> dict[str, Any]:
        """The breaker's state for the state file and ``hma fleet``."""
        return {
            "affected": list(self.affected),
            "total": self.total,
            "limit": self.limit,
            "open": self.open,
        }


def conditions(node: NodeState) -> list[str]:
    """The watched conditions ``node`` is in now (none when Slurm reports a state or flag hma
    does not understand: no action on what it cannot read)."""
    if not node.understood:
        return []
    out = []
    powered = node.flags & POWER_FLAGS or node.base == "future"
    if node.not_responding and not node.reboot_pending and not powered:
        out.append("not_responding")
    if "REBOOT_ISSUED" in node.flags:
        out.append("reboot_issued")
    if "COMPLETING" in node.flags or node.base == "completing":
        out.append("completing")
    return out


def back(node: NodeState) -> bool:
    """The node answers again, with no reboot or recovery under way."""
    return not (node.not_responding or node.reboot_pending or node.recovery)


def observe(
    nodes: Sequence[NodeState], seen: Mapping[str, Mapping[str, float]], now: float
) -> dict[str, dict[str, float]]:
    """Since when each node is in each of its conditions (a condition gone is forgotten)."""
    out: dict[str, dict[str, float]] = {}
    for node in nodes:
        before = seen.get(node.name, {})
        conds = {c: float(before.get(c, now)) for c in conditions(node)}
        if conds:
            out[node.name] = conds
    return out


def plan(
    nodes: Sequence[NodeState],
    seen: Mapping[str, Mapping[str, float]],
    actions: Mapping[str, Action],
    cfg: Watch,
    deadline: float,
    limits: Limits,
    now: float,
) -> Plan:
    """The pass's plan (see the module doc); ``deadline``: the reboot deadline in seconds."""
    since = observe(nodes, seen, now)
    found = []
    for node in nodes:
        item = _decide(node, since.get(node.name, {}), actions.get(node.name), cfg, deadline, now)
        if item is not None:
            found.append(item)
        post = label.find_postmortem(node.field(limits.label_field), now)
        if post is not None:
            read = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(post.ts))
            why = f"its previous boot ended in {post.cause} (its agent's post-mortem, {read})"
            found.append(Decision(node.name, "postmortem", label.POSTMORTEM_CODE, why))
    affected = tuple(
        n.name
        for n in nodes
        if "not_responding" in since.get(n.name, {}) or (n.name in actions and not back(n))
    )
    limit = limit_for(len(nodes), limits.percent, limits.max_nodes)
    by_name = {n.name: n for n in nodes}
    open_ = len(affected) > limit  # Plan.open
    held = tuple(_hold(d, by_name[d.node], open_, cfg, limits, now) for d in found)
    return Plan(held, since, affected, len(nodes), limit)


def _decide(
    node: NodeState,
    since: Mapping[str, float],
    act: Optional[Action],
    cfg: Watch,
    deadline: float,
    now: float,
) -> Optional[Decision]:
    """One node's decision before the holds."""
    name = node.name
    if act is not None:
        if back(node):
            return Decision(name, "back", act.code, f"answers again after the {act.kind}", "", act)
        if act.state == "retry":
            if now < act.next_try:
                return None
            return Decision(name, act.kind, act.code, f"{act.kind}: retry", "", act, False)
        if act.kind == "reboot" and now - act.started > deadline:
            why = f"not back {now - act.started:.0f} s after the watcher's reboot"
            return Decision(name, "replace", NO_BOOT, why, "", None, False)
        return None
    if "reboot_issued" in since and now - since["reboot_issued"] > deadline:
        why = f"REBOOT_ISSUED for {now - since['reboot_issued']:.0f} s"
        return Decision(name, "replace", NO_BOOT, why)
    if "not_responding" in since and now - since["not_responding"] > cfg.down_after:
        why = f"not responding for {now - since['not_responding']:.0f} s"
        return Decision(name, "reboot", NOT_RESPONDING, why)
    if "completing" in since and now - since["completing"] > cfg.completing_after:
        why = f"COMPLETING for {now - since['completing']:.0f} s"
        kind = "reboot" if cfg.completing_action == "reboot" else "report"
        return Decision(name, kind, COMPLETING, why)
    return None


def _hold(
    item: Decision, node: NodeState, open_: bool, cfg: Watch, limits: Limits, now: float
) -> Decision:
    """``item`` with why it is held, if it is (module doc: the order of the holds)."""
    if item.kind not in ("reboot", "replace"):
        return item
    text = node.field(limits.label_field)
    window = maintenance.in_field(text)
    held = ""
    if node.maintenance or (window is not None and window.active(now)):
        held = "maintenance"
    elif cfg.hold_reserved and "RESERVED" in node.flags:
        held = "reservation"
    elif item.count and _repeat_offender(text, limits, now):
        held = "repeat_offender"
    elif open_:
        held = "breaker"
    return Decision(item.node, item.kind, item.code, item.why, held, item.action, item.count)


def _repeat_offender(text: str, limits: Limits, now: float) -> bool:
    """The node's ``hmah=`` memory holds it for a human, or one more remediation would exceed
    ``max_remediations`` within the window (the agent's rule: ``planner.Policy``)."""
    history = label.find_history(text, now)
    if history is None:
        return False
    return bool(history.held) or history.within(now, limits.window) + 1 > limits.max_remediations


def recorded(text: str, code: str, now: float) -> str:
    """The label field's text with the watcher's remediation added to ``hmah=`` (one entry per
    episode, newest last, at most ``label.MAX_HISTORY``), as the agents write it."""
    history = label.find_history(text, now) or label.History()
    entries = (*history.entries, (now, code))[-label.MAX_HISTORY :]
    return label.edit_history(text, label.History(entries, history.held))
