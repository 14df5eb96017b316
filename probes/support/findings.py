"""Findings for the read errors a snapshot recorded: "could not measure" (``unknown``) each."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from hma.contracts.model import Finding
from hma.contracts.probe import unknown


def read_failures(
    code: str, errors: Iterable[Mapping[str, Any]], component: Callable[[Mapping[str, Any]], str]
) -> list[Finding]:
    """An ``unknown`` finding ``code`` for each read error a snapshot recorded
    (``RootReader.failure``), on the component ``component`` names from the record."""
    return [
        unknown(
            code,
            component(e),
            f"cannot read {e['path']}: {e['error']}",
            path=e["path"],
            error=e["error"],
        )
        for e in errors
    ]
