"""The hardware checks ``hma srun --auto-resume`` runs after a failed step, before it decides.

On each node of the failed step, inside the allocation, one task of ``hma check --request
--wait S`` (hma.commands.checkrequest): the node's agent runs every probe now through its
verdict and remediation, so a fault it finds is drained (and labelled for replacement) before
the decision reads the node states. Bounded in time; the output goes to the job's log (stderr).
"""

from __future__ import annotations

import math
import shutil
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

from hma.adapters.command import CommandRunner
from hma.adapters.text import printable

CHECK_WAIT_S = 120.0  # the default --check-wait: the agent's rate limit and a run of every probe
OUTPUT_CAP = 65536  # bytes of each of the checks' stdout and stderr kept for the job's log
START_S = 30.0  # what srun may take beyond the checks' own wait (start, step set-up)


@dataclass(frozen=True)
class Checked:
    """How the checks went: srun's exit status (None: not run or stopped) and a line saying it."""

    rc: Optional[int]
    message: str


def argv(job_id: str, nodes: Sequence[str], wait: float, hma: Sequence[str]) -> list[str]:
    """The srun line: one task per node of the step, overlapping the allocation, time-limited."""
    minutes = max(1, math.ceil((wait + START_S) / 60))
    return [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        f"--nodelist={','.join(nodes)}",
        f"--nodes={len(nodes)}",
        "--ntasks-per-node=1",
        f"--time={minutes}",
        "--kill-on-bad-exit=0",
        *hma,
        "check",
        "--request",
        f"--wait={wait:g}",
    ]


def program() -> list[str]:
    """The hma the checks run: ``hma`` on the job's PATH (the packages' /usr/bin/hma), else
    ours (this Python, ``-m hma``: the same install on every node)."""
    found = shutil.which("hma")
    return [found] if found else [sys.executable, "-m", "hma"]


def run(
    job_id: str,
    nodes: Sequence[str],
    wait: float,
    srun: Sequence[str] = ("srun",),
    hma: Optional[Sequence[str]] = None,
) -> Checked:
    """Run the checks on ``nodes`` (their output to our stderr); what came of them."""
    hma = program() if hma is None else hma
    where = ",".join(nodes)
    cmd = [*srun, *argv(job_id, nodes, wait, hma)[1:]]
    done = CommandRunner(OUTPUT_CAP).run(cmd, wait + 2 * START_S)
    if done.error:
        return Checked(None, f"cannot run the hardware checks on {where}: {done.error}")
    sys.stderr.write(printable(done.stdout + done.stderr, newlines=True))  # to the job's log
    sys.stderr.flush()
    if done.timed_out:
        return Checked(None, f"the hardware checks on {where} did not end in time")
    if done.rc == 0:
        return Checked(0, f"hardware checks passed on {where}")
    if done.rc in (1, 2):
        return Checked(done.rc, f"hardware checks found faults on {where}")
    return Checked(
        done.rc,
        f"the hardware checks on {where} could not run or give a verdict everywhere (exit "
        f"{done.rc}: no agent, no answer in time, or the step was refused)",
    )
