"""Reporters: where alerts and the node's status go (journald, Prometheus textfile, ...).

Reporters are pluggable like probes: classes registered under the entry point group
``hma.reporters``, configured in ``[reporters.<name>]`` (each declares its options; ``enabled``
is always there). The daemon calls ``alert`` once per transition and ``publish`` with the full
status document (docs/status.md) after every change. A reporter that raises is logged and skipped;
it never stops the loop.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Optional, Sequence

from hma.contracts.options import Option
from hma.contracts.reporter import GROUP, Reporter


def discover(
    names: Optional[Collection[str]] = None,
) -> tuple[dict[str, type[Reporter]], list[Any]]:
    """Reporter classes of the entry point group, or those named (and the ones that failed to
    load)."""
    from hma.detection.registry import discover as discover_group

    return discover_group(GROUP, Reporter, names)


def start_reporters(
    configured: Mapping[str, Mapping[str, Any]],
    complain: Callable[..., None],
    running: Sequence[Reporter] = (),
) -> list[Reporter]:
    """Instances of the enabled reporters; one that fails to start is reported and skipped. A
    ``running`` reporter whose options are unchanged is kept as it is (a reload does not reset
    its counters); the caller closes the running ones not returned."""
    classes, _broken = discover()
    same = {r.name: r for r in running if r.config == configured.get(r.name)}
    out = []
    for name, values in configured.items():
        if values.get("enabled") and name in same and type(same[name]) is classes.get(name):
            out.append(same[name])
        elif values.get("enabled") and name in classes:
            try:
                out.append(classes[name](values))
            except Exception as exc:  # noqa: BLE001 - a bad reporter must not stop the agent
                complain("reporter %s failed to start: %s", name, exc)
    return out


def unmet(configured: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``reporters.NAME: problem`` for each enabled reporter this host cannot run (its
    ``Reporter.unmet``)."""
    classes, _broken = discover()
    out = []
    for name, values in sorted(configured.items()):
        problem = classes[name].unmet(values) if values.get("enabled") and name in classes else None
        if problem:
            out.append(f"reporters.{name}: enabled, but {problem}")
    return out


def schemas(
    classes: Optional[Mapping[str, type[Reporter]]] = None,
) -> dict[str, Mapping[str, Option]]:
    """Option sets of these reporter classes (default: every one that loads) with ``enabled``
    first, keyed by reporter name."""
    if classes is None:
        classes = discover()[0]
    return {
        name: {"enabled": Option("bool", cls.default_enabled, "Use this reporter."), **cls.options}
        for name, cls in classes.items()
    }
