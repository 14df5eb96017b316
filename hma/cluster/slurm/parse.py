"""Slurm's text, parsed: node and job records from ``sinfo``/``squeue`` ``-O`` fields (each ended
by U+001F and a per-call nonce, so free text cannot forge a field or record boundary), slurmd's job
pids, HyperPod's recovery reasons."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, replace
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

# A node's free-text fields (``NodeState.texts``, Extra first) by the names ``[recovery]
# label_field`` gives them.
EXTRA = "extra"
COMMENT = "comment"


class SlurmNodeState(NodeState):
    """A node as Slurm reports it: a HyperPod ``Action:Reboot``/``Action:Replace`` FAIL is a
    ``recovery`` under way."""

    @property
    def recovery(self) -> str:
        """``reboot``/``replace`` while the node is FAIL with HyperPod's reason for it."""
        return HYPERPOD.get(self.reason, "") if self.fail else ""


SEP = "\x1f"  # starts every field's end mark (not a digit: sinfo/squeue read the width before it)


def new_nonce() -> str:
    """A fresh nonce for one call's end marks (users cannot guess it before the call)."""
    return secrets.token_hex(8)


def _format(fields: Sequence[str], nonce: str) -> str:
    """The ``-O`` argument of ``fields``, each unpadded and ended by ``SEP + nonce``."""
    return ",".join(f"{f}:0{SEP}{nonce}" for f in fields)


# sinfo -O fields of one node, each unpadded (":0") and ended by SEP + nonce. With ``-n`` naming one
# node sinfo asks slurmctld for that node alone (REQUEST_NODE_INFO_SINGLE, checked with sdiag),
# which neither ``sinfo --json`` (22.05 ignores -n) nor ``scontrol show node NAME`` does. Reason,
# Comment and Extra are free text anyone with the right can set: kept opaque, never split.
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


def node_format(nonce: str) -> str:
    """The ``sinfo -O`` argument whose fields end with ``SEP + nonce``."""
    return _format(NODE_FIELDS, nonce)


NODE_FORMAT = node_format("")  # the nonce-less layout of the recorded captures


# States the breaker's filtered query asks for (nodes hma may hold: drained, failed, down).
HELD_STATES = ("drain", "fail", "down")


# Formats of the fields users cannot write; a record with one that does not match is refused.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a node name or host name
ADDRESS = re.compile(r"[A-Za-z0-9_.:%-]+")  # a host name, IPv4 or IPv6 address
_STATE = re.compile(r"[A-Za-z_]+[*~#%$@^!-]*(?:\+[A-Za-z_]+[*~#%$@^!-]*)*")
_USER = re.compile(r"[A-Za-z0-9_.$@-]*|\(null\)")
_TIME = re.compile(r"|Unknown|N/A|None|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_PARTITION = re.compile(r"[A-Za-z0-9_.-]*\*?|\(null\)|n/a")
_JOB_ID = re.compile(r"\d+(?:[_+][0-9\[\],%-]*)?")
_JOB_STATE = re.compile(r"[A-Za-z_]+")
_NODELIST = re.compile(r"[A-Za-z0-9_.,\[\]-]*|\(null\)")
_COUNT = re.compile(r"\d+")
_OPTIONAL = {"(null)", "N/A"}  # a host field Slurm has no value for


def _text(value: str) -> str:
    return "" if value in _OPTIONAL else value


def _records(text: str, tool: str, nonce: str, width: int) -> list[list[str]]:
    """Each record's fields: the text between end marks ``SEP + nonce``, a record's first field
    after a line break. Text with no end mark of ``nonce`` is read in the nonce-less layout
    (recorded outputs: a real one of ours holds the mark after every field, and text cannot take
    it away). Anything else (a field count that is no multiple of ``width``, text after the last
    record, a record not on its own line) is a ``SlurmError``; newlines in free text are kept."""
    mark = SEP + nonce
    if mark not in text:
        mark = SEP
    fields = text.split(mark)
    tail = fields.pop()
    if tail.strip() or len(fields) % width:
        raise SlurmError(f"{tool}: unreadable output {text[:200]!r}")
    out = []
    for start in range(0, len(fields), width):
        record = fields[start : start + width]
        if start and not record[0].startswith("\n"):
            raise SlurmError(f"{tool}: unreadable record {mark.join(record)[:200]!r}")
        out.append(record)
    return out


def _fixed(value: str, form: re.Pattern[str], tool: str, what: str) -> str:
    """``value`` stripped, when it matches ``form``; else the record is refused (``SlurmError``)."""
    value = value.strip()
    if not form.fullmatch(value):
        raise SlurmError(f"{tool}: unreadable record, {what} {value[:100]!r}")
    return value


def _host(value: str, tool: str, what: str) -> str:
    value = value.strip()
    return "" if value in _OPTIONAL else _fixed(value, ADDRESS, tool, what)


def parse_sinfo(text: str, nonce: str = "") -> list[NodeState]:
    """Nodes from ``sinfo -h -N -O node_format(nonce)`` (one record per node and partition,
    merged). Free text is kept whole; a record whose other fields do not check out, or that
    repeats a node and partition, is an error (``SlurmError``), never a node read wrong."""
    nodes: dict[str, NodeState] = {}
    seen_pairs: set[tuple[str, str]] = set()
    for parts in _records(text, "sinfo", nonce, len(NODE_FIELDS)):
        name, state, reason, user, when, comment, extra, part, host, addr = parts
        name = _fixed(name, NAME, "sinfo", "node name")
        words = _fixed(state, _STATE, "sinfo", "state").split("+")
        user = _fixed(user, _USER, "sinfo", "user")
        when = _fixed(when, _TIME, "sinfo", "time")
        partition = _fixed(part, _PARTITION, "sinfo", "partition").rstrip("*")
        host, addr = _host(host, "sinfo", "host name"), _host(addr, "sinfo", "address")
        if (name, partition) in seen_pairs:
            raise SlurmError(f"sinfo: unreadable output, {name} listed twice in {partition!r}")
        seen_pairs.add((name, partition))
        seen = nodes.get(name)
        if seen is not None:
            if partition and partition not in seen.partitions:
                nodes[seen.name] = replace(seen, partitions=(*seen.partitions, partition))
            continue
        no_reason = reason in ("", "none", "(null)") and when in ("", "Unknown")
        nodes[name] = SlurmNodeState(
            name=name,
            base=words[0].lower().rstrip("*~#%$@^!-"),
            flags=frozenset(w.upper() for w in words[1:] if w),
            reason="" if no_reason else reason,
            reason_time=0.0 if no_reason else _iso_time(when),
            reason_user="" if no_reason or user == "Unknown" else user,
            texts=((EXTRA, _text(extra)), (COMMENT, _text(comment))),
            partitions=(partition,) if partition else (),
            hostname=host,
            address=addr,
        )
    return list(nodes.values())


def _iso_time(text: str) -> float:
    import datetime

    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return 0.0


# squeue -O fields of one job (unpadded, ended by SEP + nonce); ``-j`` naming one job asks
# slurmctld for that job alone (REQUEST_JOB_INFO_SINGLE), where ``squeue --json`` lists the whole
# job table. Reason (a state description) and Comment (the job's user sets it) are free text.
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


def job_format(nonce: str) -> str:
    """The ``squeue -O`` argument whose fields end with ``SEP + nonce``."""
    return _format(JOB_FIELDS, nonce)


JOB_FORMAT = job_format("")  # the nonce-less layout of the recorded captures


def parse_squeue(text: str, nonce: str = "") -> list[JobInfo]:
    """Jobs from ``squeue -h -O job_format(nonce)``; free text is kept whole, and a record whose
    other fields do not check out is a ``SlurmError``."""
    jobs = []
    for parts in _records(text, "squeue", nonce, len(JOB_FIELDS)):
        job_id, user, state, reason, nodes, comment, requeue, batch, restarts, eligible = parts
        jobs.append(
            JobInfo(
                id=_fixed(job_id, _JOB_ID, "squeue", "job id"),
                user=_fixed(user, _USER, "squeue", "user"),
                state=_fixed(state, _JOB_STATE, "squeue", "state").upper(),
                reason=reason,
                nodes=_text(_fixed(nodes, _NODELIST, "squeue", "node list")),
                note=_text(comment),
                requeue=_fixed(requeue, _COUNT, "squeue", "requeue") != "0",
                batch=_fixed(batch, _COUNT, "squeue", "batch flag") != "0",
                restarts=int(_fixed(restarts, _COUNT, "squeue", "restart count")),
                eligible_time=_iso_time(_fixed(eligible, _TIME, "squeue", "time")),
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


# squeue -O fields of one job's allocation, for in-place replacement (``hma srun``): where a
# replacement must come from (partition, constraint) and whether the job holds generic resources
# (GRES jobs cannot be resized: docs/auto-resume.md).
ALLOC_FIELDS = (
    "JobID",
    "Partition",
    "Feature",
    "tres-per-node",
    "tres-per-job",
    "tres-per-task",
    "NodeList",
    "NumNodes",
    "BatchHost",
)


@dataclass(frozen=True)
class Allocation:
    """A running job's allocation as ``hma srun`` needs it to mend it in place."""

    id: str
    partition: str
    features: str  # the job's --constraint ("" when none)
    gres: str  # its generic resources per node/job/task, ";"-joined ("" when none)
    nodes: str  # node list expression
    num_nodes: int
    batch_host: str = ""  # the node running the batch script ("" for salloc)


def alloc_format(nonce: str) -> str:
    """The ``squeue -O`` argument of ``ALLOC_FIELDS`` whose fields end with ``SEP + nonce``."""
    return _format(ALLOC_FIELDS, nonce)


_CONSTRAINT = re.compile(r"[^\n\r\x00]*")


def parse_alloc(text: str, nonce: str = "") -> list[Allocation]:
    """Allocations from ``squeue -h -j ID -O alloc_format(nonce)``; a field that does not check
    out is a ``SlurmError``. A TRES field counts as GRES when it names ``gres``."""
    out = []
    for parts in _records(text, "squeue", nonce, len(ALLOC_FIELDS)):
        job_id, part, feature, per_node, per_job, per_task, nodes, count, host = parts
        tres = [_text(t.strip()) for t in (per_node, per_job, per_task)]
        out.append(
            Allocation(
                id=_fixed(job_id, _JOB_ID, "squeue", "job id"),
                partition=_text(_fixed(part, _PARTITION, "squeue", "partition")),
                features=_text(_fixed(feature, _CONSTRAINT, "squeue", "constraint")),
                gres=";".join(t for t in tres if "gres" in t.lower()),
                nodes=_text(_fixed(nodes, _NODELIST, "squeue", "node list")),
                num_nodes=int(_fixed(count, _COUNT, "squeue", "node count")),
                batch_host=_host(host, "squeue", "batch host"),
            )
        )
    return out


GRES_FIELDS = ("NodeList", "Gres")


def gres_format(nonce: str) -> str:
    """The ``sinfo -O`` argument of ``GRES_FIELDS`` whose fields end with ``SEP + nonce``."""
    return _format(GRES_FIELDS, nonce)


_GRES = re.compile(r"[A-Za-z0-9_.:()/,=+-]*")


def parse_node_gres(text: str, nonce: str = "") -> dict[str, str]:
    """Node name -> its configured generic resources ("" when none), from ``sinfo -h -N -n NODES
    -O gres_format(nonce)``; a field that does not check out is a ``SlurmError``."""
    out = {}
    for name, gres in _records(text, "sinfo", nonce, len(GRES_FIELDS)):
        out[_fixed(name, NAME, "sinfo", "node name")] = _text(_fixed(gres, _GRES, "sinfo", "gres"))
    return out
