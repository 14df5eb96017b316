"""The daemon's log lines reach a real journald with their level (issue 20, defect 3): under
systemd stderr is a stream to journald, and `journalctl -p err` must show the agent's errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import journald_usable, read_back

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.skipif(not journald_usable(), reason="needs root, systemd-journald, journalctl"),
]


def journal_stream(ns: str, identifier: str) -> socket.socket:
    """A stdout stream to journald ``ns``, set up as systemd does for a service's stderr (the
    header of src/journal/journald-stream.c: identifier, unit, priority, level prefix on, no
    forwarding)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(f"/run/systemd/journal.{ns}/stdout")
    sock.sendall(f"{identifier}\n\n6\n1\n0\n0\n0\n".encode())
    sock.shutdown(socket.SHUT_RD)
    return sock


def run_under_journal(ns: str, identifier: str, argv: list[str], env: dict[str, str]) -> int:
    with journal_stream(ns, identifier) as sock:
        st = os.fstat(sock.fileno())
        env = {**env, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        proc = subprocess.run(
            argv, stdout=sock.fileno(), stderr=sock.fileno(), env=env, timeout=60, check=False
        )
    return proc.returncode


def test_daemon_errors_have_priority_err(journald: Any, hma_env: Any, tmp_path: Path) -> None:
    ns, _sock = journald
    blocker = tmp_path / "file"
    blocker.write_text("")  # a state folder below a file: unusable, logged as an error
    hma_env.config.write_text(
        f'[agent]\nstate_dir = "{blocker}/state"\nrun_dir = "{tmp_path}/run"\n'
    )
    ident = f"hma-levels-{os.getpid()}"
    rc = run_under_journal(ns, ident, [sys.executable, "-m", "hma", "run"], hma_env.env())
    assert rc == 73
    errors = read_back(ns, f"SYSLOG_IDENTIFIER={ident}", "-p", "err")
    assert errors, "no entry at priority err or above"
    assert all(e["PRIORITY"] == "3" for e in errors)
    assert "state folder unusable" in errors[0]["MESSAGE"]
    assert not errors[0]["MESSAGE"].startswith("<")
