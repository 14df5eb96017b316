"""status.json: atomic write, reading and judging it, the summary, `hma status`."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hma import cli
from hma.commands import status
from hma.reporters import statusfile

pytestmark = pytest.mark.timeout(30)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "status"
BOOT = "6f1c2c8d3e9a4b7f8a1d2e3f4a5b6c7d"


def sample() -> dict:
    return json.loads((FIXTURES / "sample.json").read_text("utf-8"))


def live(doc: dict) -> dict:
    """The sample as if this test process were a healthy daemon writing it now."""
    doc = copy.deepcopy(doc)
    doc.update(pid=os.getpid(), boot_id=statusfile.current_boot_id() or BOOT, generated=time.time())
    return doc


@pytest.fixture()
def utc(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    return proc.pid


def test_write_atomic_round_trips(tmp_path: Path) -> None:
    doc = live(sample())
    path = statusfile.status_path(tmp_path)
    statusfile.write_atomic(path, doc)
    statusfile.write_atomic(path, doc)  # replaces
    assert json.loads(path.read_text()) == doc
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["status.json"]
    assert statusfile.read(tmp_path) == (doc, "")


def test_write_atomic_failure_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        statusfile.write_atomic(tmp_path / "status.json", {"bad": object()})
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        statusfile.write_atomic(tmp_path / "missing" / "status.json", {})


@pytest.mark.parametrize("number", [float("inf"), float("nan")])
def test_write_atomic_never_writes_non_json_numbers(tmp_path: Path, number: float) -> None:
    path = statusfile.status_path(tmp_path)
    statusfile.write_atomic(path, {"interval": 1.0})
    with pytest.raises(ValueError):
        statusfile.write_atomic(path, {"interval": number})
    assert json.loads(path.read_text()) == {"interval": 1.0}  # the previous document stays
    assert os.listdir(tmp_path) == ["status.json"]


def test_no_file_means_no_daemon(tmp_path: Path) -> None:
    doc, problem = statusfile.read(tmp_path)
    assert doc is None
    assert problem.startswith("no daemon:") and "status.json does not exist" in problem
    assert status.exit_code(doc, problem) == 3


@pytest.mark.parametrize(
    ("text", "expect"),
    [("{not json", "cannot parse"), ("[1]", "not a JSON object"), ('{"schema": 2}', "schema 2")],
)
def test_unusable_file(tmp_path: Path, text: str, expect: str) -> None:
    (tmp_path / "status.json").write_text(text)
    doc, problem = statusfile.read(tmp_path)
    assert doc is None and expect in problem and status.exit_code(doc, problem) == 3


def test_dead_pid_means_no_daemon(tmp_path: Path) -> None:
    doc = live(sample())
    doc["pid"] = dead_pid()
    statusfile.write_atomic(statusfile.status_path(tmp_path), doc)
    got, problem = statusfile.read(tmp_path)
    assert got == doc
    assert f"the hma daemon (pid {doc['pid']}) is not running" in problem
    assert status.exit_code(got, problem) == 3


def test_earlier_boot_means_no_daemon(tmp_path: Path) -> None:
    statusfile.write_atomic(statusfile.status_path(tmp_path), live(sample()))
    _doc, problem = statusfile.read(tmp_path, boot_id="00000000-0000-0000-0000-000000000000")
    assert "from an earlier boot" in problem


def test_stale_file(tmp_path: Path) -> None:
    doc = live(sample())
    statusfile.write_atomic(statusfile.status_path(tmp_path), doc)
    fresh = doc["generated"] + 3 * doc["heartbeat_s"] - 1
    assert statusfile.read(tmp_path, now=fresh)[1] == ""
    got, problem = statusfile.read(tmp_path, now=doc["generated"] + 3 * doc["heartbeat_s"] + 1)
    assert problem.startswith("stale:") and "every 15 s" in problem
    assert status.exit_code(got, problem) == 3


def _doc(severity: str, faults=(), probes=()) -> dict:
    return {"severity": severity, "faults": list(faults), "probes": list(probes)}


@pytest.mark.parametrize(
    ("doc", "code"),
    [
        (_doc("ok"), 0),
        (_doc("warning"), 1),
        (_doc("critical"), 2),
        (_doc("unknown"), 3),
        (_doc("ok", [{"severity": "warning"}, {"severity": "unknown"}]), 3),
        (_doc("ok", [{"severity": "unknown"}, {"severity": "critical"}]), 2),
        (_doc("ok", [{"severity": "critical", "active": False}]), 0),  # pending only
        (_doc("warning", probes=[{"status": "timed_out"}]), 3),
        (_doc("critical", probes=[{"status": "failed"}]), 2),
        (_doc("ok", probes=[{"status": "unsupported"}, {"status": "disabled"}]), 0),
        (_doc("bogus"), 3),
    ],
)
def test_exit_code_precedence(doc: dict, code: int) -> None:
    assert status.exit_code(doc) == code


def test_render_golden(utc) -> None:
    doc = sample()
    text = status.render(doc, now=doc["generated"] + 2.0)
    golden = FIXTURES / "sample.txt"
    if os.environ.get("HMA_UPDATE_GOLDEN") == "1":
        golden.write_text(text, "utf-8")
    assert text == golden.read_text("utf-8")


def test_render_healthy_and_problem(utc) -> None:
    doc = {
        "schema": 1,
        "node": "n2",
        "pid": 1,
        "generated": 1000.0,
        "severity": "ok",
        "probes": [],
        "faults": [],
        "remediation": {},
    }
    text = status.render(doc, "stale: old", now=1100.0)
    assert text.splitlines()[:2] == [
        "hma status: stale: old",
        "Last known status (may be out of date):",
    ]
    assert "n2: OK" in text and "Active faults: none" in text
    assert "Remediation: not running" in text
    assert status.render(None, "no daemon: x") == "hma status: no daemon: x"


def test_render_neutralises_control_characters() -> None:
    doc = sample()
    doc["faults"][0]["details"] = {"line": "evil\x1b[2J\x07 text"}
    text = status.render(doc, now=doc["generated"])
    assert "\x1b" not in text and "\x07" not in text and "evil\\x1b[2J\\x07 text" in text


def _config(tmp_path: Path, run_dir: Path) -> str:
    cfg = tmp_path / "hma.toml"
    cfg.write_text(f'[agent]\nrun_dir = "{run_dir}"\n')
    return str(cfg)


def test_cli_status_summary_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    run.mkdir()
    doc = live(sample())
    statusfile.write_atomic(statusfile.status_path(run), doc)
    cfg = _config(tmp_path, run)
    assert cli.main(["--config", cfg, "status"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("node1: CRITICAL, recommended action reboot\n")
    assert "HELD: circuit breaker open" in out
    assert cli.main(["status", "--json", "--config", cfg]) == 2
    assert json.loads(capsys.readouterr().out) == doc


def test_cli_status_without_daemon(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = _config(tmp_path, tmp_path / "nothing")
    assert cli.main(["--config", cfg, "status"]) == 3
    assert capsys.readouterr().out.startswith("hma status: no daemon:")
    assert cli.main(["--config", cfg, "status", "--json"]) == 3
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # a JSON consumer gets a document saying what is missing
    assert doc["severity"] == "unknown" and doc["problem"].startswith("no daemon:")
    assert "no daemon" in captured.err


def test_cli_status_json_of_a_stale_file_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    doc = {**live(sample()), "pid": 2**22 + 1}  # no such process: the daemon is gone
    (run / "status.json").write_text(json.dumps(doc))
    assert cli.main(["status", "--json", "--config", _config(tmp_path, run)]) == 3
    got = json.loads(capsys.readouterr().out)
    assert got["node"] == doc["node"] and got["problem"].startswith("no daemon:")


def test_run_dir_of_ignores_the_rest_of_a_broken_config(tmp_path: Path) -> None:
    cfg = tmp_path / "hma.toml"
    cfg.write_text('[agent]\nrun_dir = "/x/run"\n[probes.nope]\nbogus = 1\n')
    assert status.run_dir_of(str(cfg)) == ("/x/run", [])
    cfg.write_text('[agent]\nrun_dir = "relative"\n')
    run_dir, problems = status.run_dir_of(str(cfg))
    assert run_dir == "/run/hma" and "absolute" in problems[0]


def test_boot_id_comes_from_the_configured_procfs(tmp_path: Path) -> None:
    cfg = tmp_path / "hma.toml"
    cfg.write_text("")
    assert status.boot_id_of(str(cfg)) is None  # default /proc: read() looks there itself
    procfs = tmp_path / "proc"
    cfg.write_text(f'[paths]\nprocfs = "{procfs}"\n')
    assert status.boot_id_of(str(cfg)) == ""  # unreadable there: no boot check
    (procfs / "sys/kernel/random").mkdir(parents=True)
    (procfs / "sys/kernel/random/boot_id").write_text("11111111-2222-3333-4444-555555555555\n")
    assert status.boot_id_of(str(cfg)) == "11111111-2222-3333-4444-555555555555"
    doc = live(sample())
    doc["boot_id"] = "11111111-2222-3333-4444-555555555555"
    statusfile.write_atomic(statusfile.status_path(tmp_path), doc)
    assert statusfile.read(tmp_path, boot_id=status.boot_id_of(str(cfg)))[1] == ""
    (procfs / "sys/kernel/random/boot_id").write_text("99999999-2222-3333-4444-555555555555\n")
    _doc, problem = statusfile.read(tmp_path, boot_id=status.boot_id_of(str(cfg)))
    assert "from an earlier boot" in problem


def test_done_action_shows_its_result_not_an_error() -> None:
    doc = live(sample())
    doc["remediation"] = {
        "policy": "automatic",
        "state": "drained",
        "actions": [
            {"id": 1, "kind": "reboot", "state": "done", "attempts": 1,
             "last_error": "reboot via scontrol"},
            {"id": 2, "kind": "resume", "state": "pending", "attempts": 2,
             "last_error": "slurmctld unreachable"},
        ],
    }  # fmt: skip
    text = status.render(doc, "")
    assert "      result: reboot via scontrol" in text
    assert "      last error: slurmctld unreachable" in text
    assert "last error: reboot via scontrol" not in text


def test_failed_action_says_when_it_is_tried_again() -> None:
    doc = live(sample())
    now = time.time()
    doc["remediation"] = {
        "policy": "automatic",
        "actions": [
            {"id": 1, "kind": "drain", "state": "failed", "attempts": 3, "next_try": now + 30,
             "last_error": "Unable to contact slurm controller (connect failure)"},
        ],
    }  # fmt: skip
    text = status.render(doc, "")
    assert "#1 drain failed, 3 attempts" in text and ", next try " in text and "(in " in text
    assert "      last error: Unable to contact slurm controller" in text


def test_writer_writes_changes_and_heartbeats_only(tmp_path: Path) -> None:
    path = statusfile.status_path(tmp_path)
    writer = statusfile.StatusWriter(path, heartbeat_s=15.0, min_interval_s=0.25)
    doc = live(sample())
    assert writer.offer(doc, mono=100.0)
    assert not writer.offer({**doc, "generated": doc["generated"] + 1}, mono=101.0)  # unchanged
    assert not writer.pending
    assert writer.offer({**doc, "generated": doc["generated"] + 15}, mono=115.0)  # heartbeat
    changed = {**doc, "severity": "ok"}
    assert writer.offer(changed, mono=116.0)  # a change is written at once...
    assert json.loads(path.read_text())["severity"] == "ok"
    assert not writer.offer({**doc, "severity": "warning"}, mono=116.1)  # ...but not too often
    assert writer.pending and writer.wait(116.1) == pytest.approx(0.15)
    assert writer.offer({**doc, "severity": "warning"}, mono=116.3)
    assert not writer.pending and writer.wait(116.3) == float("inf")
    assert json.loads(path.read_text())["severity"] == "warning" and writer.writes == 4


def test_status_size_is_bounded_whatever_the_findings(tmp_path: Path) -> None:
    doc = live(sample())
    fault = doc["faults"][0]
    doc["faults"] = [
        {**fault, "component": f"c{i}", "details": {"blob": "x" * 50_000}} for i in range(5000)
    ]
    doc["probes"][0]["summary"] = {"matrix": {f"a{i}": "ok" * 1000 for i in range(100)}}
    path = statusfile.status_path(tmp_path)
    assert statusfile.StatusWriter(path, heartbeat_s=15.0).offer(doc, mono=0.0)
    size = path.stat().st_size
    assert (
        size < statusfile.MAX_FAULTS * (statusfile.MAX_DETAILS + 2000) + statusfile.MAX_SUMMARY * 2
    )
    written, problem = statusfile.read(tmp_path)
    assert problem == "" and written is not None
    assert written["faults_omitted"] == 5000 - statusfile.MAX_FAULTS
    assert written["faults"][0]["details"]["truncated"] is True
    assert written["faults"][0]["details"]["keys"] == ["blob"]
    assert written["probes"][0]["summary"]["truncated"] is True
    assert f"and {5000 - statusfile.MAX_FAULTS} more" in status.render(written)


# --- without a daemon: the last health check's document (issue 32) ----------------------------


def checked(age: float, interval: float = 300.0) -> dict:
    """The sample as a health check run wrote it ``age`` seconds ago (its process has exited)."""
    doc = live(sample())
    doc.update(writer="healthcheck", pid=dead_pid(), heartbeat_s=interval, sources=[])
    doc["generated"] = time.time() - age
    doc["started"] = doc["generated"] - 1.5
    return doc


def test_the_last_health_check_is_shown_with_its_age_and_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Health check only (docs/slurm.md): no daemon, but slurmd's last run decided; `hma status`
    shows it, says plainly that no daemon runs, and exits by its verdict."""
    run = tmp_path / "run"
    run.mkdir()
    doc = checked(age=130.0)
    statusfile.write_atomic(statusfile.status_path(run), doc)
    cfg = _config(tmp_path, run)
    assert cli.main(["--config", cfg, "status"]) == 2
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "hma status: no daemon; last health check 2 min ago"
    assert "node1: CRITICAL, recommended action reboot" in out
    assert f"health check pid {doc['pid']}, ran " in out and "took 1.5 s" in out
    assert "GPU_XID_79 on gpu:0000:3b:00" in out and "HELD: circuit breaker open" in out
    assert "Event sources: not followed without the daemon" in out
    assert cli.main(["--config", cfg, "status", "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out) == doc and captured.err == ""


def test_a_health_check_document_goes_stale_after_three_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    statusfile.write_atomic(statusfile.status_path(run), checked(age=3 * 60.0 + 5, interval=60.0))
    cfg = _config(tmp_path, run)
    assert cli.main(["--config", cfg, "status"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("hma status: stale: no daemon, and the last health check wrote ")
    assert "every 60 s ([healthcheck] interval)" in out
    assert "Last known status (may be out of date):" in out and "node1: CRITICAL" in out
    assert cli.main(["--config", cfg, "status", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["problem"].startswith("stale: no daemon")


def test_a_health_check_document_of_an_earlier_boot_is_no_daemon(tmp_path: Path) -> None:
    statusfile.write_atomic(statusfile.status_path(tmp_path), checked(age=10.0))
    _doc, problem = statusfile.read(
        tmp_path, boot_id="00000000-0000-0000-0000-000000000000", healthcheck=True
    )
    assert problem.startswith("no daemon:") and "earlier boot" in problem


def test_a_health_check_document_is_never_a_daemon(tmp_path: Path) -> None:
    """Whatever needs a daemon (the health check's fast answer, `hma ack` waking it) never
    takes a health check's document for one, even when its pid is alive (reused)."""
    from hma.commands.healthcheck import daemon_status

    doc = {**checked(age=1.0), "pid": os.getpid()}
    statusfile.write_atomic(statusfile.status_path(tmp_path), doc)
    got, problem = statusfile.read(tmp_path)
    assert got == doc and problem.startswith("no daemon: the last health check wrote")
    assert statusfile.daemon_pid(tmp_path, "/proc") is None
    assert daemon_status(str(tmp_path), time.time()) is None
    assert statusfile.read(tmp_path, healthcheck=True) == (doc, "")
