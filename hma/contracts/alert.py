"""Alerts: one state change worth telling people about, as every reporter receives it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from hma.contracts.model import Action, Severity

ALERT_KINDS = (
    "raised",  # a fault became active
    "escalated",  # an active fault's severity or action rose
    "cleared",  # an active fault went away
    "action_requested",  # remediation decided an action (written to the outbox)
    "action_applied",  # the action took effect in Slurm / the cluster hook
    "action_held",  # the action is held back (breaker, rate limit, policy none, dry run)
    "action_failed",  # an attempt failed (will be retried)
    "acknowledged",  # an operator ran `hma ack` (or `hma reset`: the node was repaired)
    "agent",  # about the agent itself (started, config reload failed, state reset)
)


@dataclass(frozen=True)
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
