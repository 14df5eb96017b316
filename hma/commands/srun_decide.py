"""What ``hma srun --auto-resume`` decides after a failed step (pure, but for ``watch``).

A node counts as failed hardware when it is drained, failed or down with an hma-owned reason
(``HMA: ...``) or a HyperPod ``Action:*`` reason, or carries hma's ``unhealthy`` label. The
decision table is ``decide``; how a resume is done (in place or by requeue) is ``mechanism``
(docs/auto-resume.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import Allocation, SlurmError
from hma.config.files import ConfigError
from hma.contracts import label
from hma.contracts.cluster import JobInfo, NodeState

if TYPE_CHECKING:
    from hma.detection.setup import Setup

POLL_S = 1.0


def fault_of(node: NodeState) -> str:
    """Why ``node`` counts as failed hardware ("" when it does not)."""
    if node.out_of_service and (node.owned or node.reason.startswith("Action:")):
        return f"{node.label_text}, reason {node.reason!r}"
    lab = _label(node)
    if lab is not None and lab.state == "unhealthy":
        held = f", held: {lab.held}" if lab.held else ""
        return f"{node.label_text}, hma label {lab.code} {lab.component}{held}".replace(" ,", ",")
    return ""


def _label(node: NodeState) -> Optional[label.Label]:
    """The hma label of the node: in the first of its fields (Extra, then Comment) with one."""
    return next((lab for lab in (label.find(text) for _name, text in node.texts) if lab), None)


def _held(node: NodeState) -> bool:
    lab = _label(node)
    return lab is not None and bool(lab.held)


def settled(nodes: Sequence[NodeState]) -> bool:
    """Nothing more to wait for: a faulty node exists and each one is out of service or held."""
    faulty = [n for n in nodes if fault_of(n)]
    return bool(faulty) and all(n.out_of_service or _held(n) for n in faulty)


@dataclass(frozen=True)
class Decision:
    """What ``hma srun`` does after srun failed."""

    kind: str  # not_hardware, resume, give_up, unsafe, unknown
    message: str
    faulty: tuple[str, ...] = ()


def decide(
    rc: int,
    nodes: Sequence[NodeState],
    attempt: int,
    attempts: int,
    waited: float,
    error: str = "",
) -> Decision:
    """The decision table (pure): srun's exit code, the job's nodes, attempts used / allowed."""
    faulty = [(n.name, fault_of(n)) for n in nodes]
    faulty = [(name, why) for name, why in faulty if why]
    names = tuple(name for name, _why in faulty)
    if not nodes and error:
        return Decision(
            "unknown",
            f"srun exited {rc}; cannot read the job's node states ({error}): not resumed",
        )
    if not faulty:
        return Decision(
            "not_hardware",
            f"srun exited {rc}; no node of the job is marked faulty (waited {waited:.0f} s): "
            "not a hardware failure, not resumed",
        )
    what = "; ".join(f"{name} ({why})" for name, why in faulty)
    open_nodes = [n.name for n in nodes if n.name in names and not n.out_of_service]
    if open_nodes:
        return Decision(
            "unsafe",
            f"srun exited {rc}; hardware fault on {what}, but {','.join(open_nodes)} is still "
            "schedulable (not drained, e.g. policy none or circuit breaker): not resuming onto it",
            names,
        )
    if attempt >= attempts:
        return Decision(
            "give_up",
            f"srun exited {rc}; hardware fault on {what}; giving up: {attempt} of {attempts} "
            "auto-resume attempt(s) used",
            names,
        )
    return Decision(
        "resume",
        f"srun exited {rc}; hardware fault on {what}; resuming (attempt {attempt + 1} of "
        f"{attempts})",
        names,
    )


def watch(
    client: SlurmClient,
    names: Sequence[str],
    grace: float,
    poll: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[NodeState], float, str]:
    """Poll the job's nodes until the picture is settled or ``grace`` passed.

    Returns the last node states read, the seconds waited and the last read error.
    """
    start = clock()
    nodes: list[NodeState] = []
    error = ""
    if not names:  # an empty name list would read every node of the cluster
        return nodes, 0.0, "the job has no nodes"
    while True:
        try:
            nodes = client.nodes(names)
            error = ""
        except SlurmError as exc:
            error = str(exc)
        if nodes and settled(nodes):
            break
        waited = clock() - start
        if waited >= grace:
            break
        sleep(min(poll, max(0.0, grace - waited)))
    return nodes, clock() - start, error


EXPANSION = "permit_job_expansion"  # the SchedulerParameters flag in-place replacement needs


def expansion_allowed(client: SlurmClient) -> Optional[bool]:
    """Whether slurmctld allows ``--dependency=expand`` (``SchedulerParameters`` holds
    ``permit_job_expansion``); None when its configuration cannot be read."""
    try:
        value = client.config_value("SchedulerParameters")
    except SlurmError:
        return None
    if value is None:
        return None
    return EXPANSION in (p.strip() for p in value.split(","))


def job_gres(client: SlurmClient, alloc: Allocation, names: Sequence[str]) -> str:
    """The generic resources the job holds: asked for (``--gres``, ``--gpus``...), else those of
    its nodes (an exclusive job holds every GRES of its nodes); "" when none or unreadable."""
    if alloc.gres:
        return alloc.gres
    try:
        found = client.node_gres(names)
    except SlurmError:
        return ""
    return ", ".join(f"{name}: {gres}" for name, gres in sorted(found.items()) if gres)


def mechanism(
    job: JobInfo, gres: str, expansion: Optional[bool], faulty_batch_host: str = ""
) -> tuple[str, str]:
    """How a failed step of this job is resumed: ``replace`` (the faulty nodes swapped inside the
    allocation), ``requeue`` (the batch job back in the queue) or ``none``; and the rule why.
    GRES jobs are requeued: Slurm cannot resize an allocation holding generic resources; so is a
    batch job whose batch host (``faulty_batch_host``) is faulty: Slurm cannot drop that node."""
    requeueable = job.batch and job.requeue
    if gres:
        if requeueable:
            return "requeue", (
                f"the job holds GRES ({gres}) and Slurm cannot resize a GRES allocation: "
                "requeueing the job so that it restarts from its checkpoint on healthy nodes"
            )
        return "none", (
            f"the job holds GRES ({gres}), so Slurm cannot replace its nodes in place, and "
            + _not_requeueable(job)
        )
    if job.batch and faulty_batch_host:
        why = f"the faulty node {faulty_batch_host} runs the batch script, which Slurm cannot move"
        if requeueable:
            return "requeue", (
                f"{why}: requeueing the job so that it restarts from its checkpoint on healthy "
                "nodes"
            )
        return "none", f"{why}, and {_not_requeueable(job)}"
    if expansion is False:
        why = f"the cluster does not allow expansion (SchedulerParameters lacks {EXPANSION})"
        if requeueable:
            return "requeue", (
                f"{why}: requeueing the job so that it restarts from its checkpoint on healthy "
                "nodes"
            )
        return (
            "none",
            f"{why}, so its nodes cannot be replaced in place, and {_not_requeueable(job)}",
        )
    return "replace", "the job holds no GRES: replacing the faulty nodes inside the allocation"


def _not_requeueable(job: JobInfo) -> str:
    if not job.batch:
        return "an interactive allocation (salloc) cannot be requeued: not resumed"
    return "the job cannot be requeued (--no-requeue or JobRequeue=0): not resumed"


def expansion_note(setup: Setup) -> str:
    """``hma config check``'s line on in-place replacement: a warning when the Slurm backend's
    controller lacks ``permit_job_expansion``; "" when it is set, when the controller's
    configuration cannot be read here, or when the backend is not Slurm's."""
    from hma.cluster.slurm.backend import SlurmBackend
    from hma.commands import common

    try:
        backend = common.scheduler(setup)
    except ConfigError:  # a backend that cannot be loaded is config check's own error
        return ""
    if not isinstance(backend, SlurmBackend):
        return ""
    if expansion_allowed(backend.client) is not False:  # set, or unreadable here: nothing to say
        return ""
    return (
        f"warning: slurm: SchedulerParameters lacks {EXPANSION}: hma srun --auto-resume cannot "
        "replace faulty nodes inside an allocation (batch jobs are requeued instead, salloc "
        "jobs are not resumed; docs/slurm.md)"
    )
