"""Mending a running job in place after a hardware fault (``hma srun --auto-resume``, jobs without
GRES): drop the faulty nodes, get as many replacements, merge them in. The job id stays.

Slurm's own mechanism (docs/auto-resume.md, both 22.05 and 24.11): ``scontrol update JobId=J
NodeList=<healthy>`` shrinks job J; ``salloc -N<k> --exclusive --dependency=expand:J --no-shell``
(needs ``SchedulerParameters=permit_job_expansion``) gets an allocation K with no steps, on nodes
the scheduler may give (never a drained or down one); ``scontrol update JobId=K NumNodes=0`` moves
K's nodes into J.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import Allocation, SlurmError

REPLACE_WAIT_S = 300.0  # default of --replace-wait: seconds salloc may wait for replacements
MERGE_WAIT_S = 30.0  # how long the merged node list may take to show in the job
POLL_S = 0.5


@dataclass(frozen=True)
class Mended:
    """The outcome of ``mend``: the job's nodes afterwards and what happened."""

    ok: bool
    hosts: tuple[str, ...]
    message: str


def mend(
    client: SlurmClient,
    alloc: Allocation,
    faulty: Sequence[str],
    wait_s: float = REPLACE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Mended:
    """Replace ``faulty`` nodes of the running job ``alloc`` by as many healthy ones (see the
    module doc). Never raises: a step Slurm refuses ends it with ``ok=False`` and says where the
    job was left."""
    try:
        hosts = client.hostnames(alloc.nodes)
    except SlurmError as exc:
        return Mended(False, (), f"cannot expand the job's node list {alloc.nodes!r}: {exc}")
    healthy = [h for h in hosts if h not in faulty]
    gone = [h for h in hosts if h in faulty]
    if not healthy:
        return Mended(False, tuple(hosts), "every node of the job is faulty: nothing to keep")
    if not gone:
        return Mended(True, tuple(hosts), "no faulty node in the job: nothing to replace")
    try:
        client.update_job(alloc.id, NodeList=",".join(healthy))
    except SlurmError as exc:
        return Mended(False, tuple(hosts), f"Slurm refused to drop {','.join(gone)}: {exc}")
    left = f"the job keeps {len(healthy)} node(s) ({','.join(healthy)})"
    try:
        extra = client.expand(alloc, len(gone), wait_s)
    except SlurmError as exc:
        return Mended(
            False,
            tuple(healthy),
            f"no replacement for {','.join(gone)} within {wait_s:.0f} s or the cluster refused the "
            f"expansion ({exc}); {left}",
        )
    try:
        client.update_job(extra, NumNodes="0")
        now = _merged(client, alloc.id, len(hosts), sleep)
    except SlurmError as exc:
        return Mended(False, tuple(healthy), f"cannot merge allocation {extra}: {exc}; {left}")
    new = [h for h in now if h not in healthy]
    if len(now) != len(hosts):
        return Mended(False, tuple(now), f"merged allocation {extra}, but the job has {now}")
    return Mended(
        True,
        tuple(now),
        f"dropped {','.join(gone)}, merged {','.join(new)} (allocation {extra}); "
        f"the job runs on {','.join(now)}",
    )


def _merged(client: SlurmClient, job_id: str, count: int, sleep: Callable[[float], None]) -> list:
    """The job's nodes once ``count`` of them show (or after ``MERGE_WAIT_S``)."""
    hosts: list[str] = []
    for _ in range(int(MERGE_WAIT_S / POLL_S)):
        hosts = client.hostnames(client.allocation(job_id).nodes)
        if len(hosts) == count:
            break
        sleep(POLL_S)
    return hosts


def fresh_env(env: Mapping[str, str], hosts: Sequence[str], nodelist: str) -> dict[str, str]:
    """``env`` with the job's node list and count as they are now (srun and the entry script
    read them; after a mend the ones Slurm set at start are stale)."""
    out = dict(env)
    for key in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        out[key] = nodelist
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        out[key] = str(len(hosts))
    return out
