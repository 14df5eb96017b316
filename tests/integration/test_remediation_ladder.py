"""The repair ladder and the repeat-offender memory against the real (loopback) Slurm: a GPU
reset through the stand-in nvidia-smi over the stand-in NVML's scenario, the reboot after a
refused or failed reset, and a node remediated four times in a week held for a human across a
wiped state store until ``hma reset`` and a healthy observation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import journald_usable, read_back

from hma import assembly
from hma.contracts import label as label_mod
from hma.contracts.model import Action, Clears
from hma.health.store import Store
from hma.remediation import remediations
from hma.remediation.engine import Remediator
from tests.integration.remediation_helpers import (  # noqa: F401 (fixtures)
    back_in_service,
    cluster,
    fault,
    fresh,
    kinds,
    make,
    verdict,
    wait,
    write_config,
)
from tests.slurmcluster import SlurmCluster
from tests.standin import nvmlstub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GPU = "gpu:0000:5d:00"  # stand-in GPU 3
XID46 = "GPU_XID_46"  # NVIDIA's catalogue: RESET_GPU
SMI = [sys.executable, str(nvmlstub.NVIDIA_SMI)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> nvmlstub.Scenario:
    """The stand-in NVML's scenario (8 healthy GPUs) that the stand-in nvidia-smi resets; its
    arguments are logged to ``smi-args.log``."""
    found = nvmlstub.Scenario(tmp_path / "scenario.txt")
    monkeypatch.setenv(nvmlstub.ENV, str(found.path))
    monkeypatch.setenv("HMA_SMI_ARGS_LOG", str(tmp_path / "smi-args.log"))
    return found


def xid46() -> Any:
    return fault(XID46, GPU, message="Xid 46: GPU stopped processing")


def test_reset_code_is_repaired_by_a_gpu_reset_without_a_reboot(
    fresh: SlurmCluster, tmp_path: Path, scenario: nvmlstub.Scenario
) -> None:
    rem, store = make(tmp_path, fresh, "node1", {"gpu_reset_command": SMI})
    try:
        boot = fresh.boot_id("node1")
        rem.update(verdict(xid46(), boot=boot), boot)
        wait(lambda: ("reset_gpu", "done") in kinds(rem), what="the GPU reset")
        assert "DRAIN" in fresh.node("node1")["state_flags"]  # it ran on the drained node
        args = (tmp_path / "smi-args.log").read_text().split()
        assert args == ["--gpu-reset", "-i", "00000000:5D:00.0"]
        assert rem.gpu_resets() == [(GPU, rem.status()["episode"]["gpu_reset"]["at"])]
        # the daemon clears the Xid (hma.health.pipeline.gpu_reset); healthy, but not yet read
        rem.update(verdict(boot=boot), boot)
        rem.probe_ran("system", time.time())  # another probe's run does not verify the GPU
        wait(lambda: rem.status()["episode"]["healthy_since"], what="healthy verdict taken")
        assert "DRAIN" in fresh.node("node1")["state_flags"]
        rem.probe_ran("gpu", time.time())  # the gpu probe read it healthy
        wait(lambda: back_in_service(fresh, fresh.node("node1")), what="resume")
        assert fresh.boot_id("node1") == boot and ("reboot", "done") not in kinds(rem)
        assert [k for k, _s in kinds(rem)] == ["drain", "reset_gpu", "resume"]
        mirror = label_mod.find_history(fresh.node("node1")["extra"])
        assert mirror is not None and [c for _t, c in mirror.entries] == [XID46]
        assert [r["action"] for r in remediations.rows(store)] == ["drain", "reset_gpu"]
    finally:
        rem.close()


@pytest.mark.parametrize("how", ["refused", "failed"])
def test_refused_or_failed_reset_goes_on_to_a_reboot(
    fresh: SlurmCluster, tmp_path: Path, scenario: nvmlstub.Scenario, how: str
) -> None:
    if how == "refused":
        scenario.hold(3, 31337)  # a process holds the GPU
    else:
        scenario.reset_fails(3)
    rem, _store = make(tmp_path, fresh, "node2", {"gpu_reset_command": SMI})
    try:
        boot, before = fresh.boot_id("node2"), fresh.reboots().count("node2")
        rem.update(verdict(xid46(), boot=boot), boot)
        wait(lambda: fresh.reboots().count("node2") > before, 30, "RebootProgram run")
        rows = rem.status()["actions"]
        reset = next(r for r in rows if r["kind"] == "reset_gpu")
        assert reset["state"] == "skipped" and "exited 255" in reset["last_error"]
        assert ("In use by another client" in reset["last_error"]) == (how == "refused")
        assert [r["kind"] for r in rows] == ["drain", "reset_gpu", "reboot"]
        assert "--gpu-reset" in (tmp_path / "smi-args.log").read_text()
        assert rem.gpu_resets() == []
    finally:
        rem.close()


def test_kill_9_between_the_reset_and_its_record_resets_once_then_reboots(
    fresh: SlurmCluster, tmp_path: Path, scenario: nvmlstub.Scenario
) -> None:
    log = tmp_path / "reset.log"
    wrapper = [sys.executable, str(ROOT / "tests/integration/reset_wrapper.py"), str(log), *SMI]
    cfg = write_config(tmp_path / "hma.toml", fresh, "node3", {"gpu_reset_command": wrapper})
    db = tmp_path / "state.db"
    child = [sys.executable, "-m", "tests.integration.remediate_child", str(cfg), str(db), "xid46"]
    before = fresh.reboots().count("node3")
    first = subprocess.run(child, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == -9, first.stderr  # killed right after the reset
    assert "DRAIN" in fresh.node("node3")["state_flags"]
    second = subprocess.run(
        child, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert second.returncode == 0, second.stderr
    rows = {r["kind"]: r for r in json.loads(second.stdout)}
    assert list(rows) == ["drain", "reset_gpu", "reboot"]
    assert rows["reset_gpu"]["state"] == "skipped"
    assert "outcome unknown" in rows["reset_gpu"]["last_error"]
    assert rows["reboot"]["state"] == "done"
    assert [line.split()[:2] for line in log.read_text().splitlines()] == [["ran", "rc=0"]]
    wait(lambda: fresh.reboots().count("node3") > before, 30, "RebootProgram run")
    assert [r["action"] for r in remediations.rows(Store(str(db)))] == [
        "drain",
        "reset_gpu",
        "reboot",
    ]


def observed_fault(code: str) -> Any:
    return fault(code, "node", action=Action.NONE, clears=Clears.OBSERVATION, message=code)


def agent(cfg: Path, store_dir: Path) -> tuple[Remediator, Store]:
    store = Store(str(store_dir / "state.db"))
    return Remediator(assembly.load(str(cfg)), store), store


def run_hma(cfg: Path, *args: str, user: str = "alice") -> subprocess.CompletedProcess:
    env = {**os.environ, "HMA_CONFIG": str(cfg), "SUDO_USER": user}
    return subprocess.run(
        [sys.executable, "-m", "hma", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(not journald_usable(), reason="needs root, systemd-journald and journalctl")
def test_repeat_offender_stays_drained_across_a_wipe_until_hma_reset(
    fresh: SlurmCluster, tmp_path: Path, journald: tuple[str, str]
) -> None:
    ns, sock = journald
    cfg = write_config(
        tmp_path / "hma-node3.toml",
        fresh,
        "node3",
        {"max_drained_percent": 100.0},
        extra=f'[reporters.journald]\nsocket = "{sock}"\n',
    )
    state_dir = tmp_path / "state-node3"
    rem, _store = agent(cfg, state_dir)
    try:
        for n, code in enumerate(("SYS_A", "SYS_B", "SYS_C"), 1):  # three in a week: each resumed
            rem.update(verdict(observed_fault(code)), "boot-1")
            wait(lambda c=code: fresh.node("node3")["reason"] == f"HMA: {c} node", what="drain")
            rem.update(verdict(), "boot-1")
            wait(lambda: back_in_service(fresh, fresh.node("node3")), what=f"resume {n}")
        rem.update(verdict(observed_fault("SYS_D")), "boot-1")  # the fourth
        wait(lambda: ("hold", "held") in kinds(rem), what="held for a human")
        node = fresh.node("node3")
        assert node["reason"].startswith("HMA: SYS_D node : repeat offender (4 remediations")
        assert "DRAIN" in node["state_flags"] and "h=human" in node["extra"]
        rem.update(verdict(), "boot-1")  # healthy again: still no automatic return
        rem.probe_ran("system", time.time())
        held = next(r for r in rem.status()["actions"] if r["kind"] == "hold")
        wait(
            lambda: next(r for r in rem.status()["actions"] if r["kind"] == "hold")["updated"]
            > held["updated"],
            what="the hold re-checked after the healthy verdict",
        )
        assert "DRAIN" in fresh.node("node3")["state_flags"]
    finally:
        rem.close()

    # an agent reinstall: the state store is gone; Slurm's mirror keeps the node held
    shutil.rmtree(state_dir)
    rem, store = agent(cfg, state_dir)
    try:
        rem.update(verdict(), "boot-1")
        rem.probe_ran("system", time.time())
        wait(lambda: rem.status()["held_for_human"], what="the hold taken from the mirror")
        wait(lambda: ("hold", "held") in kinds(rem), what="held again")
        assert rem.status()["remediations"] == 4
        assert "DRAIN" in fresh.node("node3")["state_flags"]
    finally:
        rem.close()

    fleet = run_hma(cfg, "fleet", "--json")
    assert fleet.returncode == 0, fleet.stderr
    first = json.loads(fleet.stdout)["nodes"][0]
    assert first["node"] == "node3" and first["repeat_offender"] and first["remediations"] == 4

    # a human repaired it: hma reset without a daemon running
    bad = run_hma(cfg, "reset", "--all", "--reason", "")
    assert bad.returncode == 2 and "--reason" in bad.stderr
    done = run_hma(cfg, "reset", "--all", "--reason", "replaced the PSU")
    assert done.returncode == 0, done.stderr
    assert "4 remediation(s)" in done.stdout and "released" in done.stdout
    node = fresh.node("node3")
    assert "hmah=" not in node["extra"] and "h=human" not in node["extra"]
    assert "DRAIN" in node["state_flags"]  # back only after a healthy observation
    (entry,) = read_back(ns, "HMA_KIND=acknowledged")
    assert "reset by alice: replaced the PSU" in entry["MESSAGE"]
    assert json.loads(entry["HMA_DETAILS"])["who"] == "alice"

    rem, store = agent(cfg, state_dir)
    try:
        rem.update(verdict(), "boot-1")
        rem.probe_ran("system", time.time())
        wait(lambda: back_in_service(fresh, fresh.node("node3")), what="resume after hma reset")
        assert "hma" not in fresh.node("node3")["extra"]  # no label, count or history left
        rows = [r for r in remediations.rows(store) if r["action"] == "reset"]
        assert [(r["who"], r["note"]) for r in rows] == [("alice", "replaced the PSU")]
        assert rem.status()["remediations"] == 0 and not rem.status()["held_for_human"]
    finally:
        rem.close()
