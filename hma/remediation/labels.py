"""The label field hma writes on its node: the open episode's label and the history mirror.

The label (``hma.contracts.label``) says what hma found and does (code, action, reboots, jobs,
why it holds the node); the mirror (``hmah=``) carries the remediations and the hold for a
human, so that a wiped state store takes them up again from the cluster (``seed``); ``hmap=``
the newest crash of a previous boot (for the controller's watcher).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from hma.contracts import label as label_mod
from hma.contracts.cluster import Backend, NodeState
from hma.contracts.label import Label
from hma.remediation.options import Recovery
from hma.remediation.outbox import Outbox
from hma.remediation.planner import Episode, Reboot, reboot_count

log = logging.getLogger("hma.remediation")


class Labels:
    """Reads and writes the label field of the engine's node (see module doc)."""

    def __init__(
        self, backend: Backend, outbox: Outbox, recovery: Recovery, clock: Callable[[], float]
    ) -> None:
        self.backend = backend
        self.outbox = outbox
        self.rec = recovery
        self.clock = clock
        self._seeded = False

    def reboots_of(self, ep: Episode) -> int:
        """Reboots of the episode's fault within ``reboot_window``."""
        return reboot_count(
            self.outbox.reboots(), ep.code, ep.component, self.clock(), self.rec.reboot_window
        )

    def seed(self, node: NodeState) -> None:
        """After a wiped disk: take reboot counts from the label the cluster still holds, and
        the remediations and the hold for a human from its history mirror."""
        with self.outbox.lock:
            if self._seeded:
                return
            self._seeded = True
            now = self.clock()  # a time past it (beyond the skew) makes a token unreadable
            mirror = label_mod.find_history(node.field(self.rec.label_field), now)
            if mirror is not None and self.outbox.seed_history(mirror):
                log.info("seeded %d remediation(s) from the node's history", len(mirror.entries))
            found = label_mod.find(node.field(self.rec.label_field), now)
            if found is None or not found.reboots or self.outbox.reboots():
                return
            ts = found.since or now
            if now - ts > self.rec.reboot_window:
                return
            self.outbox.save_reboots([Reboot(found.code, found.component, ts)] * found.reboots)
        log.info("seeded %d reboot(s) of %s from the node label", found.reboots, found.code)

    def label_for(self, node: NodeState, held: str = "", drained: float = 0.0) -> Optional[Label]:
        """The open episode's label (None: no episode, or it is resuming)."""
        ep = self.outbox.episode()
        if ep is None or ep.phase == "resuming":
            return None
        previous = label_mod.find(node.field(self.rec.label_field), self.clock())
        return Label(
            "unhealthy",
            ep.code,
            ep.action,
            ep.component,
            float(ep.since),
            self.reboots_of(ep),
            tuple(ep.jobs),
            held,
            drained or (previous.drained if previous and not held else 0.0),
        )

    def text(self, node: NodeState, lab: Optional[Label]) -> Optional[str]:
        """The label field's new text (the label, the history mirror and the newest crash of a
        previous boot, ``hmap=``), or None when it stays as it is."""
        text = node.field(self.rec.label_field)
        now, window = self.clock(), self.rec.remediation_window
        new = label_mod.edit_history(label_mod.edit(text, lab), self.outbox.history(now, window))
        new = label_mod.edit_postmortem(new, self.outbox.postmortem(now, window))
        return None if new == text else new

    def write(self, node: NodeState, held: str = "", drained: float = 0.0) -> None:
        """Write the open episode's label (and the mirror) when the field says otherwise."""
        text = self.text(node, self.label_for(node, held, drained))
        if text is not None:
            self.backend.label(node.name, text)

    def recovered(self, ep: Optional[Episode]) -> Optional[Label]:
        """After recovery: keep the reboot count in the label while it is inside the window."""
        if ep is None:
            return None
        count = self.reboots_of(ep)
        if not count:
            return None
        last = max(
            (r.ts for r in self.outbox.reboots() if r.code == ep.code),
            default=self.clock(),
        )
        return Label("recovered", ep.code, "reboot", ep.component, last, count)
