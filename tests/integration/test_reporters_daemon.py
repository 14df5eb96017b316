"""`hma run` with both reporters: journald entries, the Prometheus textfile and `hma status`."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import Env, journald_usable, read_back

from hma.reporters import journal as j

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.skipif(not journald_usable(), reason="needs root, systemd-journald, journalctl"),
]


def wait_for(cond: Callable[[], bool], proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert proc.poll() is None, f"daemon exited {proc.returncode} waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_daemon_reports_to_journald_textfile_and_status(hma_env: Env, journald) -> None:
    pytest.importorskip("prometheus_client")
    ns, sock = journald
    textfile = hma_env.base / "metrics" / "hma.prom"
    textfile.parent.mkdir()
    hma_env.exec_probe("fan", 'echo "fan 3 failed"\nexit 2')
    hma_env.write(
        "[probes.fan]\ninterval = 0.5\n[probes.system]\nenabled = false\n"
        f'[reporters.journald]\nsocket = "{sock}"\n'
        f'[reporters.prometheus]\nenabled = true\ntextfile = "{textfile}"\n'
    )
    log = (hma_env.base / "daemon.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hma", "run"],
        env=hma_env.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        raised = (
            'hma_findings_active{code="SITE_PROBE_CRITICAL",component="site:fan",'
            'severity="critical"} 1.0'
        )

        def metrics() -> str:
            return textfile.read_text() if textfile.exists() else ""

        wait_for(lambda: raised in metrics(), proc, "the fault in the textfile")
        assert 'hma_probe_success{probe="fan"} 1.0' in metrics()
        assert 'hma_node_state{state="critical"} 1.0' in metrics()

        entries = read_back(ns, "HMA_CODE=SITE_PROBE_CRITICAL", "HMA_KIND=raised")
        first = [e for e in entries if e["HMA_KIND"] == "raised"][0]
        assert first["MESSAGE"] == "SITE_PROBE_CRITICAL raised (site:fan): fan 3 failed"
        assert first["PRIORITY"] == "2"
        assert first["MESSAGE_ID"] == j.message_id("SITE", "raised")
        assert first["HMA_PROBE"] == "fan"

        status = hma_env.hma("status")
        assert status.returncode == 2, status.stdout + status.stderr
        assert "[critical] SITE_PROBE_CRITICAL on site:fan: fan 3 failed" in status.stdout

        hma_env.exec_probe("fan", 'echo "fans ok"\nexit 0')  # the fault goes away
        wait_for(lambda: 'hma_node_state{state="ok"} 1.0' in metrics(), proc, "the fault to clear")
        assert "SITE_PROBE_CRITICAL" not in metrics()
        cleared = read_back(ns, "HMA_KIND=cleared", "HMA_CODE=SITE_PROBE_CRITICAL")
        assert cleared and cleared[0]["PRIORITY"] == "6"
        assert hma_env.hma("status").returncode == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    after = hma_env.hma("status")
    assert after.returncode == 3 and "no daemon" in after.stdout
    assert "cannot send to journald" not in Path(log.name).read_text()
