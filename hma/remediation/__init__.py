"""Remediation: turns the health model's verdicts into cluster labels, drains and recovery.

``engine.Remediator`` is what the daemon calls (facts, update, status, alerts, close). It wires
the pure planner (``planner``), the outbox (``outbox``), the circuit breaker (``breaker``) and
the cluster backend (``hma.contracts.cluster``, found by entry point; Slurm in
``hma.cluster.slurm``), which ``actions`` calls. The flow and every rule are described in
docs/remediation.md.
"""
