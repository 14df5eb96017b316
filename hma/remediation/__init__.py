"""Remediation: turns the health model's verdicts into Slurm labels, drains and recovery.

``Remediator`` is what the daemon calls (facts, update, status, alerts, close); the Slurm client,
the label format, the circuit breaker and the outbox worker live in the submodules. The flow and
every rule are described in docs/remediation.md. (The engine is imported lazily: ``hma.config``
imports ``hma.remediation.options`` and must not pull the engine in.)
"""

from __future__ import annotations

from typing import Any

__all__ = ["Remediator", "reason_for"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hma.remediation import engine

        return getattr(engine, name)
    raise AttributeError(name)
