"""The channel of requested checks (hma.daemon.checkreq) and ``hma check --request``
(hma.commands.checkrequest): a folder that carries no data, rate-limited, the verdict waited for."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from hma.commands import checkrequest
from hma.contracts.model import ProbeRun, RunStatus
from hma.daemon import checkreq
from hma.daemon.loop import Daemon


class Model:
    """A health model whose verdict is fixed."""

    def __init__(self, severity: str) -> None:
        self.severity = severity

    def verdict(self, _now: float) -> Any:
        """The verdict (only its severity is read)."""
        return type("V", (), {"severity": self.severity})()


class Pipe:
    """A pipeline holding a model."""

    def __init__(self, severity: str = "ok") -> None:
        self.model = Model(severity)


def channel(tmp_path: Path, interval: float = 60.0, severity: str = "ok") -> checkreq.CheckRequests:
    path = str(tmp_path / "req")
    checkreq.ensure(path)
    return checkreq.CheckRequests(path, interval, Pipe(severity))  # type: ignore[arg-type]


def run(name: str, started: float) -> ProbeRun:
    return ProbeRun(name, RunStatus.RAN, started, 0.1)


def test_the_folder_is_made_1733_and_a_symlink_or_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "req"
    checkreq.ensure(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o1733
    os.chmod(path, 0o777)
    checkreq.ensure(str(path))  # a wrong mode is set right
    assert stat.S_IMODE(path.stat().st_mode) == 0o1733
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(checkreq.FolderError, match="not a folder of ours"):
        checkreq.ensure(str(tmp_path / "link"))
    assert stat.S_IMODE((tmp_path / "elsewhere").stat().st_mode) != 0o1733  # never followed
    (tmp_path / "file").write_text("")
    with pytest.raises(checkreq.FolderError):
        checkreq.ensure(str(tmp_path / "file"))


def test_a_flood_of_requests_costs_one_run_and_every_file_is_deleted(tmp_path: Path) -> None:
    ch = channel(tmp_path)
    for i in range(200):
        (Path(ch.path) / f"r{i}").write_text("")
    now = time.time() + 1
    assert ch.poll(now)
    assert ch.start(["gpu", "efa"], now) == ["efa", "gpu"]
    assert os.listdir(ch.path) == []
    assert not ch.poll(now + 0.5)  # nothing new
    assert not ch.ran("gpu", run("gpu", now - 5), now + 1)  # a run started before: not it
    assert not ch.ran("gpu", run("gpu", now + 0.1), now + 1)
    assert ch.ran("efa", run("efa", now + 0.2), now + 2)
    assert ch.to_json() == {"at": now, "done": now + 2, "verdict": "ok"}


def test_requests_within_the_interval_wait_for_it(tmp_path: Path) -> None:
    ch = channel(tmp_path, interval=60.0, severity="critical")
    (Path(ch.path) / "a").write_text("")
    now = time.time() + 1
    assert ch.poll(now)
    ch.start([], now)  # no probes: done at once
    assert ch.to_json() == {"at": now, "done": now, "verdict": "critical"}
    (Path(ch.path) / "b").write_text("")
    assert not ch.poll(now + 1)
    assert not ch.poll(now + 59)
    assert os.listdir(ch.path) == ["b"]  # kept for the next run
    assert ch.poll(now + 61)
    assert os.listdir(ch.path) == []


def test_no_new_run_while_one_runs(tmp_path: Path) -> None:
    ch = channel(tmp_path, interval=1.0)
    (Path(ch.path) / "a").write_text("")
    now = time.time() + 1
    assert ch.poll(now)
    ch.start(["gpu"], now)
    (Path(ch.path) / "b").write_text("")
    assert not ch.poll(now + 5)  # the first has not finished
    assert ch.ran("gpu", run("gpu", now + 1), now + 6)
    assert ch.poll(now + 7)


def test_content_and_kind_of_entries_are_never_read(tmp_path: Path) -> None:
    ch = channel(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("keep")
    os.mkfifo(Path(ch.path) / "fifo")  # opening it would block
    (Path(ch.path) / "link").symlink_to(secret)
    unreadable = Path(ch.path) / "x"
    unreadable.write_text('{"verdict": "ok"}')
    unreadable.chmod(0)
    assert ch.poll(time.time() + 1)
    assert os.listdir(ch.path) == []
    assert secret.read_text() == "keep"  # a symlink is removed, never followed


def test_a_folder_replaced_by_a_symlink_is_not_listed(tmp_path: Path) -> None:
    ch = channel(tmp_path)
    os.rmdir(ch.path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "f").write_text("")
    os.symlink(other, ch.path)
    assert not ch.poll(time.time() + 1)
    assert os.listdir(other) == ["f"]


def test_a_run_that_never_finishes_is_given_up(tmp_path: Path) -> None:
    ch = channel(tmp_path, interval=1.0)
    (Path(ch.path) / "a").write_text("")
    now = time.time() + 1
    assert ch.poll(now)
    ch.start(["stuck"], now)
    (Path(ch.path) / "b").write_text("")
    assert ch.poll(now + checkreq.TIMEOUT_S + 1)
    assert ch.last is not None and ch.last.at == now + checkreq.TIMEOUT_S + 1


def test_the_daemon_runs_every_probe_on_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path}/state"\nrun_dir = "{tmp_path}/run"\n'
        f'probes_dir = "{tmp_path}/probes.d"\n[slurm]\nenabled = false\n'
    )
    d = Daemon(str(cfg))
    monkeypatch.setattr(d.sources, "start", lambda *_a: None)  # no event source (kernel log)
    try:
        d._configure()
        assert d.checks is not None
        assert d.checks.path == f"{tmp_path}/run/check-requests"
        d._periodic()
        for state in d.scheduler.probes.values():
            state.next_due = time.monotonic() + 3600  # none due on its own
        checkrequest.touch(d.checks.path)
        d._periodic()
        assert d.checks.pending == set(d.scheduler.probes)
        assert all(s.next_due <= time.monotonic() for s in d.scheduler.probes.values())
    finally:
        d._teardown()


# --- hma check --request --------------------------------------------------------------------


def config(tmp_path: Path) -> str:
    cfg = tmp_path / "hma.toml"
    cfg.write_text(f'[agent]\nrun_dir = "{tmp_path}/run"\n')
    (tmp_path / "run").mkdir()
    return str(cfg)


def test_no_agent_is_unknown_with_a_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert checkrequest.main(config(tmp_path), 1.0) == 3
    assert "no agent to ask" in capsys.readouterr().err


def test_no_answer_in_time_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path)
    checkreq.ensure(str(tmp_path / "run" / "check-requests"))
    monkeypatch.setattr(checkrequest, "POLL_S", 0.01)
    assert checkrequest.main(cfg, 0.05) == 3
    assert "no answer from the agent within 0.05 s" in capsys.readouterr().err
    assert len(os.listdir(tmp_path / "run" / "check-requests")) == 1  # the request stays


def test_the_verdict_of_a_run_after_the_request_decides_the_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path)
    checkreq.ensure(str(tmp_path / "run" / "check-requests"))
    reads = []

    def read(_run_dir: Any, **_kw: Any) -> tuple[dict[str, Any], str]:
        reads.append(1)
        at = 0.0 if len(reads) < 3 else time.time() + 1  # an older run first: not the answer
        block = {"at": at, "done": at + 1, "verdict": "critical"}
        fault = {
            "severity": "critical",
            "code": "EFA_MESH",
            "component": "efa\x1b[2J",
            "message": "m",
        }
        return {"node": "n1", "requested": block, "faults": [fault]}, ""

    monkeypatch.setattr(checkrequest.statusfile, "read", read)
    monkeypatch.setattr(checkrequest, "POLL_S", 0.01)
    assert checkrequest.main(cfg, 30.0) == 2
    out = capsys.readouterr().out
    assert len(reads) == 3
    assert out.startswith("n1: CRITICAL (requested check")
    assert "EFA_MESH efa\\x1b[2J: m" in out


@pytest.mark.parametrize(
    ("block", "answered"),
    [
        (None, False),
        ({"at": 10.0, "done": None}, False),
        ({"at": 5.0, "done": 6.0}, False),
        ({"at": 10.0, "done": 11.0, "verdict": "ok"}, True),
        ({"at": "10", "done": 11.0}, False),
    ],
)
def test_answer(block: Any, answered: bool) -> None:
    assert (checkrequest.answer({"requested": block}, 9.0) is not None) == answered


def test_exit_codes() -> None:
    assert [checkrequest.exit_code(v) for v in ("ok", "warning", "critical", "unknown", None)] == [
        0,
        1,
        2,
        3,
        3,
    ]


def test_hma_status_shows_the_requested_check() -> None:
    from hma.commands import status

    doc: dict[str, Any] = {"node": "n1", "severity": "critical", "probes": [], "faults": []}
    doc["requested"] = {"at": 100.0, "done": 101.0, "verdict": "critical\x1b"}
    assert "requested check: CRITICAL\\x1b, every probe run at" in status.render(doc, now=200.0)
    doc["requested"] = {"at": 100.0, "done": None, "verdict": None}
    assert "requested check: running since" in status.render(doc, now=200.0)


def test_a_request_file_dated_ahead_is_deleted_and_asks_nothing(tmp_path: Path) -> None:
    """A user can set a file's mtime (``touch -d 2099-01-01``): such a file would be waited for
    at every tick and never answered; it is deleted and is no request."""
    ch = channel(tmp_path)
    ahead = Path(ch.path) / "forged"
    ahead.touch()
    far = time.time() + 86400 * 365
    os.utime(ahead, (far, far))
    assert not ch.poll(time.time() + 1)
    assert not ahead.exists() and not ch.poll(time.time() + 2)
