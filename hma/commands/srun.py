"""``hma srun [--auto-resume=N] [srun options] command`` and ``hma job-env``.

``hma srun`` runs srun with the same arguments. On a non-zero exit it decides whether hardware
failed (``hma.commands.srun_decide``: the agents may need a moment to mark a node after the step
dies, so it polls for up to ``--grace`` seconds). A hardware failure with attempts left is resumed:
a job without GRES is mended in place (``hma.commands.srun_inplace``: the faulty nodes swapped for
healthy ones inside the allocation, the same srun run again, the job id kept; ``sbatch`` and
``salloc`` alike), a GRES batch job is requeued (which ends us). Every decision goes to stderr and
journald. The mechanism, the marker token and Slurm's ~2 minute requeue delay are described in
docs/auto-resume.md.
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
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

from hma.adapters import strict
from hma.adapters.text import printable
from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import ADDRESS, NAME, Allocation, SlurmError
from hma.commands import common, srun_check, srun_inplace
from hma.commands.srun_decide import (
    Decision,
    decide,
    expansion_allowed,
    job_gres,
    mechanism,
    watch,
)
from hma.contracts.alert import Alert
from hma.contracts.cluster import JobInfo
from hma.contracts.model import Action, Severity
from hma.contracts.reporter import Reporter
from hma.remediation.requeue import Marker, find_marker, with_marker

GRACE_S = 60.0
REQUEUE_WAIT_S = 60.0  # how long we wait to be killed by our own requeue
PROG = "hma srun"


class UsageError(Exception):
    """Bad arguments or wrong context (not in an allocation, job not requeueable); exit 2."""


@dataclass
class Options:
    """What ``hma srun`` was asked to do."""

    attempts: Optional[int]  # None: plain srun, no auto-resume
    grace: float = GRACE_S
    replace_wait: float = srun_inplace.REPLACE_WAIT_S
    check_wait: float = srun_check.CHECK_WAIT_S  # 0: no hardware checks after a failed step
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


def _seconds(name: str, text: str) -> float:
    try:  # a plain ASCII decimal: no inf, nan, exponent or non-ASCII digits
        return strict.parse_decimal(text, low=0.0, high=MAX_GRACE_S)
    except strict.ParseError:
        raise UsageError(
            f"{name}: {text!r} is not a number of seconds >= 0 (at most {MAX_GRACE_S:g})"
        ) from None


# Our options: the attribute of Options each sets, and the environment variable giving its
# default (a site can set it in the job's environment).
OWN = {
    "--auto-resume": ("attempts", ""),
    "--grace": ("grace", "HMA_AUTO_RESUME_GRACE"),
    "--replace-wait": ("replace_wait", "HMA_AUTO_RESUME_REPLACE_WAIT"),
    "--check-wait": ("check_wait", "HMA_AUTO_RESUME_CHECK_WAIT"),
}
GRACE_ENV = OWN["--grace"][1]


def _set(opts: Options, name: str, value: str) -> None:
    attr = OWN[name][0]
    setattr(opts, attr, _positive_int(value) if attr == "attempts" else _seconds(name, value))


def parse_args(argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> Options:
    """Our own options before the first srun option; everything after is srun's, verbatim.

    ``--auto-resume=N``, ``--grace=S``, ``--replace-wait=S`` and ``--check-wait=S`` (each also as
    two words) are ours; ``--`` ends them explicitly. ``--grace`` defaults to
    $HMA_AUTO_RESUME_GRACE, else 60 s; ``--replace-wait`` to $HMA_AUTO_RESUME_REPLACE_WAIT, else
    300 s; ``--check-wait`` to $HMA_AUTO_RESUME_CHECK_WAIT, else 120 s. Raises ``UsageError``.
    """
    env = os.environ if env is None else env
    opts = Options(None)
    for name, (_attr, var) in OWN.items():
        if var and env.get(var):
            _set(opts, name, env[var])
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
        _set(opts, name, value)
        i += 1
    opts.srun_args = list(argv[i:])
    if not opts.srun_args:
        raise UsageError("no command given (usage: hma srun [--auto-resume=N] [srun options] cmd)")
    return opts


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


def run_srun(
    argv: Sequence[str], srun: Sequence[str] = ("srun",), env: Optional[Mapping[str, str]] = None
) -> int:
    """Run srun with ``argv`` (in ``env``, else ours); SIGINT/SIGTERM/SIGHUP are passed on.
    Returns its exit status."""
    try:
        child = subprocess.Popen([*srun, *argv], env=None if env is None else dict(env))
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


@dataclass
class Run:
    """One ``hma srun --auto-resume`` in its job: what it knows between attempts."""

    client: SlurmClient
    log: Log
    opts: Options
    job: JobInfo
    alloc: Allocation
    expansion: Optional[bool]  # permit_job_expansion set (None: unknown)
    gres: str  # the generic resources it holds ("" when none)
    names: list[str]  # the job's nodes now
    env: dict[str, str] = field(default_factory=dict)  # srun's (node list fresh after a mend)
    restarts: int = 0  # SLURM_RESTART_COUNT
    replaced: int = 0  # in-place resumes done by this process (a floor if the Comment is lost)

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self.job.id

    def marker(self) -> Marker:
        """The job's marker, fresh from its Comment (the user may have changed the comment)."""
        try:
            self.job = self.client.job_info(self.job_id)
        except SlurmError:
            pass
        found = find_marker(self.job.note)
        return found or Marker(self.opts.attempts or 1)

    def record(self, marker: Marker) -> None:
        """Write ``marker`` into the job's Comment, keeping the user's text."""
        try:
            self.client.update_job(self.job_id, Comment=with_marker(self.job.note, marker))
        except SlurmError as exc:
            self.log(f"cannot record {marker.token()} in job {self.job_id}'s Comment: {exc}")


def _start(client: SlurmClient, log: Log, opts: Options, env: Mapping[str, str]) -> Run | int:
    """Read and mark the job; an exit code when it cannot be."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        print(
            f"{PROG}: --auto-resume needs a Slurm allocation (SLURM_JOB_ID is not set): run it in "
            "an sbatch script or an salloc allocation",
            file=sys.stderr,
        )
        return 2
    try:
        job = client.job_info(job_id)
        alloc = client.allocation(job_id)
        names = client.hostnames(alloc.nodes)
    except SlurmError as exc:
        print(f"{PROG}: cannot read job {job_id}: {exc}", file=sys.stderr)
        return 2
    gres = job_gres(client, alloc, names)
    run = Run(client, log, opts, job, alloc, expansion_allowed(client), gres, names, dict(env))
    run.restarts = _attempt(env)
    how, why = mechanism(job, gres, run.expansion)
    if how == "none":
        log(f"job {job_id}: auto-resume cannot resume this job: {why}", Severity.WARNING)
    old = find_marker(job.note)
    marker = Marker(opts.attempts or 1, *(old.attempt, old.nodes, old.replaced) if old else ())
    if old != marker:  # the agents learn from it that this job auto-resumes (replace, not reboot)
        run.record(marker)
    return run


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
    run = _start(client, log, opts, env)
    if isinstance(run, int):
        return run
    while True:
        rc = run_srun(opts.srun_args, srun, run.env)
        if rc == 0:
            return 0
        checked = _check(run, rc, srun)
        nodes, waited, error = watch(client, run.names, opts.grace)
        marker = run.marker()
        used = run.restarts + max(marker.replaced, run.replaced)
        decision = decide(rc, nodes, used, opts.attempts, waited, error)
        details = {
            "job": run.job_id,
            "decision": decision.kind,
            "exit_code": rc,
            "attempt": used,
            "attempts": opts.attempts,
            "faulty_nodes": list(decision.faulty),
            "nodes": run.names,
            "checks": checked,
        }
        host = run.alloc.batch_host if run.alloc.batch_host in decision.faulty else ""
        how, why = mechanism(run.job, run.gres, run.expansion, host)
        if decision.kind != "resume" or how == "none":
            severity = Severity.OK if decision.kind == "not_hardware" else Severity.WARNING
            text = decision.message if decision.kind != "resume" else f"{decision.message}; {why}"
            log(f"job {run.job_id}: {text}; exit {rc}", severity, **details)
            return rc
        details["mechanism"] = how
        log(f"job {run.job_id}: {decision.message}; {why}", Severity.WARNING, **details)
        if how == "requeue":
            run.record(replace(marker, attempt=run.restarts + 1, nodes=decision.faulty))
            return _requeue(run, rc, details)
        if not _replace(run, marker, decision, rc, details):
            return rc


def _check(run: Run, rc: int, srun: Sequence[str]) -> str:
    """The hardware checks on the failed step's nodes (hma.commands.srun_check), logged; what
    came of them ("" when ``--check-wait=0``). The decision then reads what the agents marked."""
    if run.opts.check_wait <= 0:
        return ""
    run.log(
        f"job {run.job_id}: srun exited {rc}; running the hardware checks on {','.join(run.names)}"
    )
    checked = srun_check.run(run.job_id, run.names, run.opts.check_wait, srun)
    run.log(f"job {run.job_id}: {checked.message}; deciding on what the agents marked")
    return checked.message


def _replace(run: Run, marker: Marker, decision: Decision, rc: int, details: dict) -> bool:
    """Mend the job in place; whether the step can run again (else it was logged why not)."""
    run.replaced = max(marker.replaced, run.replaced) + 1  # recorded first: Slurm refuses job
    run.record(replace(marker, replaced=run.replaced, nodes=decision.faulty))  # updates a while
    mended = srun_inplace.mend(run.client, run.alloc, decision.faulty, run.opts.replace_wait)
    if not mended.ok:  # after a merge
        run.log(f"job {run.job_id}: {mended.message}; exit {rc}", Severity.WARNING, **details)
        return False
    try:
        run.alloc = run.client.allocation(run.job_id)
    except SlurmError as exc:
        run.log(f"job {run.job_id}: cannot read the mended job: {exc}; exit {rc}", **details)
        return False
    run.names = list(mended.hosts)
    run.env = srun_inplace.fresh_env(run.env, mended.hosts, run.alloc.nodes)
    run.log(f"job {run.job_id}: {mended.message}; running the step again", **details)
    return True


def _requeue(run: Run, rc: int, details: dict[str, Any]) -> int:
    """``scontrol requeue`` the job (the marker is recorded); ends us, or returns ``rc``."""
    try:
        run.client.requeue(run.job_id)
    except SlurmError as exc:
        run.log(f"job {run.job_id}: requeue failed ({exc}); exit {rc}", Severity.WARNING, **details)
        return rc
    deadline = time.monotonic() + REQUEUE_WAIT_S
    while time.monotonic() < deadline:  # Slurm ends this job step (and us) any moment now
        time.sleep(0.5)
    run.log(
        f"job {run.job_id}: requeued but this process was not ended; exit {rc}", Severity.WARNING
    )
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
