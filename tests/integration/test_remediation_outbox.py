"""Outbox and circuit breaker against the real Slurm: outages, kill -9, simultaneous drains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hma.contracts.model import Action, Clears
from tests.integration.remediation_helpers import (  # noqa: F401 (fixtures)
    cluster,
    fault,
    fresh,
    kinds,
    make,
    verdict,
    wait,
    wait_alert,
    write_config,
)
from tests.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

REASON = "HMA: GPU_XID_79 gpu:0000:3b:00"
ROOT = Path(__file__).resolve().parents[2]
OUTAGE_S = float(os.environ.get("HMA_TEST_OUTAGE_S", "60"))


def held_by_hma(cluster: SlurmCluster) -> list[str]:
    return sorted(
        n["name"]
        for n in cluster.nodes_json()
        if n["reason"].startswith("HMA:") and "DRAIN" in n["state_flags"]
    )


def test_breaker_holds_the_second_drain(fresh: SlurmCluster, tmp_path: Path) -> None:
    limits = {"max_drained_percent": 25.0}  # 4 nodes: one may be held
    nofix = fault(action=Action.NONE, clears=Clears.OBSERVATION)
    rem1, _s1 = make(tmp_path, fresh, "node1", limits)
    rem2, _s2 = make(tmp_path, fresh, "node2", limits)
    try:
        rem1.update(verdict(nofix), "boot-1")
        wait(lambda: held_by_hma(fresh) == ["node1"], what="first drain")
        rem2.update(verdict(nofix), "boot-1")
        wait(lambda: ("drain", "held") in kinds(rem2), what="second drain held")
        status = rem2.status()
        assert status["held"].startswith("breaker")
        assert status["breaker"]["open"] and status["breaker"]["limit"] == 1
        assert "h=breaker" in fresh.node("node2")["extra"]
        assert "DRAIN" not in fresh.state("node2")  # drained at once, counted, undone
        wait(lambda: fresh.state("node2") == "IDLE", what="idle (Slurm pings it after RESUME)")
        alerts = wait_alert(rem2, lambda a: a.code == "HMA_BREAKER_OPEN", "breaker alert")
        breaker = [a for a in alerts if a.code == "HMA_BREAKER_OPEN"]
        assert breaker and breaker[0].severity.name == "CRITICAL"
        # node1 recovers: the held drain is re-evaluated and goes ahead
        rem1.update(verdict(), "boot-1")
        wait(lambda: held_by_hma(fresh) == ["node2"], what="held drain released")
        assert "h=breaker" not in fresh.node("node2")["extra"]
    finally:
        rem1.close()
        rem2.close()


def test_simultaneous_drains_end_with_one(fresh: SlurmCluster, tmp_path: Path) -> None:
    limits = {"max_drained_percent": 25.0}
    nofix = fault(action=Action.NONE, clears=Clears.OBSERVATION)
    rems = [make(tmp_path, fresh, n, limits)[0] for n in ("node3", "node4")]
    try:
        go = threading.Barrier(2)

        def hit(rem: object) -> None:
            go.wait()
            rem.update(verdict(nofix), "boot-1")  # type: ignore[attr-defined]

        threads = [threading.Thread(target=hit, args=(r,)) for r in rems]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait(
            lambda: sorted(s for r in rems for k, s in kinds(r) if k == "drain")
            == ["done", "held"],
            what="one drain done, one held",
        )
        time.sleep(1.0)  # a few re-evaluations later it is still one
        assert len(held_by_hma(fresh)) == 1
    finally:
        for r in rems:
            r.close()


def _scontrol_wrapper(cluster: SlurmCluster, tmp: Path, mode: str) -> tuple[list[str], Path]:
    log = tmp / f"scontrol-{mode}.log"
    argv = [
        sys.executable,
        str(ROOT / "tests/integration/scontrol_wrapper.py"),
        mode,
        str(log),
        cluster.client("scontrol"),
    ]
    return argv, log


@pytest.mark.parametrize("mode", ["before", "after"])
def test_kill_9_around_the_drain_gives_one_drain(
    fresh: SlurmCluster, tmp_path: Path, mode: str
) -> None:
    argv, log = _scontrol_wrapper(fresh, tmp_path, mode)
    cfg = write_config(tmp_path / "hma.toml", fresh, "node1", {}, {"scontrol": argv})
    db = tmp_path / "state.db"
    child = [sys.executable, "-m", "tests.integration.remediate_child", str(cfg), str(db)]
    first = subprocess.run(child, cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert first.returncode == -9  # killed by the wrapper around the drain
    assert ("DRAIN" in fresh.state("node1")) == (mode == "after")
    second = subprocess.run(
        child, cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )
    assert second.returncode == 0, second.stderr
    rows = json.loads(second.stdout)
    assert [(r["kind"], r["state"]) for r in rows] == [("drain", "done")]
    assert fresh.node("node1")["reason"] == REASON
    drains = [line for line in log.read_text().splitlines() if "State=DRAIN" in line]
    applied = [line for line in drains if line.startswith("ran rc=0")]
    assert len(applied) == 1, drains


@pytest.mark.timeout(OUTAGE_S + 90)
def test_outage_then_pending_drain_lands(fresh: SlurmCluster, tmp_path: Path) -> None:
    rem, _store = make(tmp_path, fresh, "node2", {"retry_max": 5.0})
    try:
        wait(lambda: rem.facts().job_running is False, what="facts")
        fresh.stop_controller()
        started = time.monotonic()
        rem.update(verdict(fault(action=Action.NONE)), "boot-1")
        # update() only wrote the outbox: the first attempt (about 9 s) has not failed yet
        first = rem.status()["actions"][0]
        assert first["state"] in ("pending", "attempting") and first["last_error"] == ""
        wait(lambda: rem.status()["actions"][0]["attempts"] >= 1, 30, "a failed attempt")
        wait(lambda: rem.status()["actions"][0]["state"] == "failed", 30, "failed state")
        status = rem.status()
        row = status["actions"][0]
        assert row["kind"] == "drain"  # 22.05 (sinfo --json) says slurmctld, 24.11 (scontrol) not
        assert "slurmctld" in row["last_error"] or "slurm controller" in row["last_error"]
        assert status["pending"] == 1
        wait(lambda: rem.facts().job_running is None, 30, "facts: jobs unknown during the outage")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - started)))
        fresh.start_controller()
        wait(lambda: fresh.node("node2")["reason"] == REASON, 60, "drain after the outage")
        wait(lambda: kinds(rem) == [("drain", "done")], 30, "drain done")
        assert rem.status()["actions"][0]["attempts"] >= 2
    finally:
        rem.close()
