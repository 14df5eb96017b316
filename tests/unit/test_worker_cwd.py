"""A root process never imports from its working folder: probe workers start from /."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import PLUGINS


def test_a_worker_ignores_an_hma_package_planted_in_the_working_folder(  # type: ignore[no-untyped-def]
    hma_env, tmp_path: Path
) -> None:
    planted = tmp_path / "planted"
    (planted / "hma").mkdir(parents=True)
    marker = tmp_path / "imported"
    (planted / "hma" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    hma_env.write("[probes.ctxproc]\nenabled = true\n")
    env = {**hma_env.env(), "PYTHONPATH": str(PLUGINS)}  # no empty entry (the working folder)
    res = subprocess.run(
        [str(Path(sys.executable).parent / "hma"), "check", "ctxproc", "--json"],
        cwd=planted,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    [probe] = json.loads(res.stdout)["probes"]
    assert probe["status"] == "ran", res.stderr
    assert not marker.exists()
    assert os.getcwd() != str(planted)
