"""The gate before a recovered node is resumed: ``[deep_check] after_recovery`` stages must pass.

Remediation calls ``gate`` after a reboot or a replacement and resumes the node only when it
says so. A stage that is skipped (its tool is missing) or gives no verdict holds the node: the
operator chose these stages, so a node that could not be tested is not let through.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from hma.assembly import Setup


def gate_stages(setup: Setup) -> list[str]:
    """The node stages of ``[deep_check] after_recovery`` (connectivity needs other nodes)."""
    from hma.deepcheck.options import NODE_STAGES

    return [s for s in setup.config.section("deep_check")["after_recovery"] if s in NODE_STAGES]


def gate(setup: Setup, env: Optional[Mapping[str, str]] = None) -> tuple[bool, str, Sequence[Any]]:
    """``(resume?, why, stage results)``; with no stages configured the node resumes at once."""
    from hma.deepcheck.node import run_stages

    stages = gate_stages(setup)
    if not stages:
        return True, "no after_recovery stages", []
    results = run_stages(setup, stages, env=env)
    held = [f"{r.stage} {r.verdict}" for r in results if r.verdict not in ("pass", "warn")]
    if held:
        return False, "deep check holds the node: " + ", ".join(held), results
    return True, "deep check passed: " + ", ".join(stages), results
