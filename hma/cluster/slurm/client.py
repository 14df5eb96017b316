"""The Slurm client: scontrol/sinfo/squeue as argv lists with timeouts, each call's cost on
slurmctld chosen (docs/scale.md)."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from hma.adapters.command import CommandResult, CommandRunner
from hma.cluster.slurm.parse import (
    HELD_STATES,
    LIVE_JOB_STATES,
    Allocation,
    SlurmError,
    alloc_format,
    gres_format,
    job_format,
    new_nonce,
    node_format,
    parse_alloc,
    parse_listpids,
    parse_node_gres,
    parse_sinfo,
    parse_spool,
    parse_squeue,
)
from hma.contracts.cluster import (
    Job,
    JobInfo,
    NodeState,
)

OUTPUT_CAP = 64 << 20  # bytes of a Slurm client's output read; a longer one is an error


@dataclass
class SlurmClient:
    """scontrol / sinfo / squeue as argv lists, every call with a timeout; raises ``SlurmError``."""

    scontrol: Sequence[str] = ("scontrol",)
    sinfo: Sequence[str] = ("sinfo",)
    squeue: Sequence[str] = ("squeue",)
    salloc: Sequence[str] = ("salloc",)  # from_options: next to scontrol
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
            salloc=[
                *sl["scontrol"][:-1],
                os.path.join(os.path.dirname(sl["scontrol"][-1]), "salloc"),
            ],
            conf=sl["conf"],
            timeout=float(sl["timeout"]),
            path=str(sl["path"] or ""),
            spool_dir=sl["spool_dir"],
        )

    def env(self) -> dict[str, str]:
        """Environment of every call: ours plus SLURM_CONF and PATH when configured, and Slurm's
        standard time format."""
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        if self.path:
            env["PATH"] = self.path
        elif "PATH" not in env:
            env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env.update(SLURM_TIME_FORMAT="standard")  # the ISO times the parser checks
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
        filters apply in the client: use them to keep the output small, not the query). Each
        call ends its fields with a fresh nonce (``parse_sinfo``)."""
        nonce = new_nonce()
        argv = [*self.sinfo, "-h", "-N", "-O", node_format(nonce)]
        if names:
            argv += ["-n", ",".join(names)]
        if partitions:
            argv += ["-p", ",".join(partitions)]
        if states:
            argv += ["-t", ",".join(states)]
        nodes = parse_sinfo(self._run(argv).stdout, nonce)
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
            self.spool_dir = self.config_value("SlurmdSpoolDir") or ""
        host = socket.gethostname().split(".")[0]
        return self.spool_dir.replace("%n", node).replace("%h", host)

    def config_value(self, key: str) -> Optional[str]:
        """One ``scontrol show config`` value (``""``: not set, ``(null)``); None when the
        configuration cannot be read."""
        result = self._call([*self.scontrol, "show", "config"])
        if not result.ok:
            return None
        for line in result.stdout.splitlines():
            name, _, value = line.partition("=")
            if name.strip() == key:
                value = value.strip()
                return "" if value == "(null)" else value
        return ""

    def jobs(self, node: str) -> list[Job]:
        """Jobs with steps on ``node`` (``steps``: no controller query). User and note (the job's
        Comment) come from a single-job query when a job or one of its steps is first seen (``hma
        srun`` marks the Comment before it starts its step); a job Slurm says is over is left
        out."""
        seen: dict[str, tuple[tuple[str, ...], Optional[Job]]] = {}
        for job_id, ids in self.steps(node).items():
            known = self.jobs_seen.get(job_id)
            if known is not None and known[0] == ids:
                seen[job_id] = known
                continue
            infos = [i for i in self.job_infos([job_id]) if i.state in LIVE_JOB_STATES]
            job = Job(job_id, infos[0].user, infos[0].state, infos[0].note) if infos else None
            seen[job_id] = (ids, job)  # None: a leftover socket, not asked about again
        self.jobs_seen = seen
        return [job for _ids, job in seen.values() if job is not None]

    def job_infos(self, ids: Sequence[str]) -> list[JobInfo]:
        """Queued/running jobs among ``ids`` (single-job queries, each with a fresh nonce; gone jobs
        are simply absent, a job listed twice is a ``SlurmError``)."""
        out = []
        for job_id in ids:
            nonce = new_nonce()
            result = self._call([*self.squeue, "-h", "-j", str(job_id), "-O", job_format(nonce)])
            if not result.ok:
                if "invalid job id" in (result.stderr + result.stdout).lower():
                    continue
                raise SlurmError(_describe(result))
            found = [j for j in parse_squeue(result.stdout, nonce) if j.id == str(job_id)]
            if len(found) > 1:
                raise SlurmError(f"squeue: job {job_id} listed {len(found)} times")
            out += found
        return out

    def job_info(self, job_id: str) -> JobInfo:
        """One job; ``SlurmError`` when Slurm no longer knows it."""
        for job in self.job_infos([job_id]):
            return job
        raise SlurmError(f"job {job_id} not found")

    def allocation(self, job_id: str) -> Allocation:
        """A running job's allocation (partition, constraint, GRES, nodes): one single-job
        query; ``SlurmError`` when Slurm no longer knows the job."""
        nonce = new_nonce()
        result = self._run([*self.squeue, "-h", "-j", str(job_id), "-O", alloc_format(nonce)])
        for alloc in parse_alloc(result.stdout, nonce):
            if alloc.id == str(job_id):
                return alloc
        raise SlurmError(f"job {job_id} not found")

    def node_gres(self, names: Sequence[str]) -> dict[str, str]:
        """Node name -> its configured generic resources ("" when none), for ``names`` only."""
        if not names:
            return {}
        nonce = new_nonce()
        argv = [*self.sinfo, "-h", "-N", "-n", ",".join(names), "-O", gres_format(nonce)]
        return parse_node_gres(self._run(argv).stdout, nonce)

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

    def expand(self, alloc: Allocation, count: int, wait_s: float) -> str:
        """A new allocation of ``count`` whole nodes that may be merged into ``alloc``'s job
        (``salloc --dependency=expand:<job> --no-shell``, same partition and constraint), given
        up after ``wait_s`` seconds (``--immediate``); its job id. ``SlurmError`` with salloc's
        words when none comes (docs/auto-resume.md)."""
        argv = [*self.salloc, f"-N{count}", "--exclusive", f"--dependency=expand:{alloc.id}"]
        argv += [
            "--no-shell",
            f"--immediate={max(1, int(wait_s))}",
            f"--job-name=hma-replace-{alloc.id}",
        ]
        argv += [f"--partition={alloc.partition}"] if alloc.partition else []
        argv += [f"--constraint={alloc.features}"] if alloc.features else []
        env = {k: v for k, v in self.env().items() if not k.startswith(("SLURM_", "SALLOC_"))}
        env.update(
            {k: v for k, v in self.env().items() if k in ("SLURM_CONF", "SLURM_TIME_FORMAT")}
        )
        result = self.runner.run(argv, wait_s + self.timeout, env=env)
        granted = _GRANTED.search(result.stderr + result.stdout)
        if result.ok and granted:
            return granted.group(1)
        raise SlurmError(_describe(result))

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue <job>`` (run inside the job, this ends the caller)."""
        self._run([*self.scontrol, "requeue", str(job_id)])


_GRANTED = re.compile(r"Granted job allocation (\d+)")


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
