"""``hma srun [--auto-resume=N] [srun options] command`` and ``hma job-env``.

``hma srun`` runs srun with the same arguments. On a non-zero exit it decides whether hardware
failed: a node of the job drained, failed or down with an hma-owned reason (``HMA: ...``) or a
HyperPod ``Action:*`` reason, or carrying hma's ``unhealthy`` label. The agents may need a moment
to mark a node after the step dies, so it polls for up to ``--grace`` seconds. Then:

============================================  ===============================================
no faulty node                                exit with srun's code (a script bug never loops)
faulty nodes, all out of service, attempts    record nodes + attempt in the job's Comment,
left                                          log, ``scontrol requeue`` (which ends us)
faulty nodes, attempts used up                exit with srun's code: "giving up"
a faulty node still schedulable (policy       exit with srun's code: never requeue onto it
none, breaker held)
============================================  ===============================================

Every decision goes to stderr and journald. The mechanism, the marker token and Slurm's ~2 minute
requeue delay are described in docs/auto-resume.md.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from hma.adapters import strict
from hma.adapters.text import printable
from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import ADDRESS, NAME, SlurmError
from hma.commands import common
from hma.contracts import label
from hma.contracts.alert import Alert
from hma.contracts.cluster import NodeState
from hma.contracts.model import Action, Severity
from hma.contracts.reporter import Reporter
from hma.remediation.requeue import Marker, find_marker, with_marker

GRACE_S = 60.0
POLL_S = 1.0
REQUEUE_WAIT_S = 60.0  # how long we wait to be killed by our own requeue
PROG = "hma srun"


class UsageError(Exception):
    """Bad arguments or wrong context (not in an allocation, job not requeueable); exit 2."""


@dataclass
class Options:
    """What ``hma srun`` was asked to do."""

    attempts: Optional[int]  # None: plain srun, no auto-resume
    grace: float = GRACE_S
    srun_args: list[str] = field(default_factory=list)


def _positive_int(text: str) -> int:
    try:
        value = strict.parse_uint(text, hex_ok=False)  # ASCII digits only (not '٣', '1_0')
    except strict.ParseError:
        value = 0
    if value < 1:
        raise UsageError(f"--auto-resume: {text!r} is not a positive integer (attempts allowed)")
    return value


MAX_GRACE_S = 86400.0


def _seconds(text: str) -> float:
    try:  # a plain ASCII decimal: no inf, nan, exponent or non-ASCII digits
        return strict.parse_decimal(text, low=0.0, high=MAX_GRACE_S)
    except strict.ParseError:
        raise UsageError(
            f"--grace: {text!r} is not a number of seconds >= 0 (at most {MAX_GRACE_S:g})"
        ) from None


OWN = {"--auto-resume": _positive_int, "--grace": _seconds}


GRACE_ENV = (
    "HMA_AUTO_RESUME_GRACE"  # default of --grace (a site can set it in the job's environment)
)


def parse_args(argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> Options:
    """Our own options before the first srun option; everything after is srun's, verbatim.

    ``--auto-resume=N`` / ``--auto-resume N`` and ``--grace=S`` / ``--grace S`` are ours; ``--``
    ends them explicitly. ``--grace`` defaults to $HMA_AUTO_RESUME_GRACE, else 60 s. Raises
    ``UsageError``.
    """
    env = os.environ if env is None else env
    opts = Options(None)
    if env.get(GRACE_ENV):
        opts.grace = _seconds(env[GRACE_ENV])
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        name, eq, value = arg.partition("=")
        if name not in OWN:
            break
        if not eq:
            if i + 1 >= len(argv):
                raise UsageError(f"{name} needs a value")
            i += 1
            value = argv[i]
        if name == "--auto-resume":
            opts.attempts = _positive_int(value)
        else:
            opts.grace = _seconds(value)
        i += 1
    opts.srun_args = list(argv[i:])
    if not opts.srun_args:
        raise UsageError("no command given (usage: hma srun [--auto-resume=N] [srun options] cmd)")
    return opts


# --- the decision ---------------------------------------------------------------------------------


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

    kind: str  # not_hardware, requeue, give_up, unsafe, unknown
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
            f"srun exited {rc}; cannot read the job's node states ({error}): no requeue",
        )
    if not faulty:
        return Decision(
            "not_hardware",
            f"srun exited {rc}; no node of the job is marked faulty (waited {waited:.0f} s): "
            "not a hardware failure, no requeue",
        )
    what = "; ".join(f"{name} ({why})" for name, why in faulty)
    open_nodes = [n.name for n in nodes if n.name in names and not n.out_of_service]
    if open_nodes:
        return Decision(
            "unsafe",
            f"srun exited {rc}; hardware fault on {what}, but {','.join(open_nodes)} is still "
            "schedulable (not drained, e.g. policy none or circuit breaker): not requeueing onto "
            "it",
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
        "requeue",
        f"srun exited {rc}; hardware fault on {what}; requeueing the job (attempt {attempt + 1} "
        f"of {attempts}) so that it restarts from its checkpoint on healthy nodes",
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


# --- reporting ------------------------------------------------------------------------------------


class Log:
    """Decisions to stderr (always) and journald (when configured)."""

    def __init__(self, journal: Optional[Reporter], stderr: Any = None) -> None:
        self.journal = journal
        self.stderr = stderr

    def __call__(self, text: str, severity: Severity = Severity.OK, **details: Any) -> None:
        """Write one decision."""
        stream = self.stderr if self.stderr is not None else sys.stderr
        print(f"{PROG}: {printable(text)}", file=stream, flush=True)
        if self.journal is not None:
            alert = Alert(
                "agent",
                "",
                "",
                severity,
                f"{PROG}: {text}",
                Action.NONE,
                "srun",
                details,
                time.time(),
            )
            try:
                self.journal.alert(alert)
            except Exception:  # noqa: BLE001 - logging never stops the decision
                pass


# --- running --------------------------------------------------------------------------------------


def run_srun(argv: Sequence[str], srun: Sequence[str] = ("srun",)) -> int:
    """Run srun with ``argv``; SIGINT/SIGTERM/SIGHUP are passed on. Returns its exit status."""
    try:
        child = subprocess.Popen([*srun, *argv])
    except OSError as exc:
        print(f"{PROG}: cannot run {srun[0]}: {exc}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: Any) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        rc = child.wait()
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
    return 128 - rc if rc < 0 else rc


def _attempt(env: Mapping[str, str]) -> int:
    try:
        return max(0, int(env.get("SLURM_RESTART_COUNT") or 0))
    except ValueError:
        return 0


def main(
    argv: Sequence[str],
    client: SlurmClient,
    log: Log,
    env: Optional[Mapping[str, str]] = None,
    srun: Sequence[str] = ("srun",),
) -> int:
    """``hma srun``: returns the exit code (or does not return: the requeue ends the job)."""
    env = os.environ if env is None else env
    try:
        opts = parse_args(argv, env)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if opts.attempts is None:
        return run_srun(opts.srun_args, srun)
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        print(
            f"{PROG}: --auto-resume needs a Slurm allocation (SLURM_JOB_ID is not set): run it in "
            "an sbatch script",
            file=sys.stderr,
        )
        return 2
    try:
        job = client.job_info(job_id)
    except SlurmError as exc:
        print(f"{PROG}: cannot read job {job_id}: {exc}", file=sys.stderr)
        return 2
    if not job.batch:
        print(
            f"{PROG}: job {job_id} is an interactive allocation (salloc); only batch jobs can be "
            "requeued: submit the script with sbatch --requeue",
            file=sys.stderr,
        )
        return 2
    if not job.requeue:
        print(
            f"{PROG}: job {job_id} cannot be requeued (submitted with --no-requeue or "
            "JobRequeue=0): submit it with sbatch --requeue",
            file=sys.stderr,
        )
        return 2
    attempt = _attempt(env)
    old = find_marker(job.note)
    marker = Marker(opts.attempts, old.attempt if old else 0, old.nodes if old else ())
    if old != marker:
        try:  # the agents learn from it that this job auto-resumes (replace, not reboot)
            client.update_job(job_id, Comment=with_marker(job.note, marker))
        except SlurmError as exc:
            log(f"cannot mark job {job_id} in its Comment: {exc}", Severity.WARNING, job=job_id)
    try:
        names = client.hostnames(job.nodes)
    except SlurmError as exc:
        print(f"{PROG}: cannot expand the job's node list {job.nodes!r}: {exc}", file=sys.stderr)
        return 2
    rc = run_srun(opts.srun_args, srun)
    if rc == 0:
        return 0
    nodes, waited, error = watch(client, names, opts.grace)
    decision = decide(rc, nodes, attempt, opts.attempts, waited, error)
    details = {
        "job": job_id,
        "decision": decision.kind,
        "exit_code": rc,
        "attempt": attempt,
        "attempts": opts.attempts,
        "faulty_nodes": list(decision.faulty),
        "nodes": names,
    }
    if decision.kind != "requeue":
        severity = Severity.OK if decision.kind == "not_hardware" else Severity.WARNING
        log(f"job {job_id}: {decision.message}; exit {rc}", severity, **details)
        return rc
    return _requeue(client, log, job_id, opts.attempts, attempt, decision, rc, details)


def _requeue(
    client: SlurmClient,
    log: Log,
    job_id: str,
    attempts: int,
    attempt: int,
    decision: Decision,
    rc: int,
    details: dict[str, Any],
) -> int:
    try:  # fresh: the user may have changed the comment meanwhile
        comment = client.job_info(job_id).note
        marker = Marker(attempts, attempt + 1, decision.faulty)
        client.update_job(job_id, Comment=with_marker(comment, marker))
    except SlurmError as exc:
        log(f"cannot record the attempt in job {job_id}'s Comment: {exc}", Severity.WARNING)
    log(f"job {job_id}: {decision.message}", Severity.WARNING, **details)
    try:
        client.requeue(job_id)
    except SlurmError as exc:
        log(f"job {job_id}: requeue failed ({exc}); exit {rc}", Severity.WARNING, **details)
        return rc
    deadline = time.monotonic() + REQUEUE_WAIT_S
    while time.monotonic() < deadline:  # Slurm ends this job step (and us) any moment now
        time.sleep(0.5)
    log(f"job {job_id}: requeued but this process was not ended; exit {rc}", Severity.WARNING)
    return rc


# --- hma job-env ----------------------------------------------------------------------------------


def job_env(client: SlurmClient, env: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """NODE_LIST (fresh from the controller), MASTER_NODE, MASTER_ADDR, NNODES, NODE_RANK: node
    names and the first node's address only (fields users cannot write), each checked."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise UsageError("not inside a Slurm job (SLURM_JOB_ID is not set)")
    if not job_id.isdigit():
        raise UsageError(f"SLURM_JOB_ID {job_id[:50]!r} is not a job id")
    job = client.job_info(job_id)
    hosts = client.hostnames(job.nodes)
    if not hosts:
        raise UsageError(f"job {job_id} has no nodes ({job.state})")
    bad = [h for h in hosts if not NAME.fullmatch(h)]
    if bad:
        raise SlurmError(f"job {job_id}: unreadable node name {bad[0][:100]!r}")
    me = env.get("SLURMD_NODENAME", "")
    if me not in hosts:
        own = {socket.gethostname(), socket.gethostname().split(".")[0]}
        mine = [h for h in hosts if h in own]
        me = mine[0] if len(mine) == 1 else ""
    if not me:
        raise UsageError("cannot tell which node of the job this is (SLURMD_NODENAME not set)")
    master = client.node(hosts[0])
    addr = master.address or master.hostname or hosts[0]
    if not ADDRESS.fullmatch(addr):
        raise SlurmError(f"node {hosts[0]}: unreadable address {addr[:100]!r}")
    return {
        "JOB_ID": job_id,
        "NODE_LIST": hosts,
        "MASTER_NODE": hosts[0],
        "MASTER_ADDR": addr,
        "NNODES": len(hosts),
        "NODE_RANK": hosts.index(me),
    }


def render_env(values: Mapping[str, Any], fmt: str) -> str:
    """``sh``: ``export KEY='value'`` lines for eval; ``json``: one object."""
    if fmt == "json":
        return json.dumps(dict(values), indent=2, allow_nan=False)
    out = []
    for key, value in values.items():
        text = " ".join(value) if isinstance(value, list) else str(value)
        out.append(f"export {key}={shlex.quote(text)}")
    return "\n".join(out)


def job_env_main(client: SlurmClient, fmt: str) -> int:
    """``hma job-env``: print the variables; exit 2 outside a job, 1 when Slurm fails."""
    try:
        values = job_env(client)
    except UsageError as exc:
        print(f"hma job-env: {exc}", file=sys.stderr)
        return 2
    except SlurmError as exc:
        print(f"hma job-env: {exc}", file=sys.stderr)
        return 1
    print(render_env(values, fmt))
    return 0


# --- wiring ---------------------------------------------------------------------------------------


def from_config(config_file: Optional[str]) -> tuple[SlurmClient, Optional[Reporter]]:
    """The Slurm client of the configured backend and the journald reporter of
    ``[reporters.journald]``; defaults (with a warning) when the configuration cannot be read,
    ``ConfigError`` when ``[cluster] backend`` is not Slurm's."""
    from hma import assembly
    from hma.config.schema import ConfigError
    from hma.reporters.journal import JournalReporter

    quiet = io.StringIO()  # journald missing: we print our own stderr line anyway
    try:
        setup = assembly.load(config_file)
    except (ConfigError, OSError) as exc:
        print(f"hma: configuration not usable ({exc}); using defaults", file=sys.stderr)
        return SlurmClient(), JournalReporter({}, stderr=quiet)
    client = common.slurm_client(setup)
    journal_opts = setup.config.reporters.get("journald") or {}
    journal = JournalReporter(journal_opts, stderr=quiet) if journal_opts.get("enabled") else None
    return client, journal
