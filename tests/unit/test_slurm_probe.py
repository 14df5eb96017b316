"""The slurm probe: Slurm's own hardware drains as SLURM_* findings (from node facts)."""

from __future__ import annotations

from typing import Any

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.probe import NodeFacts, ProbeContext
from hma.probes.slurm.probe import SlurmProbe, match


def ctx(**facts: Any) -> ProbeContext:
    return ProbeContext(
        {},
        RootReader("/nonexistent"),
        RootReader("/nonexistent"),
        CommandRunner(),
        facts=NodeFacts(**facts),
    )


@pytest.mark.parametrize(
    "reason, code",
    [
        ("Kill task failed", "SLURM_KILL_TASK_FAILED"),
        ("gres/gpu count reported lower than configured (7 < 8)", "SLURM_GRES_COUNT_LOW"),
        ("gres/gpu count too low (0 < 8)", "SLURM_GRES_COUNT_LOW"),
        ("Low RealMemory (reported:100 < 100.00% of configured:200)", "SLURM_NODE_RESOURCES_LOW"),
        ("Low socket*core*thread count, Low CPUs", "SLURM_NODE_RESOURCES_LOW"),
        ("HMA: SLURM_KILL_TASK_FAILED node Kill task failed", None),  # ours: not Slurm's
        ("bob: swapping disks", None),
        ("Not responding", None),
    ],
)
def test_reasons(reason: str, code: Any) -> None:
    assert match(reason) == code


def test_only_while_the_node_is_held() -> None:
    probe = SlurmProbe()
    c = ctx(
        node_name="n1",
        slurm_configured=True,
        slurm_state="drained",
        slurm_reason="Kill task failed",
    )
    findings = probe.evaluate(probe.collect(c), c)
    assert [(f.code, f.component) for f in findings] == [("SLURM_KILL_TASK_FAILED", "node")]
    assert findings[0].details["slurm_reason"] == "Kill task failed"
    for state in ("drained*", "draining@", "down", "fail"):
        c = ctx(slurm_configured=True, slurm_state=state, slurm_reason="Kill task failed")
        assert probe.evaluate(probe.collect(c), c), state
    c = ctx(slurm_configured=True, slurm_state="idle", slurm_reason="Kill task failed")
    assert probe.evaluate(probe.collect(c), c) == []


def test_not_applicable_without_slurm() -> None:
    assert SlurmProbe().applies(ctx()) is not None
    assert SlurmProbe().applies(ctx(slurm_configured=True)) is None
