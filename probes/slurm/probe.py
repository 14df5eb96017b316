"""``slurm`` probe: Slurm's own hardware drains, reported as findings.

slurmd and slurmctld drain a node themselves when they see hardware trouble: an unkillable job
("Kill task failed"), fewer GPUs than configured ("gres/gpu count reported lower than
configured"), less memory or fewer CPUs than configured ("Low RealMemory", "Low socket*core*thread
count"). This probe reads the node's state and reason from the node facts the core passes in (it
never calls Slurm itself) and reports those drains as ``SLURM_*`` findings. With ``[recovery]
adopt_slurm_drains = true`` remediation takes them over and recovers them like its own (see
docs/remediation.md); otherwise they are only reported. They clear with the next reboot.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Mapping, Optional

from hma.contracts.model import Finding
from hma.contracts.options import Option
from hma.contracts.probe import Probe, ProbeContext

NODE = "node"

# (code, pattern over Slurm's reason), first match wins.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("SLURM_KILL_TASK_FAILED", re.compile(r"kill task failed", re.I)),
    ("SLURM_GRES_COUNT_LOW", re.compile(r"gres/\S+ count (reported lower|too low)", re.I)),
    (
        "SLURM_NODE_RESOURCES_LOW",
        re.compile(r"low (realmemory|socket\*core\*thread count|cpus|tmpdisk)", re.I),
    ),
)


def match(reason: str) -> Optional[str]:
    """The SLURM_* code for a Slurm drain reason, or None."""
    if reason.startswith("HMA:"):
        return None
    for code, pattern in PATTERNS:
        if pattern.search(reason):
            return code
    return None


class SlurmProbe(Probe):
    """Reports drains that Slurm itself set for hardware reasons."""

    name = "slurm"
    description = "Slurm's own hardware drains (Kill task failed, gres count, low resources)"
    default_interval = 60.0
    default_timeout = 5.0
    needs_facts = True
    options: ClassVar[Mapping[str, Option]] = {}

    def applies(self, ctx: ProbeContext) -> Optional[str]:
        if not ctx.facts.slurm_configured:
            return "Slurm is not configured on this node"
        return None

    def collect(self, ctx: ProbeContext) -> Any:
        return {
            "node": ctx.facts.node_name,
            "state": ctx.facts.slurm_state,
            "reason": ctx.facts.slurm_reason,
        }

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        state = str(snapshot.get("state") or "")
        reason = str(snapshot.get("reason") or "")
        held = state.rstrip("*~#%!$@^-+").startswith(("drain", "down", "fail"))
        code = match(reason) if held else None
        if code is None:
            return []
        return [
            Finding(
                code,
                NODE,
                f"Slurm drained {snapshot.get('node') or 'the node'}: {reason}",
                {"slurm_state": state, "slurm_reason": reason},
            )
        ]
