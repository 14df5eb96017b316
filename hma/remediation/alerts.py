"""The alerts of remediation, queued for the daemon (action_requested/applied/held/failed and
the breaker's): any thread adds, the daemon takes them (``Remediator.alerts``)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from hma.contracts.alert import Alert
from hma.contracts.model import Action, Severity
from hma.remediation.planner import Episode

log = logging.getLogger("hma.remediation")


class Alerts:
    """The queue; ``clock``: the engine's, ``node``: this node's name now (None unknown),
    ``told``: called after each alert queued."""

    def __init__(
        self,
        clock: Callable[[], float],
        node: Callable[[], Optional[str]],
        told: Callable[[], None],
    ) -> None:
        self.clock = clock
        self.node = node
        self.told = told
        self._lock = threading.Lock()
        self._queued: list[Alert] = []

    def add(self, alert: Alert) -> None:
        """Queue an alert for the daemon (any thread)."""
        with self._lock:
            self._queued.append(alert)
        self.told()

    def take(self) -> list[Alert]:
        """The alerts since the last call."""
        with self._lock:
            out, self._queued = self._queued, []
        return out

    def about(
        self, kind: str, ep: Episode, message: str, action_kind: str, more: dict[str, Any]
    ) -> None:
        """An alert about an action of episode ``ep`` (``more``: details besides the episode's)."""
        details = {
            "node": self.node(),
            "action_kind": action_kind,
            "reason": ep.reason,
            "jobs": list(ep.jobs),
            "users": list(ep.users),
            "episode": ep.id,
            **more,
        }
        jobs = f" (jobs {','.join(ep.jobs)})" if ep.jobs else ""
        self.add(
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
