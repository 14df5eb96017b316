"""Spare taking: a healthy spare of the node's NVLink domain resumed in its place for a
replace (``[topology] spares_per_domain``), through the backend's ``TakesSpares``."""

from __future__ import annotations

import logging
from typing import Callable, Optional

from hma.contracts.cluster import Backend, TakesSpares
from hma.remediation.planner import Episode

log = logging.getLogger("hma.remediation")


def unsupported(backend: Backend, what: str) -> str:
    """The held note of an action ``backend`` has no capability for."""
    name = backend.name or type(backend).__name__
    return f"unsupported: the {name} backend cannot {what}"


class Spares:
    """Takes at most one spare per episode; ``domain``: this node's domain now ("" unknown),
    ``per_domain``: ``[topology] spares_per_domain``."""

    def __init__(self, backend: Backend, per_domain: int, domain: Callable[[], str]) -> None:
        self.backend = backend
        self.per_domain = per_domain
        self.domain = domain
        self._spare: tuple[int, str] = (0, "")  # (episode, spare) resumed for its replace

    def take(self, name: str, ep: Optional[Episode]) -> str:
        """A healthy spare of node ``name``'s domain resumed in its place, once per episode;
        its name, "" when none."""
        domain = self.domain()
        taken_for, spare = self._spare
        key = ep.id if ep is not None else 0
        if spare and taken_for == key:
            return spare
        if not domain or not self.per_domain:
            return ""
        if not isinstance(self.backend, TakesSpares):
            log.warning("replace of %s: %s", name, unsupported(self.backend, "take a spare"))
            return ""
        spare = self.backend.take_spare(name, domain) or ""
        self._spare = (key, spare)
        log.info("replace of %s: spare %s of domain %s", name, spare or "(none)", domain)
        return spare
