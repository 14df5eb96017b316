"""Reporters: where verdicts and transitions go (journald, Prometheus textfile, ...).

Reporters are pluggable like probes (entry point group ``hma.reporters``); each declares its
options. A failing reporter is logged and never stops the loop.
"""

from __future__ import annotations

from typing import Mapping

from hma.options import Option

GROUP = "hma.reporters"


def schemas() -> dict[str, Mapping[str, Option]]:
    """Option sets of the known reporters, keyed by reporter name."""
    from hma.registry import _entry_points

    out: dict[str, Mapping[str, Option]] = {}
    for ep in _entry_points(GROUP):
        try:
            cls = ep.load()
            out[ep.name] = dict(getattr(cls, "options", {}))
        except Exception:  # noqa: BLE001 - a broken reporter plugin only loses its section
            continue
    return out
