"""``hma check --request`` against a real ``hma run``: a fault only the requested run can see (the
probe's own interval is an hour) is found, shown in status.json and decides the exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="executable probes need a root-owned path"),
    pytest.mark.timeout(120),
]


def test_a_requested_check_runs_the_probe_now(hma_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "broken"
    hma_env.exec_probe("site", f'if [ -e {marker} ]; then echo "mesh down"; exit 2; fi\necho ok')
    hma_env.write("[slurm]\nenabled = false\n[probes.site]\ninterval = 3600\n")
    text = hma_env.config.read_text().replace(
        "[agent]\n", "[agent]\ncheck_request_interval = 1\n", 1
    )
    hma_env.config.write_text(text)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "hma", "run"],
        env=hma_env.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        folder = hma_env.run / "check-requests"
        for _ in range(300):
            if (hma_env.run / "status.json").exists() and folder.is_dir():
                break
            time.sleep(0.1)
        first = hma_env.hma("check", "--request", "--wait", "60")
        assert "SITE_PROBE_CRITICAL" not in first.stdout, first.stderr
        marker.write_text("")  # the next scheduled run is an hour away
        res = hma_env.hma("check", "--request", "--wait", "60")
        assert res.returncode == 2, res.stdout + res.stderr
        assert "CRITICAL (requested check" in res.stdout
        assert "SITE_PROBE_CRITICAL site:site" in res.stdout and "mesh down" in res.stdout
        requested = hma_env.status()["requested"]
        assert requested["verdict"] == "critical" and requested["done"] >= requested["at"]
        assert os.listdir(folder) == []
        assert "requested check: CRITICAL" in hma_env.hma("status").stdout
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
