"""Maintenance mode (``hma maintenance on|off|status``): while on, hma detects, records and
alerts but takes no action on the node (no label, drain, reboot or resume); it ends by itself at
``until`` (never when None: ``hma maintenance off`` ends it).

The mark is kept in the state store (it survives restarts) and written into the node's Slurm
label field as one ``hma-maint=<until>`` word (0: until turned off), so that ``hma fleet`` sees it
in the ``sinfo`` call it makes anyway.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from hma.adapters.text import refused

REQUEST_KIND = "maintenance"  # the state store request a running daemon applies
TOKEN_PREFIX = "hma-maint="
_TOKEN = re.compile(r"hma-maint=([0-9]{1,12})")
_DURATION = re.compile(r"([0-9]{1,9})([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_S = 366 * 86400
REASON_CAP = 200


@dataclass(frozen=True)
class Maintenance:
    """One maintenance window of this node."""

    since: float
    until: Optional[float] = None
    reason: str = ""
    who: str = ""

    def active(self, now: float) -> bool:
        """Whether the window is open at ``now``."""
        return self.until is None or now < self.until

    def describe(self, now: Optional[float] = None) -> str:
        """One line: until when, why and who (for status, logs and held actions)."""
        if self.until is None:
            end = "until `hma maintenance off`"
        else:
            end = "until " + time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.until))
        if now is not None and not self.active(now):
            end = "ended " + end[len("until ") :] if self.until is not None else end
        parts = [end]
        if self.reason:
            parts.append(f"reason {self.reason!r}")
        if self.who:
            parts.append(f"by {self.who}")
        return ", ".join(parts)

    def to_json(self, now: Optional[float] = None) -> dict[str, Any]:
        """The ``maintenance`` object of status.json (``active`` when ``now`` is given)."""
        doc: dict[str, Any] = {
            "since": self.since,
            "until": self.until,
            "reason": self.reason,
            "who": self.who,
        }
        if now is not None:
            doc["active"] = self.active(now)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Maintenance:
        """Inverse of ``to_json``; raises ValueError on a malformed document."""
        until = doc.get("until")
        if until is not None and not isinstance(until, (int, float)):
            raise ValueError(f"until is not a time: {until!r}")
        since = doc.get("since")
        if not isinstance(since, (int, float)):
            raise ValueError(f"since is not a time: {since!r}")
        return cls(
            float(since),
            float(until) if until is not None else None,
            str(doc.get("reason") or ""),
            str(doc.get("who") or ""),
        )

    def token(self) -> str:
        """The word written into the node's label field in Slurm."""
        return f"{TOKEN_PREFIX}{int(self.until) if self.until is not None else 0}"


def parse_duration(text: str) -> float:
    """Seconds of ``30m``, ``2h``, ``1d``, ``90s`` or ``90``; ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"not a duration: {text!r} (e.g. 30m, 2h, 1d)")
    seconds = float(int(match.group(1)) * _UNIT_S[match.group(2)])
    if seconds > MAX_DURATION_S:
        raise ValueError(f"duration {text!r} is longer than a year")
    return seconds


def clean_reason(text: str) -> str:
    """An operator's reason as stored: one line, capped, every character the terminal escaping
    refuses (``hma.adapters.text.refused``) replaced by a space."""
    return "".join(" " if refused(ch) else ch for ch in text).strip()[:REASON_CAP]


def in_field(text: str) -> Optional[Maintenance]:
    """The mark in a node's Slurm label field (``since`` unknown: 0), or None when the field has
    no well-formed ``hma-maint=`` word (another party's text never passes for a mark it does not
    spell exactly)."""
    for word in text.split(" "):
        match = _TOKEN.fullmatch(word)
        if match:
            value = int(match.group(1))
            return Maintenance(0.0, float(value) if value else None)
    return None
