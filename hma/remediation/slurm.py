"""The Slurm client: scontrol/sinfo/squeue as argv lists with timeouts, and node state parsing.

Node state is read with ``sinfo --json`` where it lists node objects (Slurm 22.05), else with
``scontrol -o show node`` (Slurm without JSON, and 24.11, whose ``sinfo --json`` lists node sets
without reasons). ``NodeState`` turns Slurm's base state + flags into the few facts remediation
needs (drain vs draining vs drained, fail/failing, down, reboot requested/issued, maintenance, not
responding). A state it does not recognise sets ``understood = False``: remediation then does
nothing to the node and says so.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from hma.adapters.command import CommandResult, CommandRunner

OWNED_PREFIX = "HMA:"
HYPERPOD_REBOOT = "Action:Reboot"
HYPERPOD_REPLACE = "Action:Replace"

# Base states (lower case, as sinfo --json prints them and scontrol's State= before the first +).
BASE_STATES = frozenset(
    {"idle", "allocated", "mixed", "down", "error", "future", "unknown", "completing"}
)
# Flags remediation knows; anything else makes the state "not understood".
KNOWN_FLAGS = frozenset(
    {
        "DRAIN",
        "FAIL",
        "COMPLETING",
        "NOT_RESPONDING",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "MAINTENANCE",
        "RESERVED",
        "POWER_DOWN",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWERING_UP",
        "POWER_UP",
        "CLOUD",
        "DYNAMIC_FUTURE",
        "DYNAMIC_NORM",
        "PLANNED",
        "INVALID_REG",
        "NO_RESPOND",
        "PERFCTRS",
        "POWER_DRAIN",
        "RES",
        "MAINT",
        "UNDRAIN",
        "RESUME",
        "REBOOT_CANCEL",
        "INVALID",
        "BLOCKED",
    }
)


class SlurmError(Exception):
    """A Slurm client call failed (unreachable controller, bad node, unexpected output)."""


@dataclass(frozen=True)
class NodeState:
    """One node as Slurm sees it."""

    name: str
    base: str  # idle, allocated, mixed, down, ... (lower case)
    flags: frozenset[str] = frozenset()
    reason: str = ""
    reason_time: float = 0.0
    reason_user: str = ""
    comment: str = ""
    extra: str = ""
    partitions: tuple[str, ...] = ()
    hostname: str = ""
    boot_time: float = 0.0
    address: str = ""  # NodeAddr

    @property
    def understood(self) -> bool:
        """False when Slurm reports a base state or flag this code does not know."""
        return self.base in BASE_STATES and self.flags <= KNOWN_FLAGS

    @property
    def busy(self) -> bool:
        """Jobs are (still) on the node."""
        return self.base in ("allocated", "mixed", "completing") or "COMPLETING" in self.flags

    @property
    def drain(self) -> bool:
        """The DRAIN flag is set (draining or drained)."""
        return "DRAIN" in self.flags

    @property
    def draining(self) -> bool:
        """Drain set but jobs still run."""
        return self.drain and self.busy

    @property
    def drained(self) -> bool:
        """Drain set and no job left."""
        return self.drain and not self.busy

    @property
    def fail(self) -> bool:
        """FAIL flag (fail or failing)."""
        return "FAIL" in self.flags

    @property
    def down(self) -> bool:
        """Base state down."""
        return self.base == "down"

    @property
    def not_responding(self) -> bool:
        """slurmctld cannot reach the node's slurmd."""
        return "NOT_RESPONDING" in self.flags or "NO_RESPOND" in self.flags

    @property
    def reboot_pending(self) -> bool:
        """A reboot was requested or issued and has not completed."""
        return bool({"REBOOT_REQUESTED", "REBOOT_ISSUED"} & self.flags)

    @property
    def maintenance(self) -> bool:
        """In a maintenance reservation."""
        return bool({"MAINTENANCE", "MAINT"} & self.flags)

    @property
    def out_of_service(self) -> bool:
        """Drained, draining, down or failed: someone took it out of scheduling."""
        return self.drain or self.fail or self.down

    @property
    def owned(self) -> bool:
        """Held by hma: out of service with hma's reason (starts ``HMA:``; Slurm may append
        `` : reboot issued``). Slurm 24.11 keeps the last reason of a resumed node: on a node
        back in service it says nothing."""
        return self.out_of_service and self.reason.startswith(OWNED_PREFIX)

    @property
    def label_text(self) -> str:
        """A compact state string like sinfo's (``drained``, ``draining@``, ``down*``)."""
        if self.fail:
            text = "failing" if self.busy else "fail"
        elif self.drain:
            text = "draining" if self.busy else "drained"
        else:
            text = self.base
        if self.not_responding:
            text += "*"
        if "REBOOT_ISSUED" in self.flags:
            text += "^"
        elif "REBOOT_REQUESTED" in self.flags:
            text += "@"
        if self.maintenance:
            text += "$"
        return text

    def field(self, name: str) -> str:
        """The label field's text (``extra`` or ``comment``)."""
        return self.comment if name == "comment" else self.extra


def node_from_json(item: Mapping[str, Any]) -> NodeState:
    """A ``NodeState`` from one ``sinfo --json`` node object."""
    state = item.get("state", "")
    if isinstance(state, list):  # newer Slurm: "state": ["IDLE", "DRAIN"]
        parts = [str(s).upper() for s in state]
        base = parts[0].lower() if parts else "unknown"
        flags = set(parts[1:])
    else:
        base = str(state).lower()
        flags = set()
    flags |= {str(f).upper() for f in item.get("state_flags") or ()}
    return NodeState(
        name=str(item.get("name", "")),
        base=base,
        flags=frozenset(flags),
        reason=str(item.get("reason") or ""),
        reason_time=_number(item.get("reason_changed_at")),
        reason_user=str(item.get("reason_set_by_user") or ""),
        comment=str(item.get("comment") or ""),
        extra=str(item.get("extra") or ""),
        partitions=tuple(str(p) for p in item.get("partitions") or ()),
        hostname=str(item.get("hostname") or ""),
        boot_time=_number(item.get("boot_time")),
        address=str(item.get("address") or ""),
    )


def _number(value: Any) -> float:
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": 123}
        value = value.get("number", 0)
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


_REASON_RE = re.compile(r"^(?P<text>.*?)(?: \[(?P<user>[^@\]]*)@(?P<time>[^\]]*)\])?$")


def parse_show_node(text: str) -> list[NodeState]:
    """Nodes from ``scontrol -o show node`` (one node a line; the fallback of ``sinfo --json``).

    Slurm 22.05 prints the free-text fields last, in the order ``Reason= Comment= Extra=``; a
    comment that itself contains `` Extra=`` is therefore ambiguous here (not in JSON).
    """
    nodes = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("NodeName="):
            continue
        fields: dict[str, str] = {}
        if " Extra=" in line:
            line, fields["Extra"] = line.rsplit(" Extra=", 1)
        if " Comment=" in line:
            line, fields["Comment"] = line.rsplit(" Comment=", 1)
        if " Reason=" in line:
            line, fields["Reason"] = line.split(" Reason=", 1)
        for part in line.split():
            if "=" in part:
                key, value = part.split("=", 1)
                fields.setdefault(key, value)
        parts = fields.get("State", "UNKNOWN").split("+")
        reason, user, when = fields.get("Reason", ""), "", 0.0
        if reason in ("(null)", "None"):
            reason = ""
        match = _REASON_RE.match(reason)
        if match and match.group("user") is not None:
            reason, user = match.group("text"), match.group("user")
            when = _iso_time(match.group("time"))
        nodes.append(
            NodeState(
                name=fields.get("NodeName", ""),
                base=parts[0].lower().rstrip("*~#%$@^!-"),
                flags=frozenset(p.upper() for p in parts[1:]),
                reason=reason,
                reason_time=when,
                reason_user=user,
                comment="" if fields.get("Comment") == "(null)" else fields.get("Comment", ""),
                extra="" if fields.get("Extra") == "(null)" else fields.get("Extra", ""),
                partitions=tuple(p for p in fields.get("Partitions", "").split(",") if p),
                hostname=fields.get("NodeHostName", ""),
                address=fields.get("NodeAddr", ""),
            )
        )
    return nodes


def _iso_time(text: str) -> float:
    import datetime

    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class Job:
    """A job on the node."""

    id: str
    user: str
    state: str = ""
    comment: str = ""


@dataclass(frozen=True)
class JobInfo:
    """A queued or running job as ``squeue --json`` describes it."""

    id: str
    user: str
    state: str  # RUNNING, PENDING, COMPLETING, ... (upper case)
    reason: str = ""  # state_reason: BeginTime, Resources, None, ...
    nodes: str = ""  # node list expression (empty while pending)
    comment: str = ""
    requeue: bool = True
    batch: bool = True
    restarts: int = 0
    eligible_time: float = 0.0


def job_from_json(item: Mapping[str, Any]) -> JobInfo:
    """A ``JobInfo`` from one ``squeue --json`` job object."""
    state = item.get("job_state", "")
    if isinstance(state, list):  # newer Slurm: a list of states
        state = state[0] if state else ""
    return JobInfo(
        id=str(item.get("job_id", "")),
        user=str(item.get("user_name") or ""),
        state=str(state).upper(),
        reason=str(item.get("state_reason") or ""),
        nodes=str(item.get("nodes") or ""),
        comment=str(item.get("comment") or ""),
        requeue=bool(item.get("requeue", True)),
        batch=bool(item.get("batch_flag", True)),
        restarts=int(_number(item.get("restart_cnt"))),
        eligible_time=_number(item.get("eligible_time")),
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
    runner: CommandRunner = field(default_factory=CommandRunner)
    use_json: Optional[bool] = None  # None: try sinfo --json, remember if it is unsupported

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

    def _run(self, argv: Sequence[str], timeout: Optional[float] = None) -> CommandResult:
        result = self.runner.run(list(argv), timeout or self.timeout, env=self.env())
        if not result.ok:
            raise SlurmError(_describe(result))
        return result

    # --- reading --------------------------------------------------------------------------------

    def nodes(self, names: Sequence[str] = ()) -> list[NodeState]:
        """Every node (or the named ones) with its state."""
        if self.use_json is not False:
            argv = [*self.sinfo, "--json"]
            if names:
                argv += ["-n", ",".join(names)]
            result = self.runner.run(argv, self.timeout, env=self.env())
            if result.ok:
                try:
                    data = json.loads(result.stdout)
                    # 24.11 lists node sets ({"sinfo": [...]}, no reason, extra or comment)
                    grouped = "sinfo" in data and "nodes" not in data
                    items = [] if grouped else data["nodes"]
                    errors = data.get("errors") or []
                    self.use_json = not grouped
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise SlurmError(f"sinfo --json: unreadable output: {exc}") from None
                if errors:  # 22.05 exits 0 with an error list when slurmctld is unreachable
                    text = "; ".join(
                        str(e.get("error") or e) if isinstance(e, dict) else str(e) for e in errors
                    )
                    lines = result.stderr.strip().splitlines()
                    text = f"{lines[-1][:300]}; {text}" if lines else text
                    raise SlurmError(f"sinfo --json: {text} (is slurmctld reachable?)")
                if not grouped:
                    nodes = [node_from_json(i) for i in items if isinstance(i, dict)]
                    # sinfo lists a node once per partition in some versions
                    return list({n.name: n for n in nodes if not names or n.name in names}.values())
            elif self.use_json is None and _json_unsupported(result):
                self.use_json = False
            else:
                raise SlurmError(_describe(result))
        argv = [*self.scontrol, "-o", "show", "node"]
        if names:
            argv.append(",".join(names))
        return parse_show_node(self._run(argv).stdout)

    def node(self, name: str) -> NodeState:
        """The state of one node; ``SlurmError`` when Slurm does not know it."""
        for node in self.nodes([name]):
            if node.name == name:
                return node
        raise SlurmError(f"node {name!r} not found")

    def jobs(self, node: str) -> list[Job]:
        """Jobs running (or completing) on ``node``."""
        argv = [*self.squeue, "-h", "-w", node, "-t", "R,CG,S", "-o", "%i %u %T %k"]
        jobs = []
        for line in self._run(argv).stdout.splitlines():
            parts = line.split(" ", 3)  # the comment (last) may contain spaces
            if len(parts) >= 2 and parts[0]:
                comment = parts[3] if len(parts) > 3 and parts[3] != "(null)" else ""
                jobs.append(Job(parts[0], parts[1], parts[2] if len(parts) > 2 else "", comment))
        return jobs

    def job_infos(self, ids: Sequence[str]) -> list[JobInfo]:
        """Queued/running jobs among ``ids`` (``squeue --json``; gone jobs are simply absent).

        Slurm 22.05's ``squeue --json`` ignores ``-j`` and lists every job: the ids are filtered
        here (``-j`` is kept for versions that honour it)."""
        if not ids:
            return []
        out = self._run([*self.squeue, "--json", "-j", ",".join(ids)]).stdout
        try:
            items = json.loads(out)["jobs"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SlurmError(f"squeue --json: unreadable output: {exc}") from None
        wanted = {str(i) for i in ids}  # squeue --json (22.05) ignores -j: filter here
        jobs = [job_from_json(i) for i in items if isinstance(i, dict)]
        return [j for j in jobs if j.id in wanted]

    def job_info(self, job_id: str) -> JobInfo:
        """One job; ``SlurmError`` when Slurm no longer knows it."""
        for job in self.job_infos([job_id]):
            if job.id == str(job_id):
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
        nodes = parse_show_node(self._run([*self.scontrol, "-o", "show", "node"]).stdout)
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


def _describe(result: CommandResult) -> str:
    name = os.path.basename(result.argv[0]) if result.argv else "command"
    if result.error:
        return result.error
    if result.timed_out:
        return f"{name} timed out after {result.duration_s:.1f} s"
    text = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return f"{name} exited {result.rc}: {text[-1][:300] if text else 'no output'}"


def _json_unsupported(result: CommandResult) -> bool:
    text = (result.stderr + result.stdout).lower()
    return result.rc not in (None, 0) and (
        "unrecognized option" in text or "invalid option" in text or "serializer" in text
    )


def _own_hostnames() -> list[str]:
    name = socket.gethostname()
    out = [name, name.split(".")[0]]
    try:
        out.append(socket.getfqdn())
    except OSError:
        pass
    return list(dict.fromkeys(out))
