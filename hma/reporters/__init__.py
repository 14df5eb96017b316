"""Reporters: where alerts and the node's status go (journald, Prometheus textfile, ...).

Reporters are pluggable like probes: classes registered under the entry point group
``hma.reporters``, configured in ``[reporters.<name>]`` (each declares its options; ``enabled``
is always there). The daemon calls ``alert`` once per transition and ``publish`` with the full
status document (docs/status.md) after every change. A reporter that raises is logged and skipped;
it never stops the loop.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Collection, Mapping, Optional

from hma.model import Action, Severity
from hma.options import Option
from hma.record import field, record

GROUP = "hma.reporters"

ALERT_KINDS = (
    "raised",  # a fault became active
    "escalated",  # an active fault's severity or action rose
    "cleared",  # an active fault went away
    "action_requested",  # remediation decided an action (written to the outbox)
    "action_applied",  # the action took effect in Slurm / the cluster hook
    "action_held",  # the action is held back (breaker, rate limit, policy none, dry run)
    "action_failed",  # an attempt failed (will be retried)
    "acknowledged",  # an operator ran `hma ack`
    "agent",  # about the agent itself (started, config reload failed, state reset)
)


@record(frozen=True)
class Alert:
    """One state change worth telling people about.

    ``message`` says what happened in words; reporters show it with the kind, code and component,
    so it need not repeat them.
    """

    kind: str
    code: str
    component: str
    severity: Severity
    message: str
    action: Action = Action.NONE
    probe: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    ts: float = 0.0


class Reporter:
    """Base class of reporters."""

    name: ClassVar[str] = ""
    options: ClassVar[Mapping[str, Option]] = {}
    default_enabled: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.config = options

    def alert(self, alert: Alert) -> None:
        """Deliver one alert."""

    def publish(self, status: Mapping[str, Any]) -> None:
        """Publish the full status document after a change."""

    def close(self) -> None:
        """Release resources at shutdown."""


def discover(
    names: Optional[Collection[str]] = None,
) -> tuple[dict[str, type[Reporter]], list[Any]]:
    """Reporter classes of the entry point group, or those named (and the ones that failed to
    load)."""
    from hma.registry import discover as discover_group

    return discover_group(GROUP, Reporter, names)


def start_reporters(
    configured: Mapping[str, Mapping[str, Any]], complain: Callable[..., None]
) -> list[Reporter]:
    """Instances of the enabled reporters; one that fails to start is reported and skipped."""
    classes, _broken = discover()
    out = []
    for name, values in configured.items():
        if values.get("enabled") and name in classes:
            try:
                out.append(classes[name](values))
            except Exception as exc:  # noqa: BLE001 - a bad reporter must not stop the agent
                complain("reporter %s failed to start: %s", name, exc)
    return out


def schemas(names: Optional[Collection[str]] = None) -> dict[str, Mapping[str, Option]]:
    """Option sets of the known reporters, or those named (``enabled`` first), keyed by reporter
    name."""
    classes, _broken = discover(names)
    return {
        name: {"enabled": Option("bool", cls.default_enabled, "Use this reporter."), **cls.options}
        for name, cls in classes.items()
    }
