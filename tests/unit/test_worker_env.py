"""Workers import the same hma as their parent, whatever the installation layout."""

from __future__ import annotations

import os
import subprocess
import sys

from hma.detection.runner import worker_env


def test_worker_env_carries_the_import_path(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PYTHONPATH", "/site/tools")
    monkeypatch.setattr(sys, "path", ["/usr/lib/hma", "/usr/lib/hma/vendor", *sys.path])
    env = worker_env()
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == ["/usr/lib/hma", "/usr/lib/hma/vendor"]
    assert env["WORKER_CALLER_PYTHONPATH"] == "/site/tools"


def test_worker_restores_the_callers_pythonpath() -> None:
    code = (
        "import os, hma.detection.worker as w; w._restore_pythonpath(); "
        "print(os.environ.get('PYTHONPATH'), 'WORKER_CALLER_PYTHONPATH' in os.environ)"
    )
    env = {**worker_env(), "WORKER_CALLER_PYTHONPATH": "/site/tools"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out == ["/site/tools", "False"]
