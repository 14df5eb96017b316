"""De-duplication of kernel-log findings: a storm of one fault is one event with a count."""

from __future__ import annotations

from typing import Mapping, Optional

from hma.contracts.model import Finding


class Dedup:
    """Repeats of one (component, code, severity) within ``window_s`` are one event with a count.

    The first sighting passes at once; repeats inside the window are counted and held back; the
    next sighting after the window passes with ``details["count"]`` = sightings it stands for.
    A storm of one fault thus costs one health-model update per window, not one per line.
    ``tell_apart`` maps a catch-all code (one code for many faults, such as ``GPU_XID_OTHER``) to
    the detail that tells its faults apart (the Xid number): those are counted apart.
    """

    def __init__(self, window_s: float = 10.0, tell_apart: Optional[Mapping[str, str]] = None):
        self.window_s = window_s
        self._tell_apart = dict(tell_apart or {})
        self._open: dict[tuple[str, str, str], tuple[float, int]] = {}  # key -> (opened, held)

    def admit(self, finding: Finding, now: float) -> Optional[Finding]:
        """The finding to emit now (with its count), or None when it is a held-back repeat."""
        detail = self._tell_apart.get(finding.code)
        apart = finding.details.get(detail) if detail is not None else None
        key = (finding.component, finding.code, f"{finding.severity}/{apart}")
        opened = self._open.get(key)
        if opened is not None and now - opened[0] < self.window_s:
            self._open[key] = (opened[0], opened[1] + 1)
            return None
        held = opened[1] if opened is not None else 0
        self._open[key] = (now, 0)
        if len(self._open) > 4096:  # bounded memory under a storm of distinct keys
            cutoff = now - self.window_s
            self._open = {k: v for k, v in self._open.items() if v[0] >= cutoff}
        return finding.with_(details={**finding.details, "count": held + 1})

    def forget(self, component: str, code: str) -> None:
        """Drop the open windows of (component, code): the fault was cleared, so its next
        sighting is news, not a repeat."""
        self._open = {k: v for k, v in self._open.items() if k[:2] != (component, code)}
