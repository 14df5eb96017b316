"""`hma check slurm` on a node of the loopback Slurm: the one-shot check reads the node's facts
from the backend (as the daemon's facts thread does), so it judges Slurm's own drain; it says
"not configured" only where Slurm is not (issue 32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.remediation_helpers import (  # noqa: F401 (fixtures)
    cluster,
    fresh,
    write_config,
)
from tests.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def check(config: Path, *probes: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(config), "check", *probes, "--json"],
        env={k: v for k, v in os.environ.items() if not k.startswith("HMA_")},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_check_slurm_judges_the_node_slurm_drained(fresh: SlurmCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path / "hma.toml", fresh, "node4")
    healthy = check(config, "slurm")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    (probe,) = json.loads(healthy.stdout)["probes"]
    assert (probe["status"], probe["findings"]) == ("ran", [])

    fresh.scontrol("update", "NodeName=node4", "State=DRAIN", "Reason=Kill task failed")
    drained = check(config, "slurm")
    assert drained.returncode == 2, drained.stdout + drained.stderr
    (probe,) = json.loads(drained.stdout)["probes"]
    assert probe["status"] == "ran"
    (finding,) = probe["findings"]
    assert finding["code"] == "SLURM_KILL_TASK_FAILED"
    assert finding["details"]["slurm_reason"] == "Kill task failed"


def test_check_slurm_without_slurm_says_not_configured(tmp_path: Path) -> None:
    config = tmp_path / "hma.toml"
    config.write_text(
        f'[agent]\nstate_dir = "{tmp_path}/state"\nrun_dir = "{tmp_path}/run"\n'
        '[slurm]\nscontrol = ["/nonexistent/scontrol"]\n'  # no Slurm tools on this host
    )
    res = check(config, "slurm")
    (probe,) = json.loads(res.stdout)["probes"]
    assert probe["status"] == "unsupported", res.stdout + res.stderr
    assert "Slurm is not configured on this node" in probe["error"]
