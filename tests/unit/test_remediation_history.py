"""The repair ladder and the repeat-offender memory through the engine: the real store, the
stand-in nvidia-smi over a stand-in NVML scenario file, and the in-memory Slurm of
test_remediation_engine (the same flows run on the real Slurm in tests/integration)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hma import cli
from hma.contracts import label as label_mod
from hma.contracts.model import Action, Clears
from hma.health import history
from hma.health.store import Store
from hma.remediation import remediations
from hma.remediation.engine import Remediator
from tests.faults import fault
from tests.standin import nvmlstub
from tests.unit.test_remediation_engine import FakeSlurm, make, run, writes

pytestmark = pytest.mark.timeout(60)

GPU = "gpu:0000:5d:00"  # stand-in GPU 3 (bus 0x5D)
XID46 = "GPU_XID_46"


def smi(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[nvmlstub.Scenario, Path]:
    """A stand-in NVML scenario (8 GPUs) the stand-in nvidia-smi resets, and its args log."""
    scenario = nvmlstub.Scenario(tmp / "scenario.txt")
    log = tmp / "smi-args.log"
    monkeypatch.setenv(nvmlstub.ENV, str(scenario.path))
    monkeypatch.setenv("HMA_SMI_ARGS_LOG", str(log))
    return scenario, log


def reset_rem(tmp: Path, fake: FakeSlurm, **recovery: object) -> Remediator:
    command = [sys.executable, str(nvmlstub.NVIDIA_SMI)]
    return make(tmp, fake, gpu_reset_command=command, max_drained_percent=100.0, **recovery)


def xid46(last: float = 0.0) -> object:
    return fault(XID46, GPU, message="Xid 46", last=last or None)


def test_gpu_reset_repairs_without_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario, log = smi(tmp_path, monkeypatch)
    scenario.set("err.*.3", nvmlstub.ERROR_GPU_IS_LOST)
    fake = FakeSlurm("n1")
    rem = reset_rem(tmp_path, fake)
    run(rem, (xid46(),))
    assert "reboot" not in writes(fake)
    assert log.read_text().split() == ["--gpu-reset", "-i", "00000000:5D:00.0"]
    assert "err.*.3" not in scenario.path.read_text()  # the stand-in driver's GPU came back
    assert rem.gpu_resets() and rem.gpu_resets() == []  # handed to the daemon once
    ep = rem.status()["episode"]
    assert ep["gpu_reset"]["ok"] is True and "successfully reset" in ep["gpu_reset"]["note"]
    # the daemon cleared the Xid; the node waits for the gpu probe's reading
    run(rem, ())
    assert "DRAIN" in fake.state["n1"].flags
    rem.probe_ran("gpu", time.time())
    run(rem, ())
    assert "DRAIN" not in fake.state["n1"].flags and "reboot" not in writes(fake)
    assert [r["action"] for r in remediations.rows(rem.store)] == ["drain", "reset_gpu"]


@pytest.mark.parametrize("how", ["refused", "failed"])
def test_refused_or_failed_reset_reboots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    scenario, log = smi(tmp_path, monkeypatch)
    if how == "refused":
        scenario.hold(3, 4242)
    else:
        scenario.reset_fails(3)
    fake = FakeSlurm("n1")
    rem = reset_rem(tmp_path, fake)
    run(rem, (xid46(),))
    assert "--gpu-reset" in log.read_text()
    assert writes(fake).count("reboot") == 1
    note = rem.status()["episode"]["gpu_reset"]["note"]
    assert "exited 255" in note
    assert ("In use by another client" in note) == (how == "refused")
    assert rem.gpu_resets() == []


def test_no_reset_for_a_reboot_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scenario, log = smi(tmp_path, monkeypatch)
    fake = FakeSlurm("n1")
    rem = reset_rem(tmp_path, fake)
    run(rem, (fault(),))  # Xid 79: NVIDIA says reboot
    assert writes(fake) == ["DRAIN", "reboot"] and not log.exists()


def four_episodes(rem: Remediator, fake: FakeSlurm) -> None:
    for code in ("SYS_A", "SYS_B", "SYS_C", "SYS_D"):
        run(rem, (fault(code, "node", action=Action.NONE, clears=Clears.OBSERVATION),))
        run(rem, ())
    assert "DRAIN" in fake.state["n1"].flags


def test_fourth_remediation_holds_for_a_human_and_survives_a_wipe(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, max_drained_percent=100.0)
    four_episodes(rem, fake)
    node = fake.state["n1"]
    assert node.reason.startswith("HMA: SYS_D node : repeat offender (4 remediations in 7 d)")
    mirror = label_mod.find_history(node.field("extra"))
    assert (
        mirror is not None
        and mirror.held
        and [c for _t, c in mirror.entries]
        == [
            "SYS_A",
            "SYS_B",
            "SYS_C",
            "SYS_D",
        ]
    )
    assert "h=human" in node.field("extra")
    assert rem.status()["remediations"] == 4 and rem.status()["held_for_human"]
    # the state store is wiped (an agent reinstall): the mirror keeps the node held
    (tmp_path / "state" / "state.db").unlink()
    fresh = make(tmp_path, fake, max_drained_percent=100.0)
    fresh.refresh()
    run(fresh, ())
    assert "DRAIN" in fake.state["n1"].flags
    assert fresh.status()["held_for_human"] and fresh.status()["remediations"] == 4
    # hma reset: the hold and the history go, in the store and in Slurm, after an observation
    done = fresh.release(None, None, "alice", "replaced the PSU")
    assert done["released"] and done["cleared"] == 4
    fresh.flush(5)
    assert "hmah=" not in fake.state["n1"].field("extra") and "DRAIN" in fake.state["n1"].flags
    fresh.probe_ran("system", time.time())
    run(fresh, ())
    node = fake.state["n1"]
    assert "DRAIN" not in node.flags and "hma" not in node.field("extra")
    rows = remediations.rows(Store(str(tmp_path / "state" / "state.db")))
    assert [(r["action"], r["who"], r["note"]) for r in rows] == [
        ("reset", "alice", "replaced the PSU")
    ]


def test_reset_of_one_code_keeps_the_hold_while_the_count_stays_beyond(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, max_drained_percent=100.0, max_remediations=2)
    four_episodes(rem, fake)  # held at the third (SYS_C), which stays open
    assert rem.status()["remediations"] == 3 and rem.status()["held_for_human"]
    done = rem.release("SYS_D", None, "bob", "cable")  # nothing of it recorded
    assert done["cleared"] == 0 and not done["released"] and done["left"] == 3
    done = rem.release("SYS_A", "node", "bob", "cable")
    assert done["cleared"] == 1 and done["released"] and done["left"] == 2
    assert not rem.status()["held_for_human"]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["reset", "--reason", "x"], "give either --all or CODE"),
        (["reset", "--all", "GPU_XID_46", "--reason", "x"], "give either --all or CODE"),
        (["reset", "--all", "--reason", "  "], "--reason must say what was repaired"),
        (["reset", "--all", "--reason", "line\nbreak"], "printable characters on one line"),
        (["reset", "79", "--reason", "x"], "unknown code 79 (did you mean GPU_XID_79"),
        (["reset", "GPU_XID_46", "gpu 3", "--reason", "x"], "not a component: gpu 3"),
    ],
)
def test_hma_reset_misuse_is_refused_before_anything_changes(
    hma_env: Any, capsys: Any, argv: list[str], says: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("hma reset checks root first")
    rc = cli.main([*argv, "--config", str(hma_env.config)])
    err = capsys.readouterr().err
    assert rc == 2 and says in err, err
    assert not (hma_env.state / "state.db").exists()


def test_hma_reset_without_a_daemon_or_slurm_records_who_and_why(
    hma_env: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("hma reset needs root")
    hma_env.write("[slurm]\nenabled = false\n[reporters.journald]\nenabled = false\n")
    monkeypatch.setenv("SUDO_USER", "carol")
    rc = cli.main(["reset", "gpu_xid_46", "--reason", "new GPU", "--config", str(hma_env.config)])
    out = capsys.readouterr().out
    assert rc == 0 and "reset GPU_XID_46: 0 remediation(s)" in out and "no daemon" in out
    store = Store(str(hma_env.state / "state.db"))
    try:
        (row,) = remediations.rows(store)
        assert (row["action"], row["code"], row["who"], row["note"]) == (
            "reset",
            "GPU_XID_46",
            "carol",
            "new GPU",
        )
        assert history.rows(store, 1)[0]["who"] == "carol"
    finally:
        store.close()


def test_a_mirror_dated_in_the_future_is_never_taken_up(tmp_path: Path) -> None:
    """Issue 28: after a wiped store, a ``hmah=`` token whose entries (or hold) lie beyond the
    skew into the future seeds nothing: no remediation counted, no hold for a human."""
    fake = FakeSlurm("n1")
    future = int(time.time()) + 86400
    for token in (
        "hmah=" + ",".join(f"{future}:SYS_{c}" for c in "ABCD"),
        f"hmah=H{future},{int(time.time()) - 60}:SYS_A",
    ):
        fake.state["n1"] = replace(fake.state["n1"], texts=(("extra", f"rack=1 {token}"),))
        for db in (tmp_path / "state").glob("state.db*"):
            db.unlink()
        rem = make(tmp_path, fake, max_drained_percent=100.0)
        rem.refresh()
        run(rem, ())
        assert rem.status()["remediations"] == 0 and not rem.status()["held_for_human"], token
        rem.close()


def test_an_entry_another_writer_mirrored_survives_the_agent_restart(tmp_path: Path) -> None:
    """The controller's watcher records its reboot in ``hmah=`` while the node is down; the
    agent comes back with its state store intact and keeps that entry (it wrote its own mirror
    over it), so the watcher's remediation counts for the repeat-offender rule."""
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, max_drained_percent=100.0)
    for code in ("SYS_A", "SYS_B"):
        run(rem, (fault(code, "node", action=Action.NONE, clears=Clears.OBSERVATION),))
        run(rem, ())
    node = fake.state["n1"]
    mirror = label_mod.find_history(node.field("extra"))
    assert mirror is not None and [c for _t, c in mirror.entries] == ["SYS_A", "SYS_B"]
    later = max(t for t, _c in mirror.entries) + 1
    watched = label_mod.History((*mirror.entries, (later, "HMA_WATCH_NOT_RESPONDING")))
    text = label_mod.edit_history(node.field("extra"), watched)
    fake.state["n1"] = node.with_field("extra", text)
    again = make(tmp_path, fake, max_drained_percent=100.0)
    again.refresh()
    run(again, (fault("SYS_C", "node", action=Action.NONE, clears=Clears.OBSERVATION),))
    run(again, ())
    kept = label_mod.find_history(fake.state["n1"].field("extra"))
    assert kept is not None
    codes = sorted(c for _t, c in kept.entries)  # by time: the watcher's is dated ahead of SYS_C
    assert codes == ["HMA_WATCH_NOT_RESPONDING", "SYS_A", "SYS_B", "SYS_C"]
    assert again.status()["remediations"] == 4
