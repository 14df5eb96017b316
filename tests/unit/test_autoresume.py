"""hma srun --auto-resume / hma job-env: argument parsing, the decision table, the marker, the
agent's hook. Slurm's answers are recorded outputs (tests/fixtures/slurm/autoresume) served by a
stand-in CommandRunner (the outermost boundary); the real cluster is in
tests/integration/test_autoresume_slurm.py."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import pytest

from hma import cli
from hma.adapters.command import CommandResult
from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import JOB_FIELDS, SEP, SlurmError, parse_sinfo
from hma.commands import srun as ar
from hma.commands import srun_decide as dec
from hma.contracts.cluster import Job, NodeState
from hma.contracts.model import Action
from hma.remediation.planner import recovery_action
from hma.remediation.requeue import (
    AutoResume,
    Marker,
    find_marker,
    parse_marker,
    with_marker,
)

pytestmark = pytest.mark.timeout(20)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "autoresume"
NOW = 1796058712.0  # when squeue-requeued.txt was recorded (its eligible_time is 2 min later)


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def nodes(name: str) -> dict[str, NodeState]:
    return {n.name: n for n in parse_sinfo(fixture(name))}


def only(name: str, *keep: str) -> str:
    """A recorded sinfo output cut to the nodes ``keep``."""
    return "".join(ln for ln in fixture(name).splitlines(True) if ln.split(SEP)[0] in keep)


def job(name: str, **changes: str) -> str:
    """A recorded squeue -O line with some fields changed (JOB_FIELDS names)."""
    parts = fixture(name).rstrip("\n").split(SEP)
    for key, value in changes.items():
        parts[JOB_FIELDS.index(key)] = value
    return SEP.join(parts) + "\n"


class Runner:
    """Serves recorded outputs by argv prefix; records every call."""

    def __init__(self, answers: dict[tuple[str, ...], Any]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def run(
        self,
        argv: Sequence[str],
        timeout: float,
        env: Optional[Any] = None,
        stdin: Optional[bytes] = None,
    ) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0] == "sinfo" and "Gres" in argv[-1]:  # the nodes' GRES: ("sinfo-gres",)
            return CommandResult(tuple(argv), 0, self.answers.get(("sinfo-gres",), ""), "", 0.0)
        for prefix in sorted(self.answers, key=len, reverse=True):
            if tuple(argv[: len(prefix)]) == prefix:
                answer = self.answers[prefix]
                if callable(answer):
                    answer = answer(list(argv))
                if isinstance(answer, tuple):
                    rc, out = answer
                    return CommandResult(tuple(argv), rc, "" if rc else out, out if rc else "", 0.0)
                return CommandResult(tuple(argv), 0, answer, "", 0.0)
        return CommandResult(tuple(argv), 0, "", "", 0.0)


def client(answers: dict[tuple[str, ...], Any]) -> tuple[SlurmClient, Runner]:
    runner = Runner(answers)
    return SlurmClient(runner=runner, timeout=5.0), runner  # type: ignore[arg-type]


# --- arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, attempts, grace, rest",
    [
        (["--auto-resume=1", "-N2", "python", "t.py"], 1, 60.0, ["-N2", "python", "t.py"]),
        (["--auto-resume", "3", "--grace", "5", "--nodes=2", "x"], 3, 5.0, ["--nodes=2", "x"]),
        (["--grace=0", "--auto-resume=2", "--", "--auto-resume=9"], 2, 0.0, ["--auto-resume=9"]),
        # srun's own options stop ours; a later --auto-resume is srun's (or the command's)
        (["-N2", "--auto-resume=1", "cmd"], None, 60.0, ["-N2", "--auto-resume=1", "cmd"]),
        (["-h"], None, 60.0, ["-h"]),
        (["cmd", "--grace", "3"], None, 60.0, ["cmd", "--grace", "3"]),
    ],
)
def test_parse_args(
    argv: list[str], attempts: Optional[int], grace: float, rest: list[str]
) -> None:
    opts = ar.parse_args(argv, env={})
    assert (opts.attempts, opts.grace, opts.srun_args) == (attempts, grace, rest)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--auto-resume=0", "cmd"], "not a positive integer"),
        (["--auto-resume=-1", "cmd"], "not a positive integer"),
        (["--auto-resume=1.5", "cmd"], "not a positive integer"),
        (["--auto-resume=abc", "cmd"], "not a positive integer"),
        (["--auto-resume"], "needs a value"),
        (["--auto-resume=1"], "no command given"),
        (["--grace=-3", "--auto-resume=1", "cmd"], "seconds >= 0"),
        # non-finite and non-ASCII numbers (issue 23)
        (["--grace=inf", "--auto-resume=1", "cmd"], "seconds >= 0"),
        (["--grace=nan", "--auto-resume=1", "cmd"], "seconds >= 0"),
        (["--grace=1e309", "--auto-resume=1", "cmd"], "seconds >= 0"),
        (["--grace=\u0663", "--auto-resume=1", "cmd"], "seconds >= 0"),
        (["--auto-resume=\u0663", "cmd"], "not a positive integer"),
        (["--auto-resume=1_0", "cmd"], "not a positive integer"),
    ],
)
def test_parse_args_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ar.UsageError, match=message):
        ar.parse_args(argv, env={})


def test_grace_default_from_environment() -> None:
    assert ar.parse_args(["--auto-resume=1", "x"], env={ar.GRACE_ENV: "7"}).grace == 7.0
    assert ar.parse_args(["--grace=2", "x"], env={ar.GRACE_ENV: "7"}).grace == 2.0


def test_cli_hands_srun_arguments_through_untouched() -> None:
    assert cli._srun_split(["srun", "-h", "--config", "x"]) == (None, ["-h", "--config", "x"])
    assert cli._srun_split(["--config", "c.toml", "srun", "-N2", "cmd"]) == (
        "c.toml",
        ["-N2", "cmd"],
    )
    assert cli._srun_split(["--config=c.toml", "srun"]) == ("c.toml", [])
    assert cli._srun_split(["check", "srun"]) is None


@pytest.mark.parametrize(
    "argv, err",
    [
        (["srun", "--auto-resume=0", "true"], "not a positive integer"),
        (["srun", "--auto-resume=1", "true"], "needs a Slurm allocation"),
    ],
)
def test_cli_errors(
    argv: list[str], err: str, monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    (tmp_path / "hma.toml").write_text("")
    assert cli.main(["--config", str(tmp_path / "hma.toml"), *argv]) == 2
    assert err in capsys.readouterr().err


# --- the decision table (recorded sinfo -O) ----------------------------------------------------


def test_fault_of_recorded_states() -> None:
    got = {name: dec.fault_of(n) for name, n in nodes("sinfo-faulty.txt").items()}
    assert "HMA: GPU_XID_79" in got["node1"]  # draining, hma's reason
    assert "held: breaker" in got["node2"]  # labelled unhealthy, still schedulable
    assert "Action:Replace" in got["node3"]  # HyperPod's reason
    assert got["node4"] == ""  # an admin's drain is not hardware
    assert all(not dec.fault_of(n) for n in nodes("sinfo-healthy.txt").values())


def test_decision_table() -> None:
    bad, ok = nodes("sinfo-faulty.txt"), nodes("sinfo-healthy.txt")
    job = [bad["node1"], ok["node3"]]
    d = dec.decide(1, job, attempt=0, attempts=1, waited=0.4)
    assert d.kind == "resume" and d.faulty == ("node1",)
    assert "attempt 1 of 1" in d.message
    d = dec.decide(1, job, attempt=1, attempts=1, waited=0.4)
    assert d.kind == "give_up" and "giving up: 1 of 1" in d.message
    d = dec.decide(1, [bad["node1"], bad["node3"]], attempt=1, attempts=3, waited=0)
    assert d.kind == "resume" and d.faulty == ("node1", "node3")
    d = dec.decide(3, [ok["node1"], ok["node2"]], attempt=0, attempts=1, waited=60)
    assert d.kind == "not_hardware" and "exited 3" in d.message
    d = dec.decide(3, [bad["node4"], ok["node1"]], attempt=0, attempts=1, waited=60)
    assert d.kind == "not_hardware"  # drained by an admin, not by the agent
    d = dec.decide(1, [bad["node1"], bad["node2"]], attempt=0, attempts=1, waited=0)
    assert d.kind == "unsafe" and "node2 is still schedulable" in d.message
    d = dec.decide(1, [], attempt=0, attempts=1, waited=60, error="sinfo timed out")
    assert d.kind == "unknown" and "sinfo timed out" in d.message


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def test_watch_waits_for_the_agents_then_stops_early() -> None:
    reads = iter(["sinfo-healthy.txt", "sinfo-healthy.txt", "sinfo-faulty.txt"])
    cl, runner = client({("sinfo",): lambda argv: fixture(next(reads))})
    clock = Clock()
    found, waited, error = dec.watch(cl, ["node1", "node3"], 60, 1.0, clock, clock.sleep)
    assert waited == 2.0 and not error  # the third read saw node1 drained: no need to wait on
    assert [n.name for n in found] == ["node1", "node3"]
    assert runner.calls[0][-2:] == ["-n", "node1,node3"]


def test_watch_gives_up_after_grace_and_survives_slurm_errors() -> None:
    cl, _runner = client({("sinfo",): (1, "Unable to contact slurm controller")})
    clock = Clock()
    found, waited, error = dec.watch(cl, ["node1"], 5, 1.0, clock, clock.sleep)
    assert found == [] and waited == 5.0 and "Unable to contact" in error


# --- main with a stand-in srun -------------------------------------------------------------------


def srun_exiting(code: int) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.exit({code})"]


def run_main(
    answers: dict[tuple[str, ...], Any], code: int, env: dict[str, str], argv: Sequence[str] = ()
) -> tuple[int, str, Runner]:
    cl, runner = client(answers)
    err = io.StringIO()
    log = ar.Log(None, err)
    old = sys.stderr
    sys.stderr = err
    env = {"HMA_AUTO_RESUME_CHECK_WAIT": "0", **env}  # the checks: test_srun_check.py
    try:
        rc = ar.main(
            list(argv) or ["--auto-resume=1", "--grace=0", "-N2", "train"],
            cl,
            log,
            env,
            srun_exiting(code),
        )
    finally:
        sys.stderr = old
    return rc, err.getvalue(), runner


PLAIN = fixture("squeue-alloc-plain-22.05.txt")


def squeue(job_text: str, alloc_text: str = PLAIN) -> Any:
    """squeue's answer: the allocation query (ALLOC_FIELDS) or the job query (JOB_FIELDS)."""
    return lambda argv: alloc_text if "tres-per-node" in argv[-1] else job_text


RUNNING = {
    ("squeue",): squeue(fixture("squeue-running.txt")),
    ("scontrol", "show", "hostnames"): "node1\nnode2\n",
}


def test_exit_zero_passes_through_without_looking() -> None:
    rc, err, runner = run_main(RUNNING, 0, {"SLURM_JOB_ID": "1"})
    assert rc == 0 and err == ""
    assert not any(c[0] == "sinfo" and "Gres" not in c[-1] for c in runner.calls)  # no states


def test_plain_failure_exits_with_sruns_code() -> None:
    rc, err, runner = run_main(
        {**RUNNING, ("sinfo",): fixture("sinfo-healthy.txt")}, 3, {"SLURM_JOB_ID": "1"}
    )
    assert rc == 3 and "not a hardware failure, not resumed; exit 3" in err
    assert not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)


def test_faulty_node_still_schedulable_is_not_requeued_onto() -> None:
    rc, err, runner = run_main(
        {**RUNNING, ("sinfo",): fixture("sinfo-faulty.txt")}, 1, {"SLURM_JOB_ID": "1"}
    )
    assert rc == 1 and "hardware fault on node1" in err and "node2 is still schedulable" in err
    assert ["scontrol", "requeue", "1"] not in runner.calls


def test_requeue_when_every_faulty_node_is_out_of_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ar, "REQUEUE_WAIT_S", 0.0)
    answers = {
        **RUNNING,
        ("scontrol", "show", "hostnames"): "node1\nnode3\n",
        ("sinfo",): only("sinfo-faulty.txt", "node1", "node3"),
    }
    rc, err, runner = run_main(answers, 1, {"SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "0"})
    requeue = runner.calls.index(["scontrol", "requeue", "1"])
    comments = [c for c in runner.calls if c[:3] == ["scontrol", "update", "JobId=1"]]
    assert comments[-1][-1] == "Comment=my run hma-resume=1,a=1,n=node1+node3"
    assert runner.calls.index(comments[-1]) < requeue  # recorded before the requeue ends us
    assert "resuming (attempt 1 of 1)" in err
    assert "the faulty node node1 runs the batch script, which Slurm cannot move: requeueing" in err
    assert "not ended" in err and rc == 1


def test_attempts_used_up(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {**RUNNING, ("sinfo",): only("sinfo-faulty.txt", "node1")}
    rc, err, runner = run_main(answers, 1, {"SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "1"})
    assert rc == 1 and "giving up: 1 of 1 auto-resume attempt(s) used" in err
    assert ["scontrol", "requeue", "1"] not in runner.calls


def test_job_that_cannot_be_resumed_runs_once_with_a_warning() -> None:
    no_requeue = job("squeue-running.txt", Requeue="0")
    rc, err, _ = run_main({**RUNNING, ("squeue",): squeue(no_requeue)}, 0, {"SLURM_JOB_ID": "1"})
    assert rc == 0 and "auto-resume cannot resume this job" in err and "--no-requeue" in err
    salloc = job("squeue-running.txt", BatchFlag="0")
    rc, err, _ = run_main({**RUNNING, ("squeue",): squeue(salloc)}, 0, {"SLURM_JOB_ID": "1"})
    assert rc == 0 and "an interactive allocation (salloc) cannot be requeued" in err


def test_marks_the_job_at_start_keeping_the_users_comment() -> None:
    answers = {**RUNNING, ("squeue",): squeue(job("squeue-running.txt", Comment="my run"))}
    _rc, _err, runner = run_main(answers, 0, {"SLURM_JOB_ID": "1"}, ["--auto-resume=2", "t"])
    assert ["scontrol", "update", "JobId=1", "Comment=my run hma-resume=2,a=0"] in runner.calls


def test_without_auto_resume_it_is_plain_srun() -> None:
    rc, err, runner = run_main({}, 5, {}, ["-N2", "cmd"])
    assert rc == 5 and runner.calls == [] and err == ""


def test_log_goes_to_the_journal_reporter_too() -> None:
    from hma.reporters.journal import JournalReporter, decode

    sent: list[bytes] = []

    class Captured(JournalReporter):
        def _send(self, datagram: bytes) -> Optional[str]:
            sent.append(datagram)
            return None

    err = io.StringIO()
    ar.Log(Captured({}), err)("job 6: requeueing", job="6", decision="requeue")
    entry = decode(sent[0])
    assert entry["MESSAGE"] == "hma srun: job 6: requeueing"
    assert json.loads(entry["HMA_DETAILS"]) == {"job": "6", "decision": "requeue"}
    assert err.getvalue() == "hma srun: job 6: requeueing\n"


# --- the marker and the agent's hook -----------------------------------------------------------


def test_marker_round_trip_and_users_comment_kept() -> None:
    m = Marker(2, 1, ("node1", "node3"))
    assert parse_marker(m.token()) == m
    assert with_marker("", m) == "hma-resume=2,a=1,n=node1+node3"
    text = with_marker("run 7  (lr=3e-4)", Marker(2))
    assert text == "run 7  (lr=3e-4) hma-resume=2,a=0"
    assert with_marker(text, m) == "run 7  (lr=3e-4) hma-resume=2,a=1,n=node1+node3"
    assert find_marker(with_marker(text, m)) == m
    assert find_marker("hma-resume=0,a=1") is None and find_marker("hma-resume=x") is None
    assert find_marker("no marker") is None


def test_recovery_action() -> None:
    assert recovery_action(Action.REBOOT, True) is Action.REPLACE
    assert recovery_action(Action.REBOOT, False) is Action.REBOOT
    assert recovery_action(Action.NONE, True) is Action.NONE
    assert recovery_action(Action.REPLACE, True) is Action.REPLACE


def test_agent_hook_remembers_marked_jobs_and_hurries_their_requeue() -> None:
    cl, runner = client({("squeue",): fixture("squeue-requeued.txt")})
    hook = AutoResume(clock=lambda: NOW)
    hook.observe(cl, [Job("1", "root", "RUNNING", "my run hma-resume=1,a=0"), Job("8", "u")])
    assert runner.calls == []  # nothing left the node: no Slurm call
    assert hook.remembered() == {"1"}  # a fault that hits job 1 gets replace, not reboot
    hook.observe(cl, [])  # job 1 left the node: hma srun requeued it
    assert runner.calls[0][:4] == ["squeue", "-h", "-j", "1"]  # a single-job query
    assert ["scontrol", "update", "JobId=1", "StartTime=now"] in runner.calls
    assert hook.hurried == ["1"]
    assert hook.remembered() == {"1"}  # still, for the open fault
    hook.observe(cl, [])
    assert runner.calls.count(["scontrol", "update", "JobId=1", "StartTime=now"]) == 1


def test_agent_hook_leaves_other_requeues_alone() -> None:
    requeued = job("squeue-requeued.txt", Comment="my run hma-resume=1,a=0")  # not by hma srun
    cl, runner = client({("squeue",): requeued})
    hook = AutoResume(clock=lambda: NOW)
    hook.observe(cl, [Job("1", "root", "RUNNING", "hma-resume=1,a=0")])
    hook.observe(cl, [])
    assert not any(c[:2] == ["scontrol", "update"] for c in runner.calls)
    gone = AutoResume(clock=lambda: NOW)
    cl2, runner2 = client({("squeue",): (1, "slurm_load_jobs error: Invalid job id specified")})
    gone.observe(cl2, [Job("1", "u", "RUNNING", "hma-resume=1,a=0")])
    gone.observe(cl2, [])  # finished: forgotten, not asked about again
    gone.observe(cl2, [])
    assert sum(1 for c in runner2.calls if c[0] == "squeue") == 1


def test_jobs_come_from_the_step_sockets_and_one_query_per_new_step(tmp_path: Path) -> None:
    spool = tmp_path / "spool" / "node1"
    spool.mkdir(parents=True)
    for name in ("node1_1.4294967291", "node1_1.0", "node2_5.0", "cred_state", "job00001"):
        (spool / name).touch()  # slurmstepd's sockets are named <node>_<job>.<step>
    cl, runner = client({("squeue",): fixture("squeue-running.txt")})
    cl.spool_dir = str(tmp_path / "spool" / "%n")
    assert cl.jobs("node1") == [Job("1", "root", "RUNNING", "my run hma-resume=1,a=0")]
    assert [c[:4] for c in runner.calls] == [["squeue", "-h", "-j", "1"]]  # one single-job query
    cl.jobs("node1")  # the same job and steps: no query at all
    assert len(runner.calls) == 1
    (spool / "node1_1.1").touch()  # a new step (hma srun started srun): asked again
    cl.jobs("node1")
    assert len(runner.calls) == 2
    (spool / "node1_9.0").touch()  # a socket left over by a job Slurm has forgotten
    runner.answers[("squeue",)] = (1, "slurm_load_jobs error: Invalid job id specified")
    assert [j.id for j in cl.jobs("node1")] == ["1"]
    cl.jobs("node1")
    assert len(runner.calls) == 3  # asked about job 9 once


def test_jobs_from_listpids_where_the_spool_cannot_be_read() -> None:
    answers = {
        ("scontrol", "show", "config"): "SlurmdSpoolDir          = /nonexistent/%n\n",
        ("scontrol", "listpids"): fixture("listpids-node1.txt"),
        ("squeue",): fixture("squeue-running.txt"),
    }
    cl, runner = client(answers)
    assert cl.jobs("node1") == [Job("1", "root", "RUNNING", "my run hma-resume=1,a=0")]
    assert runner.calls[0] == ["scontrol", "show", "config"] and cl.spool_dir == "/nonexistent/%n"
    assert runner.calls[1] == ["scontrol", "listpids", "*", "node1"]
    cl.jobs("node1")
    assert [c[0] for c in runner.calls] == ["scontrol", "scontrol", "squeue", "scontrol"]
    runner.answers[("scontrol", "listpids")] = (1, "No job steps exist on this node.")
    assert cl.jobs("node1") == []
    runner.answers[("scontrol", "listpids")] = (1, "slurm_pid2jobid: Connection refused")
    with pytest.raises(SlurmError, match="Connection refused"):
        cl.jobs("node1")


# --- hma job-env ----------------------------------------------------------------------------------


def test_job_env_values_and_shell_output() -> None:
    answers = {
        ("squeue",): fixture("squeue-running.txt"),
        ("scontrol", "show", "hostnames"): "node1\nnode2\n",
        ("sinfo",): fixture("sinfo-healthy.txt"),
    }
    cl, runner = client(answers)
    values = ar.job_env(cl, {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "node2"})
    assert values == {
        "JOB_ID": "1",
        "NODE_LIST": ["node1", "node2"],
        "MASTER_NODE": "node1",
        "MASTER_ADDR": "127.0.0.1",
        "NNODES": 2,
        "NODE_RANK": 1,
    }
    assert ["scontrol", "show", "hostnames", "node[1-2]"] in runner.calls  # fresh, not the env
    if shutil.which("sh"):
        script = ar.render_env(values, "sh") + '\necho "$NODE_RANK|$NNODES|$NODE_LIST|$MASTER_ADDR"'
        out = subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, timeout=5, check=False
        )
        assert out.stdout.strip() == "1|2|node1 node2|127.0.0.1"
    assert json.loads(ar.render_env(values, "json")) == values


def test_job_env_outside_a_job() -> None:
    cl, _ = client({})
    with pytest.raises(ar.UsageError, match="not inside a Slurm job"):
        ar.job_env(cl, {})


def test_watch_never_reads_the_whole_cluster() -> None:
    cl, runner = client({("sinfo",): fixture("sinfo-faulty.txt")})
    assert dec.watch(cl, [], 5) == ([], 0.0, "the job has no nodes")
    assert runner.calls == []


def test_job_infos_are_single_job_queries() -> None:
    cl, runner = client({("squeue",): fixture("squeue-running.txt")})
    assert [j.id for j in cl.job_infos(["99"])] == []  # squeue answered another job: not it
    assert cl.job_info("1").note == "my run hma-resume=1,a=0"
    assert cl.job_info("1").nodes == "node[1-2]" and cl.job_info("1").restarts == 0
    assert all(c[:4] == ["squeue", "-h", "-j", c[3]] for c in runner.calls)


# --- in place: the allocation, the mechanism, the mend -------------------------------------------


def test_allocation_reader_on_both_versions() -> None:
    from hma.cluster.slurm.parse import parse_alloc

    for version in ("22.05", "24.11"):
        (plain,) = parse_alloc(fixture(f"squeue-alloc-plain-{version}.txt"))
        assert (plain.id, plain.partition, plain.features, plain.gres) == ("1", "batch", "", "")
        assert (plain.nodes, plain.num_nodes) == ("node[1-2]", 2)
        (gres,) = parse_alloc(fixture(f"squeue-alloc-gres-{version}.txt"))
        assert gres.gres in ("gres:fpga:1", "gres/fpga:1") and gres.nodes == "node3"
    with pytest.raises(SlurmError):
        parse_alloc(fixture("squeue-alloc-plain-22.05.txt").replace("\x1f2\x1f", "\x1fx\x1f"))


def test_mechanism_table() -> None:
    from hma.cluster.slurm.parse import parse_alloc
    from hma.contracts.cluster import JobInfo

    plain = parse_alloc(PLAIN)[0]
    gres = parse_alloc(fixture("squeue-alloc-gres-22.05.txt"))[0]
    batch, salloc = JobInfo("1", "u", "RUNNING"), JobInfo("1", "u", "RUNNING", batch=False)
    assert dec.mechanism(batch, plain.gres, True)[0] == "replace"
    assert dec.mechanism(salloc, plain.gres, None)[0] == "replace"  # unknown: salloc says
    how, why = dec.mechanism(batch, gres.gres, True)
    assert how == "requeue" and "cannot resize a GRES allocation" in why
    how, why = dec.mechanism(salloc, gres.gres, True)
    assert how == "none" and "salloc) cannot be requeued: not resumed" in why
    how, why = dec.mechanism(batch, plain.gres, False)
    assert how == "requeue" and "lacks permit_job_expansion" in why
    assert dec.mechanism(salloc, plain.gres, False)[0] == "none"
    assert plain.batch_host == "node1"
    how, why = dec.mechanism(batch, plain.gres, True, "node1")
    assert how == "requeue" and "node1 runs the batch script, which Slurm cannot move" in why
    assert dec.mechanism(salloc, plain.gres, True, "node1")[0] == "replace"  # no batch script


def test_an_exclusive_job_on_gres_nodes_holds_their_gres() -> None:
    from hma.cluster.slurm.parse import gres_format, parse_alloc

    plain = parse_alloc(PLAIN)[0]
    rows = f"node1{SEP}fpga:1{SEP}\nnode2{SEP}(null){SEP}\n"
    assert gres_format("").count(SEP) == 2
    cl, runner = client({("sinfo-gres",): rows})
    assert dec.job_gres(cl, plain, ["node1", "node2"]) == "node1: fpga:1"
    assert runner.calls[0][:5] == ["sinfo", "-h", "-N", "-n", "node1,node2"]
    down = client({("sinfo-gres",): "unreadable"})[0]
    assert dec.job_gres(down, plain, ["node1"]) == ""


def test_expansion_allowed_reads_scheduler_parameters() -> None:
    on = "SchedulerParameters     = bf_max_job_test=10,permit_job_expansion\n"
    assert dec.expansion_allowed(client({("scontrol", "show", "config"): on})[0]) is True
    off = "SchedulerParameters     = (null)\n"
    assert dec.expansion_allowed(client({("scontrol", "show", "config"): off})[0]) is False
    down = client({("scontrol", "show", "config"): (1, "Unable to contact slurm controller")})[0]
    assert dec.expansion_allowed(down) is None


def test_marker_counts_in_place_resumes() -> None:
    marker = Marker(2, 0, ("node1",), replaced=1)
    assert marker.token() == "hma-resume=2,a=0,n=node1,r=1"
    assert parse_marker(marker.token()) == marker
    assert parse_marker("hma-resume=2,a=0,r=-1") is None


class InPlace:
    """A salloc job on node1+node2 whose node1 the agent drained; node4 is free. The allocation
    Slurm reports follows the shrink and the merge."""

    def __init__(self, salloc: Any = (0, "salloc: Granted job allocation 7"), **job: str) -> None:
        self.nodes = "node[1-2]"
        self.comment = "hma-resume=1,a=0"
        self.job = {"BatchFlag": "0", **job}
        self.salloc = salloc
        self.alloc = PLAIN

    def squeue(self, argv: list[str]) -> str:
        if "tres-per-node" in argv[-1]:
            return self.alloc.replace("node[1-2]", self.nodes)
        return job("squeue-running.txt", NodeList=self.nodes, Comment=self.comment, **self.job)

    def scontrol(self, argv: list[str]) -> str:
        fields = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
        if fields.get("JobId") == "1" and "NodeList" in fields:
            self.nodes = fields["NodeList"]
        if fields.get("JobId") == "7" and fields.get("NumNodes") == "0":
            self.nodes = "node[2,4]"
        if "Comment" in fields:
            self.comment = fields["Comment"]
        return ""

    def hostnames(self, argv: list[str]) -> str:
        return {"node[1-2]": "node1\nnode2", "node[2,4]": "node2\nnode4"}.get(argv[-1], argv[-1])

    def answers(self) -> dict[tuple[str, ...], Any]:
        return {
            ("squeue",): self.squeue,
            ("scontrol", "update"): self.scontrol,
            ("scontrol", "show", "hostnames"): self.hostnames,
            ("scontrol", "show", "config"): "SchedulerParameters     = permit_job_expansion\n",
            ("sinfo",): only("sinfo-faulty.txt", "node1")
            + only("sinfo-healthy.txt", "node2")
            + only("sinfo-faulty.txt", "node1").replace("node1", "node4", 1),
            ("salloc",): self.salloc,
        }


def srun_failing(times: int, folder: Path) -> list[str]:
    """An srun stand-in that fails ``times`` times, then succeeds; it records its node list."""
    code = (
        "import os, sys; p = sys.argv[1]; n = len(os.listdir(p)); "
        "open(os.path.join(p, str(n)), 'w').write(os.environ.get('SLURM_JOB_NODELIST', '')); "
        f"sys.exit(1 if n < {times} else 0)"
    )
    return [sys.executable, "-c", code, str(folder)]


def run_inplace(
    state: InPlace, tmp_path: Path, fails: int, argv: Sequence[str] = ()
) -> tuple[int, str, Runner, list[str]]:
    cl, runner = client(state.answers())
    err = io.StringIO()
    old = sys.stderr
    sys.stderr = err
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node[1-2]", "PATH": "/usr/bin:/bin"}
    env["HMA_AUTO_RESUME_CHECK_WAIT"] = "0"  # the checks: test_srun_check.py
    try:
        rc = ar.main(
            list(argv) or ["--auto-resume=1", "--grace=0", "--replace-wait=5", "-N2", "train"],
            cl,
            ar.Log(None, err),
            env,
            srun_failing(fails, tmp_path),
        )
    finally:
        sys.stderr = old
    lists = [(tmp_path / str(i)).read_text() for i in range(len(list(tmp_path.iterdir())))]
    return rc, err.getvalue(), runner, lists


def test_salloc_job_is_mended_in_place_and_the_step_runs_again(tmp_path: Path) -> None:
    state = InPlace()
    rc, err, runner, lists = run_inplace(state, tmp_path, 1)
    assert rc == 0 and lists == ["node[1-2]", "node[2,4]"]  # the second srun saw the new list
    shrink = runner.calls.index(["scontrol", "update", "JobId=1", "NodeList=node2"])
    (salloc,) = [c for c in runner.calls if c[0] == "salloc"]
    assert salloc[:5] == ["salloc", "-N1", "--exclusive", "--dependency=expand:1", "--no-shell"]
    assert "--immediate=5" in salloc and "--partition=batch" in salloc
    merge = runner.calls.index(["scontrol", "update", "JobId=7", "NumNodes=0"])
    assert shrink < runner.calls.index(salloc) < merge
    assert ["scontrol", "requeue", "1"] not in runner.calls
    assert state.comment == "hma-resume=1,a=0,n=node1,r=1"
    assert "resuming (attempt 1 of 1); the job holds no GRES: replacing" in err
    assert "dropped node1, merged node4 (allocation 7); the job runs on node2,node4" in err


def test_in_place_attempts_are_counted(tmp_path: Path) -> None:
    rc, err, runner, lists = run_inplace(InPlace(), tmp_path, 5)
    assert rc == 1 and len(lists) == 2
    assert "giving up: 1 of 1 auto-resume attempt(s) used" in err
    assert len([c for c in runner.calls if c[0] == "salloc"]) == 1


def test_no_replacement_in_time(tmp_path: Path) -> None:
    timed_out = (1, "salloc: error: Unable to allocate resources: Connection timed out")
    rc, err, _runner, lists = run_inplace(InPlace(salloc=timed_out), tmp_path, 1)
    assert rc == 1 and len(lists) == 1
    assert "no replacement for node1 within 5 s or the cluster refused the expansion" in err
    assert "Connection timed out" in err and "the job keeps 1 node(s) (node2); exit 1" in err


def test_gres_batch_job_is_requeued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ar, "REQUEUE_WAIT_S", 0.0)
    state = InPlace(BatchFlag="1")
    state.alloc = PLAIN.replace(f"{SEP}N/A", f"{SEP}gres/fpga:1", 1)
    rc, err, runner, _lists = run_inplace(state, tmp_path, 1)
    assert ["scontrol", "requeue", "1"] in runner.calls and rc == 1
    assert "holds GRES (gres/fpga:1) and Slurm cannot resize a GRES allocation" in err
    assert not any(c[0] == "salloc" for c in runner.calls)
    assert state.comment == "hma-resume=1,a=1,n=node1"


def test_gres_salloc_job_is_not_resumed(tmp_path: Path) -> None:
    state = InPlace()
    state.alloc = PLAIN.replace(f"{SEP}N/A", f"{SEP}gres/fpga:1", 1)
    rc, err, runner, _lists = run_inplace(state, tmp_path, 1)
    assert rc == 1 and "an interactive allocation (salloc) cannot be requeued: not resumed" in err
    assert not any(c[0] == "salloc" or c[:2] == ["scontrol", "requeue"] for c in runner.calls)


def test_replace_wait_option_and_environment() -> None:
    opts = ar.parse_args(["--replace-wait", "30", "--auto-resume=1", "x"], {})
    assert opts.replace_wait == 30.0 and opts.srun_args == ["x"]
    assert ar.parse_args(["x"], {"HMA_AUTO_RESUME_REPLACE_WAIT": "7"}).replace_wait == 7.0
    with pytest.raises(ar.UsageError, match="--replace-wait"):
        ar.parse_args(["--replace-wait=-1", "x"], {})
