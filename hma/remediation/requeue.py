"""The agent's side of ``hma srun --auto-resume``: the marker in a job's note and the engine's hook.

``hma srun --auto-resume=N`` puts one token in the job's note (``Job.note``, the job's free-text
field; the rest of the note is the user's and is never touched)::

    hma-resume=<N>,a=<attempt>,n=<node>+<node>,r=<replaced>

``N`` is the attempts allowed, ``a`` the requeues hma srun did (0 before the first), ``n`` the
faulty nodes of the last resume, ``r`` (absent when 0) the resumes done in place, the faulty nodes
swapped inside the allocation (they do not count as restarts). The remediation engine calls
``AutoResume.observe`` with the jobs on its node at every facts refresh; two things follow
(docs/auto-resume.md):

* a node whose fault hit a job running with auto-resume gets ``replace``, not ``reboot``
  (``planner.recovery_action``), as managed clusters do: the job restarts elsewhere at once
  and the node is not put back under it by a quick reboot;
* when such a job leaves the node because hma srun requeued it, the agent sets its
  ``StartTime=now`` (Slurm otherwise holds a requeued job back for about 2 minutes).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from hma.contracts import label as label_mod
from hma.contracts.cluster import BackendError, Job, JobInfo

log = logging.getLogger("hma.remediation")

MARKER = "hma-resume="
REMEMBER_S = 600.0  # how long a marked job that left the node is watched for its requeue
MAX_REMEMBERED = 256


@dataclass(frozen=True)
class Marker:
    """The parsed ``hma-resume=`` token of a job's note."""

    attempts: int  # N of --auto-resume=N
    attempt: int = 0  # requeues done by hma srun so far
    nodes: tuple[str, ...] = ()  # faulty nodes of the last resume
    replaced: int = 0  # resumes done in place (the faulty nodes swapped in the allocation)

    def token(self) -> str:
        """The token text (no spaces)."""
        text = f"{MARKER}{self.attempts},a={self.attempt}"
        if self.nodes:
            text += ",n=" + "+".join(n for n in self.nodes if n)
        if self.replaced:
            text += f",r={self.replaced}"
        return text


def parse_marker(token: str) -> Optional[Marker]:
    """A marker from its token; None when it is not a well-formed one."""
    if not token.startswith(MARKER):
        return None
    head, _, rest = token[len(MARKER) :].partition(",")
    values = dict(item.partition("=")[::2] for item in rest.split(",") if "=" in item)
    try:
        attempts = int(head)
        attempt = int(values.get("a", "0") or 0)
        replaced = int(values.get("r", "0") or 0)
    except ValueError:
        return None
    if attempts < 1 or attempt < 0 or replaced < 0:
        return None
    nodes = tuple(n for n in values.get("n", "").split("+") if n)
    return Marker(attempts, attempt, nodes, replaced)


def find_marker(note: str) -> Optional[Marker]:
    """The marker in a job's note, if any."""
    token = label_mod.find_token(note, MARKER)
    return parse_marker(token) if token else None


def with_marker(note: str, marker: Marker) -> str:
    """``note`` with its marker replaced (or added at the end); the user's text is kept."""
    return label_mod.edit_token(note, MARKER, marker.token())


class JobClient(Protocol):
    """The job calls auto-resume makes (a cluster backend, or the Slurm client itself)."""

    def job_infos(self, ids: Sequence[str]) -> list[JobInfo]:
        """The queued or running jobs among ``ids``."""

    def update_job(self, job_id: str, **fields: str) -> None:
        """Change fields of a job."""


class AutoResume:
    """What the engine remembers about auto-resume jobs seen on its node (see module doc)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.marked: dict[str, float] = {}  # job id -> last time seen on this node with a marker
        self.watch: dict[str, float] = {}  # marked jobs that left the node -> when they left
        self.hurried: list[str] = []  # jobs whose StartTime this agent set to now

    def observe(self, client: Optional[JobClient], jobs: Sequence[Job]) -> None:
        """Note marked jobs on the node; hurry the ones that left it because hma srun requeued
        them (through ``client``; None: a backend without job calls, nothing is hurried). Never
        raises (a Slurm error only delays the hurry to the next refresh)."""
        now = self.clock()
        here = {j.id for j in jobs}
        for job in jobs:
            if find_marker(job.note) is not None:
                self.marked[job.id] = now
                self.watch.pop(job.id, None)
        if client is not None:  # a marked job that left is watched only where it can be hurried
            for job_id, seen in self.marked.items():
                if job_id not in here and job_id not in self.watch and now - seen < REMEMBER_S:
                    self.watch[job_id] = now
        if len(self.marked) > MAX_REMEMBERED:
            for job_id in sorted(self.marked, key=self.marked.__getitem__)[:-MAX_REMEMBERED]:
                del self.marked[job_id]
                self.watch.pop(job_id, None)
        if self.watch and client is not None:
            try:
                self._hurry(client, now)
            except BackendError as exc:
                log.warning("auto-resume: cannot check requeued jobs: %s", exc)

    def _hurry(self, client: JobClient, now: float) -> None:
        infos = {j.id: j for j in client.job_infos(sorted(self.watch))}
        for job_id in list(self.watch):
            info = infos.get(job_id)
            if info is None or info.state not in ("PENDING", "COMPLETING"):
                self.watch[job_id] = 0.0  # finished, cancelled or running elsewhere: done
            else:
                marker = find_marker(info.note)
                ours = marker is not None and marker.attempt > 0 and marker.attempt == info.restarts
                if info.state == "PENDING" and ours and info.eligible_time > now + 1:
                    client.update_job(job_id, StartTime="now")
                    self.hurried.append(job_id)
                    log.info("auto-resume: job %s requeued by hma srun; StartTime=now", job_id)
                    self.watch[job_id] = 0.0
            if now - self.watch[job_id] > REMEMBER_S:
                del self.watch[job_id]
                self.marked[job_id] = min(self.marked.get(job_id, 0.0), now - REMEMBER_S)

    def remembered(self) -> frozenset[str]:
        """Jobs seen running with auto-resume (the last MAX_REMEMBERED marked jobs, so an open
        fault keeps its ``replace``)."""
        return frozenset(self.marked)
