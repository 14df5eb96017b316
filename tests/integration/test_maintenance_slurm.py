"""`hma maintenance` against the real Slurm (issue 20): during maintenance a fault is detected,
recorded and alerted but the node is not drained; after `off`, or once the window ran out, the
same fault drains. `hma fleet` lists the node from the sinfo call it makes anyway."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.integration.remediation_helpers import (  # noqa: F401 (fixtures)
    back_in_service,
    cluster,
    fresh,
    wait,
    write_config,
)
from tests.integration.test_remediation_cli import site_probe
from tests.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
NODE = "node3"


def hma(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hma", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def drained(cluster: SlurmCluster) -> bool:
    node = cluster.node(NODE)
    return "DRAIN" in node["state_flags"] and node["reason"].startswith("HMA: ")


def healthcheck_until_drained(cluster: SlurmCluster, env: dict[str, str]) -> None:
    """Run the health check (as slurmd would, again and again) until the node is drained."""

    def check() -> bool:
        hma(env, "healthcheck")
        return drained(cluster)

    wait(check, timeout=90, what=f"{NODE} drained by hma")


@pytest.fixture
def setup(fresh: SlurmCluster, tmp_path: Path, trusted_dir: Path) -> Any:
    flag = tmp_path / "broken"
    site_probe(trusted_dir / "probes.d", flag)
    cfg = write_config(
        tmp_path / "hma.toml",
        fresh,
        NODE,
        {},
        {},
        extra="[probes.system]\nenabled = false\n",
        agent={"probes_dir": str(trusted_dir / "probes.d")},
    )
    env = {"PATH": "/usr/bin:/bin", "HMA_CONFIG": str(cfg), "SLURMD_NODENAME": NODE}
    return fresh, env, flag, tmp_path / f"state-{NODE}" / "state.db"


def test_a_fault_in_maintenance_alerts_and_does_not_drain_until_off(setup: Any) -> None:
    cluster, env, flag, db = setup
    on = hma(env, "maintenance", "on", "--for", "1h", "--reason", "swap PSU")
    assert on.returncode == 0, on.stderr
    assert "hma-maint=" in cluster.node(NODE)["extra"]
    status = json.loads(hma(env, "maintenance", "status", "--json").stdout)
    assert status["active"] and status["reason"] == "swap PSU"

    flag.touch()
    during = hma(env, "healthcheck")
    assert during.returncode == 2, during.stderr  # detected and reported
    assert not drained(cluster)
    with closing(sqlite3.connect(db)) as conn:  # recorded: the window, and the drain held
        who = conn.execute("SELECT who FROM history WHERE kind = 'maintenance_on'").fetchall()
        actions = conn.execute("SELECT kind, state, last_error FROM actions").fetchall()
    assert who and who[0][0]
    assert ("drain", "held") in {(k, s) for k, s, _e in actions}
    assert all(e.startswith("maintenance:") for _k, s, e in actions if s == "held")
    fleet = json.loads(hma(env, "fleet", "--json").stdout)
    rows = {r["node"]: r for r in fleet["nodes"]}
    assert rows[NODE]["maintenance"] is not None

    off = hma(env, "maintenance", "off")
    assert off.returncode == 0, off.stderr
    assert "hma-maint=" not in cluster.node(NODE)["extra"]
    healthcheck_until_drained(cluster, env)


def test_a_window_ends_by_itself(setup: Any) -> None:
    cluster, env, flag, _db = setup
    assert hma(env, "maintenance", "on", "--for", "20s").returncode == 0
    flag.touch()
    assert hma(env, "healthcheck").returncode == 2
    assert not drained(cluster)  # well inside the 20 s window
    healthcheck_until_drained(cluster, env)  # once it ran out
    status = json.loads(hma(env, "maintenance", "status", "--json").stdout)
    assert status["active"] is False
