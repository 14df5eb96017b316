"""Slurm's text, parsed: node and job records from ``sinfo``/``squeue`` ``-O`` fields (separated by
U+001F, which free text never holds), slurmd's job pids, HyperPod's recovery reasons."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from hma.contracts.cluster import (
    BackendError,
    JobInfo,
    NodeState,
)


class SlurmError(BackendError):
    """A Slurm client call failed (unreachable controller, bad node, unexpected output)."""


# SageMaker HyperPod's recovery on Slurm: a node set ``State=FAIL`` with exactly this reason is
# rebooted or replaced by HyperPod (``reboot_mode``/``replace_mode = "hyperpod"``).
HYPERPOD_REBOOT = "Action:Reboot"


HYPERPOD_REPLACE = "Action:Replace"


HYPERPOD = {HYPERPOD_REBOOT: "reboot", HYPERPOD_REPLACE: "replace"}


class SlurmNodeState(NodeState):
    """A node as Slurm reports it: a HyperPod ``Action:Reboot``/``Action:Replace`` FAIL is a
    ``recovery`` under way."""

    @property
    def recovery(self) -> str:
        """``reboot``/``replace`` while the node is FAIL with HyperPod's reason for it."""
        return HYPERPOD.get(self.reason, "") if self.fail else ""


SEP = "\x1f"  # field separator of the -O formats below: free text never holds it


# sinfo -O fields of one node, each unpadded ("":0") and ended by SEP. With ``-n`` naming one node
# sinfo asks slurmctld for that node alone (REQUEST_NODE_INFO_SINGLE, checked with sdiag), which
# neither ``sinfo --json`` (22.05 ignores -n) nor ``scontrol show node NAME`` does (whole table).
NODE_FIELDS = (
    "NodeList",
    "StateComplete",
    "Reason",
    "User",
    "Timestamp",
    "Comment",
    "Extra",
    "Partition",
    "NodeHost",
    "NodeAddr",
)


NODE_FORMAT = ",".join(f"{f}:0{SEP}" for f in NODE_FIELDS)


# States the breaker's filtered query asks for (nodes hma may hold: drained, failed, down).
HELD_STATES = ("drain", "fail", "down")


def _text(value: str) -> str:
    return "" if value in ("(null)", "N/A") else value


def _records(text: str, tool: str, width: int) -> list[list[str]]:
    """The SEP-separated fields of each non-empty line; a line with fewer is a ``SlurmError``."""
    out = []
    for line in text.splitlines():
        if line.strip():
            parts = line.split(SEP)
            if len(parts) < width:
                raise SlurmError(f"{tool}: unreadable line {line[:200]!r}")
            out.append(parts[:width])
    return out


def parse_sinfo(text: str) -> list[NodeState]:
    """Nodes from ``sinfo -h -N -O NODE_FORMAT`` (one line per node and partition, merged).

    A line without every field is an error (``SlurmError``), never a node read wrong."""
    nodes: dict[str, NodeState] = {}
    for parts in _records(text, "sinfo", len(NODE_FIELDS)):
        name, state, reason, user, when, comment, extra, part, host, addr = parts
        words = state.strip().split("+")
        partition = part.strip().rstrip("*")
        seen = nodes.get(name.strip())
        if seen is not None:
            if partition and partition not in seen.partitions:
                nodes[seen.name] = replace(seen, partitions=(*seen.partitions, partition))
            continue
        no_reason = reason in ("", "none", "(null)") and when in ("", "Unknown")
        nodes[name.strip()] = SlurmNodeState(
            name=name.strip(),
            base=words[0].lower().rstrip("*~#%$@^!-"),
            flags=frozenset(w.upper() for w in words[1:] if w),
            reason="" if no_reason else reason,
            reason_time=0.0 if no_reason else _iso_time(when),
            reason_user="" if no_reason or user == "Unknown" else user,
            comment=_text(comment),
            extra=_text(extra),
            partitions=(partition,) if partition else (),
            hostname=host.strip(),
            address=addr.strip(),
        )
    return list(nodes.values())


def _iso_time(text: str) -> float:
    import datetime

    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return 0.0


# squeue -O fields of one job (unpadded, ended by SEP); ``-j`` naming one job asks slurmctld for
# that job alone (REQUEST_JOB_INFO_SINGLE), where ``squeue --json`` lists the whole job table.
JOB_FIELDS = (
    "JobID",
    "UserName",
    "State",
    "Reason",
    "NodeList",
    "Comment",
    "Requeue",
    "BatchFlag",
    "RestartCnt",
    "EligibleTime",
)


JOB_FORMAT = ",".join(f"{f}:0{SEP}" for f in JOB_FIELDS)


def parse_squeue(text: str) -> list[JobInfo]:
    """Jobs from ``squeue -h -O JOB_FORMAT``; a line without every field is a ``SlurmError``."""
    jobs = []
    for parts in _records(text, "squeue", len(JOB_FIELDS)):
        job_id, user, state, reason, nodes, comment, requeue, batch, restarts, eligible = parts
        jobs.append(
            JobInfo(
                id=job_id.strip(),
                user=user.strip(),
                state=state.strip().upper(),
                reason=reason.strip(),
                nodes=_text(nodes.strip()),
                comment=_text(comment),
                requeue=requeue.strip() != "0",
                batch=batch.strip() != "0",
                restarts=int(restarts) if restarts.strip().isdigit() else 0,
                eligible_time=_iso_time(eligible.strip()),
            )
        )
    return jobs


def parse_listpids(text: str) -> dict[str, tuple[str, ...]]:
    """Job id -> its step ids, from ``scontrol listpids`` (``PID JOBID STEPID ...`` lines)."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit():
            out.setdefault(parts[1], set()).add(parts[2])
    return {job: tuple(sorted(steps)) for job, steps in out.items()}


def parse_spool(names: Sequence[str], node: str) -> dict[str, tuple[str, ...]]:
    """Job id -> step ids from the socket names ``<node>_<job>.<step>`` of SlurmdSpoolDir."""
    out: dict[str, set[str]] = {}
    prefix = f"{node}_"
    for name in names:
        job, dot, step = name[len(prefix) :].partition(".")
        if name.startswith(prefix) and dot and job.isdigit() and step.isdigit():
            out.setdefault(job, set()).add(step)
    return {job: tuple(sorted(steps)) for job, steps in out.items()}


LIVE_JOB_STATES = frozenset(
    {"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "SIGNALING", "RESIZING"}
)
