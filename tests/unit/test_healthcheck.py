"""hma healthcheck: answering from a running daemon's status.json."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hma.remediation.healthcheck import daemon_status, run


def write(folder: Path, **fields: object) -> None:
    doc = {
        "pid": os.getpid(),
        "generated": time.time(),
        "heartbeat_s": 15.0,
        "node": "n1",
        "severity": "critical",
        "faults": [],
        **fields,
    }
    (folder / "status.json").write_text(json.dumps(doc))


def test_fresh_live_daemon_is_used(tmp_path: Path) -> None:
    write(tmp_path)
    assert daemon_status(str(tmp_path), time.time()) is not None


def test_stale_or_dead_daemon_is_ignored(tmp_path: Path) -> None:
    write(tmp_path, generated=time.time() - 100)
    assert daemon_status(str(tmp_path), time.time()) is None
    write(tmp_path, pid=2**22 + 12345)
    assert daemon_status(str(tmp_path), time.time()) is None
    (tmp_path / "status.json").write_text("{not json")
    assert daemon_status(str(tmp_path), time.time()) is None


def test_exit_code_is_the_daemons_severity(tmp_path: Path, capsys: object) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write(run_dir, faults=[{"code": "GPU_XID_79", "component": "gpu:0000:3b:00", "active": True}])
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nrun_dir = "{run_dir}"\nstate_dir = "{tmp_path}/state"\n'
        f'probes_dir = "{tmp_path}/probes.d"\n'
    )
    assert run(str(cfg)) == 2
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "CRITICAL" in out and "GPU_XID_79 gpu:0000:3b:00" in out
