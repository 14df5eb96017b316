"""What the engine's threads share: the node facts, the latest verdict and the alerts.

One ``Shared`` per engine, guarded by its lock; the facts thread, the outbox worker and the
daemon's calls read and write it. Alerts (``action_requested``/``applied``/``held``/``failed``)
are collected here until the daemon takes them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hma.contracts.alert import Alert
from hma.contracts.cluster import NodeState
from hma.contracts.model import Action, Severity
from hma.health.model import Verdict
from hma.remediation.planner import Episode

log = logging.getLogger("hma.remediation")


@dataclass
class Shared:
    """The engine's state outside the store (see module doc)."""

    clock: Callable[[], float]
    node_name: Optional[str] = None
    node: Optional[NodeState] = None
    jobs: tuple[tuple[str, str], ...] = ()  # (job id, user)
    facts_ok: bool = False
    facts_error: str = ""
    verdict: Optional[Verdict] = None
    boot_id: str = ""
    boot_since: float = 0.0  # when the engine first heard of the current boot id
    domain: str = ""  # this node's NVLink domain (hma.topology.domain), published in its label
    spares: int = 0  # [topology] spares_per_domain: a replace resumes a spare of the domain
    spare: tuple[int, str] = (0, "")  # (episode, spare) resumed for that episode's replace
    # A read ahead of the node's state (monotonic start time, state) a drain may use once
    fresh: Optional[tuple[float, NodeState]] = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    alerts: list[Alert] = field(default_factory=list)
    on_alert: Callable[[], None] = lambda: None  # told when ``alerts`` has more

    def take_fresh(self, name: str, max_age: float) -> Optional[NodeState]:
        """The read ahead of node ``name`` if it started at most ``max_age`` seconds ago
        (used once, then forgotten)."""
        with self.lock:
            fresh, self.fresh = self.fresh, None
        if fresh is None or fresh[1].name != name or time.monotonic() - fresh[0] > max_age:
            return None
        return fresh[1]

    def add_alert(self, alert: Alert) -> None:
        """Queue an alert for the daemon."""
        with self.lock:
            self.alerts.append(alert)
        self.on_alert()

    def alert(
        self, kind: str, ep: Episode, message: str, action_kind: str, extra: dict[str, Any]
    ) -> None:
        """An alert about an action of episode ``ep``."""
        details = {
            "node": self.node_name,
            "action_kind": action_kind,
            "reason": ep.reason,
            "jobs": list(ep.jobs),
            "users": list(ep.users),
            "episode": ep.id,
            **extra,
        }
        jobs = f" (jobs {','.join(ep.jobs)})" if ep.jobs else ""
        self.add_alert(
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
