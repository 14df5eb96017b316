"""The Slurm client: scontrol/sinfo/squeue as argv lists with timeouts, and node state parsing.

Every call's cost on slurmctld is chosen (checked with ``sdiag``, docs/scale.md): this node's state
from ``sinfo -n NODE -O ...`` (a single-node query), its jobs from the local slurmd (``scontrol
listpids``), a job from ``squeue -j ID -O ...`` (a single-job query). Only the breaker and ``hma
fleet`` read the node table, with text filtered to the few nodes they need. ``NodeState`` turns
Slurm's base state + flags into the few facts remediation needs (drain vs draining vs drained,
fail/failing, down, reboot requested/issued, maintenance, not responding). A state it does not
recognise sets ``understood = False``: remediation then does nothing to the node and says so.
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Mapping, Optional, Sequence

from hma.adapters.command import CommandResult, CommandRunner
from hma.contracts.cluster import (
    Backend,
    BackendError,
    Job,
    JobInfo,
    NodeState,
    Reboots,
    Replaces,
    RequeuesJobs,
    SetsDown,
    TakesSpares,
)
from hma.contracts.options import Option, positive
from hma.topology import spares

OUTPUT_CAP = 64 << 20  # bytes of a Slurm client's output read; a longer one is an error

# ``[slurm]``: the Slurm backend's own section (docs/remediation.md).
OPTIONS: dict[str, Option] = {
    "scontrol": Option("argv", ["scontrol"], "scontrol command."),
    "sinfo": Option("argv", ["sinfo"], "sinfo command."),
    "squeue": Option("argv", ["squeue"], "squeue command (jobs on the node)."),
    "conf": Option("path", None, "SLURM_CONF for every Slurm call (unset: Slurm's default)."),
    "path": Option(
        "str",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PATH for Slurm calls and hooks (HealthCheckProgram runs with no PATH).",
    ),
    "node_name": Option(
        "str", None, "This node's Slurm name; unset: match this host to NodeHostname/NodeName."
    ),
    "spool_dir": Option(
        "str",
        None,
        "SlurmdSpoolDir of this node (%n: node name): its jobs are read from the step sockets "
        "there; unset: asked once (scontrol show config); unreadable: scontrol listpids.",
    ),
    "timeout": Option("float", 20.0, "Seconds one Slurm client call may take.", check=positive),
    "heartbeat": Option(
        "float",
        600.0,
        "Seconds between reads of the node's Slurm state while nothing happens (jittered by "
        "10%; each read is one single-node sinfo: 2 controller RPCs).",
        check=positive,
    ),
    "facts_interval": Option(
        "float",
        10.0,
        "Seconds between reads of the node's jobs (local slurmd), and of its Slurm state while "
        "something happens (a fault, an action, a drain being watched, a controller outage).",
        check=positive,
    ),
    "enabled": Option(
        "bool",
        True,
        "Use Slurm at all (false: no facts, no labels, no actions).",
    ),
}


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


@dataclass
class SlurmClient:
    """scontrol / sinfo / squeue as argv lists, every call with a timeout; raises ``SlurmError``."""

    scontrol: Sequence[str] = ("scontrol",)
    sinfo: Sequence[str] = ("sinfo",)
    squeue: Sequence[str] = ("squeue",)
    conf: Optional[str] = None
    timeout: float = 20.0
    path: str = ""
    runner: CommandRunner = field(default_factory=lambda: CommandRunner(output_cap=OUTPUT_CAP))
    spool_dir: Optional[str] = None  # SlurmdSpoolDir (%n, %h expanded); None: ask Slurm once
    # jobs() cache: job id -> (its steps when last asked, the job then; None: over)
    jobs_seen: dict[str, tuple[tuple[str, ...], Optional[Job]]] = field(default_factory=dict)

    @classmethod
    def from_options(cls, sl: Mapping[str, Any]) -> SlurmClient:
        """The client of a ``[slurm]`` section's values."""
        return cls(
            scontrol=list(sl["scontrol"]),
            sinfo=list(sl["sinfo"]),
            squeue=list(sl["squeue"]),
            conf=sl["conf"],
            timeout=float(sl["timeout"]),
            path=str(sl["path"] or ""),
            spool_dir=sl["spool_dir"],
        )

    def env(self) -> dict[str, str]:
        """Environment of every call: ours plus SLURM_CONF and PATH when configured."""
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        if self.path:
            env["PATH"] = self.path
        elif "PATH" not in env:
            env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return env

    def _call(self, argv: Sequence[str], timeout: Optional[float] = None) -> CommandResult:
        result = self.runner.run(list(argv), timeout or self.timeout, env=self.env())
        if result.truncated:  # never parse a cut output
            name = os.path.basename(result.argv[0]) if result.argv else "command"
            raise SlurmError(f"{name}: output over {OUTPUT_CAP >> 20} MiB, not read")
        return result

    def _run(self, argv: Sequence[str], timeout: Optional[float] = None) -> CommandResult:
        result = self._call(argv, timeout)
        if not result.ok:
            raise SlurmError(_describe(result))
        return result

    # --- reading --------------------------------------------------------------------------------

    def nodes(
        self, names: Sequence[str] = (), partitions: Sequence[str] = (), states: Sequence[str] = ()
    ) -> list[NodeState]:
        """The named nodes (all when none), in ``partitions`` and ``states`` when given.

        One name costs slurmctld a single-node query; anything else reads its node table (the
        filters apply in the client: use them to keep the output small, not the query)."""
        argv = [*self.sinfo, "-h", "-N", "-O", NODE_FORMAT]
        if names:
            argv += ["-n", ",".join(names)]
        if partitions:
            argv += ["-p", ",".join(partitions)]
        if states:
            argv += ["-t", ",".join(states)]
        nodes = parse_sinfo(self._run(argv).stdout)
        return [n for n in nodes if not names or n.name in names]

    def node(self, name: str) -> NodeState:
        """One node's state (a single-node query); ``SlurmError`` when Slurm does not know it."""
        for node in self.nodes([name]):
            if node.name == name:
                return node
        raise SlurmError(f"node {name!r} not found")

    def held_view(self, node: NodeState) -> tuple[list[NodeState], int]:
        """What the breaker counts for ``node``: the drained, failed and down nodes of its
        partitions (one filtered ``sinfo``) and how many nodes those partitions hold (from the
        partition table, expanded locally)."""
        parts = [p for p in node.partitions if p]
        held = self.nodes(partitions=parts, states=HELD_STATES)
        total = self.partition_size(parts)
        mine = [] if any(n.name == node.name for n in held) else [node]
        return held + mine, total

    def partition_size(self, partitions: Sequence[str]) -> int:
        """Nodes in the union of ``partitions`` (all when none): the partition table (one small
        RPC), its node lists expanded locally."""
        out = self._run([*self.scontrol, "-o", "show", "partition"]).stdout
        exprs = []
        for line in out.splitlines():
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            nodes = fields.get("Nodes", "(null)")
            if (not partitions or fields.get("PartitionName") in partitions) and nodes != "(null)":
                exprs.append(nodes)
        return len(set(self.hostnames(",".join(exprs))))

    def steps(self, node: str) -> dict[str, tuple[str, ...]]:
        """Job id -> step ids on ``node``, read where slurmd keeps them: the step daemons'
        sockets ``<node>_<job>.<step>`` in SlurmdSpoolDir (a directory listing), else ``scontrol
        listpids`` (which asks the local slurmd; neither asks slurmctld)."""
        spool = self.spool(node)
        if spool:
            try:
                return parse_spool(os.listdir(spool), node)
            except OSError:
                pass
        result = self._call([*self.scontrol, "listpids", "*", node])
        if not result.ok:
            if "no job steps exist" not in (result.stderr + result.stdout).lower():
                raise SlurmError(_describe(result))
            return {}
        return parse_listpids(result.stdout)

    def spool(self, node: str) -> str:
        """SlurmdSpoolDir of ``node`` (``spool_dir``, else ``scontrol show config`` once)."""
        if self.spool_dir is None:
            self.spool_dir = ""
            result = self._call([*self.scontrol, "show", "config"])
            for line in result.stdout.splitlines() if result.ok else ():
                key, _, value = line.partition("=")
                if key.strip() == "SlurmdSpoolDir":
                    self.spool_dir = value.strip()
        host = socket.gethostname().split(".")[0]
        return self.spool_dir.replace("%n", node).replace("%h", host)

    def jobs(self, node: str) -> list[Job]:
        """Jobs with steps on ``node`` (``steps``: no controller query). User and comment come
        from a single-job query when a job or one of its steps is first seen (``hma srun`` marks
        the comment before it starts its step); a job Slurm says is over is left out."""
        seen: dict[str, tuple[tuple[str, ...], Optional[Job]]] = {}
        for job_id, ids in self.steps(node).items():
            known = self.jobs_seen.get(job_id)
            if known is not None and known[0] == ids:
                seen[job_id] = known
                continue
            infos = [i for i in self.job_infos([job_id]) if i.state in LIVE_JOB_STATES]
            job = Job(job_id, infos[0].user, infos[0].state, infos[0].comment) if infos else None
            seen[job_id] = (ids, job)  # None: a leftover socket, not asked about again
        self.jobs_seen = seen
        return [job for _ids, job in seen.values() if job is not None]

    def job_infos(self, ids: Sequence[str]) -> list[JobInfo]:
        """Queued/running jobs among ``ids`` (single-job queries; gone jobs are simply absent)."""
        out = []
        for job_id in ids:
            result = self._call([*self.squeue, "-h", "-j", str(job_id), "-O", JOB_FORMAT])
            if not result.ok:
                if "invalid job id" in (result.stderr + result.stdout).lower():
                    continue
                raise SlurmError(_describe(result))
            out += [j for j in parse_squeue(result.stdout) if j.id == str(job_id)]
        return out

    def job_info(self, job_id: str) -> JobInfo:
        """One job; ``SlurmError`` when Slurm no longer knows it."""
        for job in self.job_infos([job_id]):
            return job
        raise SlurmError(f"job {job_id} not found")

    def hostnames(self, nodelist: str) -> list[str]:
        """``scontrol show hostnames``: a node list expression expanded, in order."""
        if not nodelist:
            return []
        return self._run([*self.scontrol, "show", "hostnames", nodelist]).stdout.split()

    def find_node_name(self, hostnames: Sequence[str] = ()) -> Optional[str]:
        """This host's Slurm node name: NodeHostname (or NodeName) matching the host name."""
        names = list(hostnames) or _own_hostnames()
        for name in names:  # the usual case, NodeName = NodeHostname = host name: one node read
            found = self.nodes([name])
            if found and found[0].hostname == name:
                return name
        nodes = self.nodes()  # else the whole table, once at start ([slurm] node_name skips it)
        for attr in ("hostname", "name"):
            hits = [n.name for n in nodes if getattr(n, attr) in names]
            if len(hits) == 1:
                return hits[0]
        return None

    # --- writing --------------------------------------------------------------------------------

    def update(self, node: str, **fields: str) -> None:
        """``scontrol update NodeName=<node> Key=Value ...`` (values passed literally)."""
        argv = [*self.scontrol, "update", f"NodeName={node}"]
        argv += [f"{key}={value}" for key, value in fields.items()]
        self._run(argv)

    def reconfigure(self) -> None:
        """``scontrol reconfigure`` (slurmctld reads its configuration files again)."""
        self._run([*self.scontrol, "reconfigure"])

    def reboot(self, node: str, reason: str) -> None:
        """``scontrol reboot reason=<reason> <node>`` (no nextstate: the node stays drained)."""
        self._run([*self.scontrol, "reboot", f"reason={reason}", node])

    def update_job(self, job_id: str, **fields: str) -> None:
        """``scontrol update JobId=<job> Key=Value ...`` (values passed literally)."""
        argv = [*self.scontrol, "update", f"JobId={job_id}"]
        argv += [f"{key}={value}" for key, value in fields.items()]
        self._run(argv)

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue <job>`` (run inside the job, this ends the caller)."""
        self._run([*self.scontrol, "requeue", str(job_id)])


class SlurmBackend(Backend, Reboots, Replaces, SetsDown, TakesSpares, RequeuesJobs):
    """The Slurm backend: ``SlurmClient`` calls behind the ``Backend`` contract, with every
    capability. Reboot modes: ``scontrol`` (``scontrol reboot``) and ``hyperpod``; replace
    mode: ``hyperpod`` (``State=FAIL Reason=Action:Reboot`` / ``Action:Replace``)."""

    name = "slurm"
    options = OPTIONS

    def __init__(
        self, options: Mapping[str, Any], label_field: str, client: Optional[SlurmClient] = None
    ) -> None:
        super().__init__(options, label_field)
        self.client = client or SlurmClient.from_options(options)
        self._key = "Comment" if label_field == "comment" else "Extra"

    @property
    def enabled(self) -> bool:
        """``[slurm] enabled`` and scontrol found."""
        tool = str(self.config["scontrol"][0])
        path = str(self.config["path"] or os.environ.get("PATH", ""))
        found = (
            os.path.isabs(tool) and os.access(tool, os.X_OK) or bool(shutil.which(tool, path=path))
        )
        return bool(self.config["enabled"]) and found

    def node_name_configured(self) -> Optional[str]:
        """``[slurm] node_name``."""
        value = self.config.get("node_name")
        return str(value) if value else None

    def find_node_name(self) -> Optional[str]:
        """NodeHostname (or NodeName) matching this host."""
        return self.client.find_node_name()

    def node(self, name: str) -> NodeState:
        """``sinfo -n NAME``: a single-node query."""
        return self.client.node(name)

    def jobs(self, name: str) -> Sequence[Job]:
        """From the local slurmd (``SlurmClient.jobs``)."""
        return self.client.jobs(name)

    def peers(self, node: NodeState) -> tuple[list[NodeState], int]:
        """One filtered ``sinfo`` and the partition table (``SlurmClient.held_view``)."""
        return self.client.held_view(node)

    def job_infos(self, ids: Collection[str]) -> list[JobInfo]:
        """Single-job ``squeue`` queries."""
        return self.client.job_infos(list(ids))

    def env(self) -> dict[str, str]:
        """Ours plus SLURM_CONF and PATH (a hook may call scontrol)."""
        return self.client.env()

    def _fields(self, label: Optional[str]) -> dict[str, str]:
        return {} if label is None else {self._key: label}

    def label(self, name: str, text: str) -> None:
        """``scontrol update NodeName=NAME Extra=...`` (or Comment)."""
        self.client.update(name, **self._fields(text))

    def drain(self, name: str, reason: str, label: Optional[str] = None) -> None:
        """``State=DRAIN Reason=...`` (and the label) in one update."""
        self.client.update(name, State="DRAIN", Reason=reason, **self._fields(label))

    def resume(self, name: str, label: Optional[str] = None) -> None:
        """``State=RESUME`` (and the label) in one update."""
        self.client.update(name, State="RESUME", **self._fields(label))

    def down(self, name: str, reason: str) -> None:
        """``State=DOWN Reason=...``."""
        self.client.update(name, State="DOWN", Reason=reason)

    def reboot(self, name: str, reason: str, mode: str) -> None:
        """``scontrol reboot`` or HyperPod's ``State=FAIL Reason=Action:Reboot``."""
        if mode == "hyperpod":
            self.client.update(name, State="FAIL", Reason=HYPERPOD_REBOOT)
        else:
            self.client.reboot(name, reason)

    def rebooting(self, node: NodeState, mode: str) -> str:
        """``scontrol``: a reboot is requested or issued; ``hyperpod``: FAIL with its reason."""
        if mode == "scontrol" and node.reboot_pending:
            return "reboot already requested"
        return _hyperpod_done(node, mode, HYPERPOD_REBOOT)

    def replace(self, name: str, reason: str, mode: str, domain: Sequence[str] = ()) -> None:
        """HyperPod's ``State=FAIL Reason=Action:Replace`` (the only replace Slurm itself
        has; the topology domain is not needed for it)."""
        self.client.update(name, State="FAIL", Reason=HYPERPOD_REPLACE)

    def replacing(self, node: NodeState, mode: str) -> str:
        """``hyperpod``: the node is FAIL with its reason."""
        return _hyperpod_done(node, mode, HYPERPOD_REPLACE)

    def take_spare(self, name: str, domain: str) -> Optional[str]:
        """Resume the spare (drained ``hma-spare``) of ``domain`` (one node-table read)."""
        return spares.take_spare(self.client, name, domain)

    def update_job(self, job_id: str, **fields: str) -> None:
        """``scontrol update JobId=...``."""
        self.client.update_job(job_id, **fields)


def _hyperpod_done(node: NodeState, mode: str, reason: str) -> str:
    """The note for a HyperPod recovery (``reason``) already asked for, "" when it is not."""
    if mode == "hyperpod" and node.fail and node.reason == reason:
        return f"already State=FAIL Reason={reason}"
    return ""


def _describe(result: CommandResult) -> str:
    name = os.path.basename(result.argv[0]) if result.argv else "command"
    if result.error:
        return result.error
    if result.timed_out:
        return f"{name} timed out after {result.duration_s:.1f} s"
    text = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return f"{name} exited {result.rc}: {text[-1][:300] if text else 'no output'}"


def _own_hostnames() -> list[str]:
    name = socket.gethostname()
    out = [name, name.split(".")[0]]
    try:
        out.append(socket.getfqdn())
    except OSError:
        pass
    return list(dict.fromkeys(out))
