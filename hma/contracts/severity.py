"""Severities (Nagios convention), in a module of their own: `hma status` needs nothing else."""

from __future__ import annotations

import enum
from typing import Iterable


class Severity(enum.IntEnum):
    """Nagios-style severity; the int value is the exit code."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3

    @property
    def rank(self) -> int:
        """Order for combining: critical > unknown > warning > ok."""
        return _SEVERITY_RANK[self]

    @classmethod
    def parse(cls, text: str) -> Severity:
        """Severity from its lower-case name; ``ValueError`` otherwise."""
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}") from None

    def __str__(self) -> str:
        return self.name.lower()


_SEVERITY_RANK = {Severity.OK: 0, Severity.WARNING: 1, Severity.UNKNOWN: 2, Severity.CRITICAL: 3}


def worst(severities: Iterable[Severity]) -> Severity:
    """The combined severity of several results (ok when there are none)."""
    return max(severities, key=lambda s: s.rank, default=Severity.OK)
