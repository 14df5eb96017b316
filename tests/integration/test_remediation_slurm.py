"""Remediation against a real slurmctld + 4 slurmd on loopback (tests/slurmcluster.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hma.contracts import label as label_mod
from hma.contracts.model import Action, Clears
from tests.integration.remediation_helpers import (  # noqa: F401 (fixtures)
    back_in_service,
    cluster,
    fault,
    fresh,
    kinds,
    make,
    verdict,
    wait,
    wait_alert,
    write_hook,
)
from tests.simnode import SimNode
from tests.slurmcluster import SlurmCluster
from tests.standin import nvmlstub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

REASON = "HMA: GPU_XID_79 gpu:0000:3b:00"


def test_fault_drains_with_hma_reason_and_label(fresh: SlurmCluster, tmp_path: Path) -> None:
    rem, _store = make(tmp_path, fresh, "node1", {"reboot_mode": "hyperpod"})
    try:
        job = fresh.submit("node1")
        wait(lambda: rem.facts().job_ids == (job,), what="job in facts")
        rem.update(verdict(fault(action=Action.NONE, clears=Clears.OBSERVATION)), "boot-1")
        wait(lambda: "DRAIN" in fresh.state("node1"), what="drain")
        node = fresh.node("node1")
        assert node["reason"] == REASON
        found = label_mod.find(node["extra"])
        assert found is not None and found.code == "GPU_XID_79" and found.jobs == (job,)
        assert node["state"] in ("allocated", "mixed")  # draining: the job still runs
        wait_alert(rem, lambda a: a.kind == "action_applied" and job in a.message, "applied")
        assert rem.status()["jobs"] == [job]
    finally:
        rem.close()


def test_admin_drain_is_left_alone_and_only_labelled(fresh: SlurmCluster, tmp_path: Path) -> None:
    fresh.scontrol(
        "update", "NodeName=node2", "State=DRAIN", "Reason=disk swap by bob", "Extra=rack=12"
    )
    rem, _store = make(tmp_path, fresh, "node2")
    try:
        rem.update(verdict(fault()), "boot-1")
        wait(lambda: "hma=" in fresh.node("node2")["extra"], what="label")
        wait(lambda: ("drain", "done") in kinds(rem), what="drain decided")
        node = fresh.node("node2")
        assert node["reason"] == "disk swap by bob"
        assert node["extra"].startswith("rack=12 hma=unhealthy:GPU_XID_79:reboot")
        assert "h=not_owned" in node["extra"]
        rem.update(verdict(), "boot-1")  # healthy: clear our label, never the admin's drain
        wait(lambda: "hma=" not in fresh.node("node2")["extra"], what="label cleared")
        node = fresh.node("node2")
        assert node["extra"] == "rack=12" and node["reason"] == "disk swap by bob"
        assert "DRAIN" in node["state_flags"]
        assert "node2" not in fresh.reboots()
    finally:
        rem.close()


def test_cleared_fault_resumes(fresh: SlurmCluster, tmp_path: Path) -> None:
    rem, _store = make(tmp_path, fresh, "node3", {"resume_after": 0.5})
    try:
        rem.update(verdict(fault(action=Action.NONE, clears=Clears.OBSERVATION)), "boot-1")
        wait(lambda: fresh.node("node3")["reason"] == REASON, what="drain")
        rem.update(verdict(), "boot-1")
        wait(lambda: fresh.state("node3") == "IDLE", what="resume")
        node = fresh.node("node3")
        assert back_in_service(fresh, node) and "hma=" not in node["extra"]
        assert [k for k, _s in kinds(rem)] == ["drain", "resume"]
    finally:
        rem.close()


def test_reboot_flow_end_to_end(fresh: SlurmCluster, tmp_path: Path) -> None:
    rem, _store = make(tmp_path, fresh, "node1", {"resume_after": 0.5})
    try:
        boot1 = fresh.boot_id("node1")
        rem.update(verdict(fault(), boot=boot1), boot1)
        wait(lambda: "node1" in fresh.reboots(), what="RebootProgram run")
        wait(lambda: fresh.boot_id("node1") != boot1, what="new boot id")
        wait(lambda: fresh.node("node1")["state"] == "idle", 30, "slurmd back")
        node = fresh.node("node1")
        assert "DRAIN" in node["state_flags"]  # still drained through the reboot
        assert node["reason"].startswith(REASON)  # Slurm appended " : reboot issued"
        boot2 = fresh.boot_id("node1")
        rem.update(verdict(boot=boot2), boot2)  # the fault cleared by the reboot
        wait(lambda: fresh.state("node1") == "IDLE", what="resume after a healthy cycle")
        node = fresh.node("node1")
        found = label_mod.find(node["extra"])
        assert found is not None and found.state == "recovered" and found.reboots == 1
        assert [k for k, _s in kinds(rem)] == ["drain", "reboot", "resume"]
    finally:
        rem.close()


def test_persisting_fault_escalates_to_replace_hyperpod(
    fresh: SlurmCluster, tmp_path: Path
) -> None:
    rem, _store = make(tmp_path, fresh, "node2", {"replace_mode": "hyperpod"})
    try:
        f = fault()
        for n in (1, 2):  # the fault is still there after each of two real reboots
            boot = fresh.boot_id("node2")
            rem.update(verdict(f, boot=boot), boot)
            wait(lambda n=n: fresh.reboots().count("node2") == n, 30, f"reboot {n}")
            wait(lambda b=boot: fresh.boot_id("node2") != b, 30, f"new boot id {n}")
            wait(lambda: fresh.node("node2")["state"] == "idle", 30, "slurmd back")
            assert "DRAIN" in fresh.node("node2")["state_flags"]
        boot = fresh.boot_id("node2")
        rem.update(verdict(f, boot=boot), boot)
        wait(lambda: fresh.node("node2")["reason"] == "Action:Replace", 30, "replace")
        node = fresh.node("node2")
        assert "FAIL" in node["state_flags"] and fresh.reboots().count("node2") == 2
        found = label_mod.find(node["extra"])
        assert found is not None and found.action == "replace" and found.reboots == 2
        assert [k for k, _s in kinds(rem)] == ["drain", "reboot", "reboot", "label", "replace"]
    finally:
        rem.close()


def test_replace_command_hook_gets_environment_and_findings(
    fresh: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "hook.json"
    hook = write_hook(tmp_path / "hook.py", out)
    rem, _store = make(
        tmp_path,
        fresh,
        "node3",
        {"replace_mode": "command", "replace_command": [str(hook)], "max_reboots": 0},
    )
    try:
        rem.update(verdict(fault()), "boot-1")  # max_reboots 0: straight to replace
        wait(out.exists, what="hook run")
        data = json.loads(out.read_text())
        assert data["env"]["HMA_NODE"] == "node3"
        assert data["env"]["HMA_ACTION"] == "replace"
        assert data["env"]["HMA_REASON"] == REASON
        assert data["env"]["HMA_ACTION_ID"].startswith("ep1:replace")
        assert data["findings"]["findings"][0]["code"] == "GPU_XID_79"
        # The agent removes the file once the hook has exited, a moment after it wrote `out`.
        findings_file = data["env"]["HMA_FINDINGS_FILE"]
        wait(lambda: not os.path.exists(findings_file), what="findings file removed")
        assert fresh.node("node3")["reason"] == REASON  # drained, the hook does the rest
    finally:
        rem.close()


def test_policy_none_labels_only(fresh: SlurmCluster, tmp_path: Path) -> None:
    rem, _store = make(tmp_path, fresh, "node4", {"policy": "none"})
    try:
        rem.update(verdict(fault()), "boot-1")
        wait(lambda: "hma=unhealthy" in fresh.node("node4")["extra"], what="label")
        assert fresh.state("node4") == "IDLE"
        wait_alert(rem, lambda a: a.kind == "action_held", "held alert")
        rem.update(verdict(), "boot-1")
        wait(lambda: fresh.node("node4")["extra"] == "", what="label cleared")
        assert fresh.state("node4") == "IDLE" and "node4" not in fresh.reboots()
    finally:
        rem.close()


def test_dry_run_changes_nothing(fresh: SlurmCluster, tmp_path: Path) -> None:
    rem, _store = make(tmp_path, fresh, "node4", {"dry_run": True})
    try:
        rem.update(verdict(fault()), "boot-1")
        status = rem.status()
        assert [(k, s) for k, s in kinds(rem)] == [("drain", "dry_run"), ("reboot", "dry_run")]
        assert status["dry_run"] is True
        messages = [a.message for a in rem.alerts()]
        assert any(m.startswith("dry run: would drain node4") for m in messages)
        assert any(m.startswith("dry run: would reboot node4") for m in messages)
        node = fresh.node("node4")
        assert node["state"] == "idle" and not node["state_flags"] and node["extra"] == ""
    finally:
        rem.close()


def test_reason_is_passed_literally(fresh: SlurmCluster, tmp_path: Path) -> None:
    odd = "gpu:\"0\";rm -rf /tmp/x;$(touch /tmp/hma-pwned)`id`'q'"
    rem, _store = make(tmp_path, fresh, "node1")
    try:
        rem.update(verdict(fault(component=odd, action=Action.NONE)), "boot-1")
        wait(lambda: "DRAIN" in fresh.node("node1")["state_flags"], what="drain")
        assert fresh.node("node1")["reason"] == f"HMA: GPU_XID_79 {odd}"
        assert not os.path.exists("/tmp/hma-pwned")
    finally:
        rem.close()


def test_stuck_drain_escalates_to_down_and_the_action(fresh: SlurmCluster, tmp_path: Path) -> None:
    rem, _store = make(tmp_path, fresh, "node4", {"drain_timeout": 1.0, "replace_mode": "hyperpod"})
    try:
        job = fresh.submit("node4")
        wait(lambda: rem.facts().job_ids == (job,), what="job in facts")
        rem.update(verdict(fault(action=Action.REPLACE)), "boot-1")
        wait(lambda: fresh.node("node4")["reason"] == "Action:Replace", 30, "replace after DOWN")
        assert [k for k, _s in kinds(rem)] == ["drain", "down", "replace"]
        assert "FAIL" in fresh.node("node4")["state_flags"]
        wait_alert(rem, lambda a: a.kind == "action_applied" and job in a.message, "applied")
    finally:
        rem.close()


def _slurm_findings(rem: object) -> list:
    from hma.adapters.command import CommandRunner
    from hma.adapters.files import RootReader
    from hma.contracts.probe import ProbeContext
    from hma.probes.slurm.probe import SlurmProbe

    probe = SlurmProbe()
    c = ProbeContext({}, RootReader("/"), RootReader("/"), CommandRunner(), facts=rem.facts())  # type: ignore[attr-defined]
    return probe.evaluate(probe.collect(c), c)


@pytest.mark.parametrize("adopt", [False, True])
def test_slurm_own_drain_reported_and_adopted(
    fresh: SlurmCluster, tmp_path: Path, adopt: bool
) -> None:
    from hma.contracts.model import Severity
    from hma.health.model import Fault

    fresh.scontrol("update", "NodeName=node3", "State=DRAIN", "Reason=Kill task failed")
    rem, _store = make(tmp_path, fresh, "node3", {"adopt_slurm_drains": adopt, "resume_after": 0.5})
    try:
        wait(lambda: bool(_slurm_findings(rem)), what="probe sees Slurm's drain")
        found = _slurm_findings(rem)[0]
        assert found.code == "SLURM_KILL_TASK_FAILED"
        f = fault(code=found.code, component="node", action=Action.REBOOT)
        assert isinstance(f, Fault) and f.severity is Severity.CRITICAL
        boot1 = fresh.boot_id("node3")
        rem.update(verdict(f, boot=boot1), boot1)
        if not adopt:  # reported only: Slurm's drain and reason stay, nothing is done
            import time

            time.sleep(1.0)
            assert kinds(rem) == []
            assert fresh.node("node3")["reason"] == "Kill task failed"
            return
        wait(lambda: "node3" in fresh.reboots(), 30, "reboot of the adopted node")
        node = fresh.node("node3")
        assert node["reason"].startswith("HMA: SLURM_KILL_TASK_FAILED node")
        wait(lambda: fresh.boot_id("node3") != boot1, what="new boot id")
        wait(lambda: fresh.node("node3")["state"] == "idle", 30, "slurmd back")
        boot2 = fresh.boot_id("node3")
        rem.update(verdict(boot=boot2), boot2)
        wait(lambda: fresh.state("node3") == "IDLE", 30, "resumed")
    finally:
        rem.close()


def test_hyperpod_reboot_mode_sets_fail_action_reboot(fresh: SlurmCluster, tmp_path: Path) -> None:
    rem, _store = make(tmp_path, fresh, "node1", {"reboot_mode": "hyperpod"})
    try:
        before = fresh.reboots().count("node1")
        rem.update(verdict(fault()), "boot-1")
        wait(lambda: fresh.node("node1")["reason"] == "Action:Reboot", what="Action:Reboot")
        node = fresh.node("node1")
        assert "FAIL" in node["state_flags"] and fresh.reboots().count("node1") == before
        assert "hma=unhealthy:GPU_XID_79:reboot" in node["extra"]
        # HyperPod rebooted the node: new boot, healthy -> the agent resumes the FAIL it set
        rem.update(verdict(boot="boot-2"), "boot-2")
        wait(lambda: "FAIL" not in fresh.node("node1")["state_flags"], what="resumed")
        assert back_in_service(fresh, fresh.node("node1"))
    finally:
        rem.close()


# Free text that looks like a record of each -O layout, a field separator, a fake MASTER_ADDR.
FAKE = "node9\x1fidle\x1fx\x1froot\x1f2026-01-01T00:00:00\x1f\x1f\x1fbatch*\x1fevil\x1f6.6.6.6\x1f"
NODE_TEXT = f"ops | bob\n{FAKE}\nMASTER_ADDR=6.6.6.6\x1f"
JOB_TEXT = "run 7\n1\x1froot\x1fRUNNING\x1fNone\x1fnode9\x1fx\x1f1\x1f1\x1f0\x1fN/A\x1f\n|x|"


def test_hostile_node_and_job_text_leaves_every_read_whole(
    fresh: SlurmCluster, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from hma.cluster.slurm.client import SlurmClient
    from hma.commands.srun import job_env
    from tests.integration.remediation_helpers import write_config

    fresh.scontrol("update", "NodeName=node4", "State=DRAIN", f"Reason={NODE_TEXT}")
    fresh.scontrol("update", "NodeName=node1", f"Comment={NODE_TEXT}", f"Extra={NODE_TEXT}")
    job = fresh.submit("node1")
    fresh.scontrol("update", f"JobId={job}", f"Comment={JOB_TEXT}")
    client = SlurmClient(conf=str(fresh.conf), **fresh.agent_slurm())
    four, one = client.node("node4"), client.node("node1")
    assert four.reason == NODE_TEXT and four.drained and four.address == "127.0.0.1"
    assert (one.field("comment"), one.field("extra"), one.address) == (
        NODE_TEXT,
        NODE_TEXT,
        "127.0.0.1",
    )
    assert sorted(n.name for n in client.nodes()) == ["node1", "node2", "node3", "node4"]
    info = client.job_info(job)
    assert (info.note, info.nodes, info.state) == (JOB_TEXT, "node1", "RUNNING")
    values = job_env(client, {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "node1"})
    assert values["MASTER_ADDR"] == "127.0.0.1" and values["NODE_LIST"] == ["node1"]
    rem, _store = make(tmp_path, fresh, "node1")
    try:
        wait(lambda: rem.facts().job_ids == (job,), what="the agent sees the job")
        assert rem.facts().slurm_state == "allocated"
    finally:
        rem.close()
    cfg = write_config(tmp_path / "hma.toml", fresh, "node1")
    out = subprocess.run(
        [sys.executable, "-m", "hma", "fleet", "--json"],
        env={"PATH": "/usr/bin:/bin", "HMA_CONFIG": str(cfg)},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["partitions"][0]["nodes"] == 4


@pytest.mark.timeout(240)
def test_an_operator_s_resume_is_honoured_until_a_new_occurrence(fresh: SlurmCluster) -> None:
    """docs/remediation.md, "An operator's resume": hma drains for an Xid (drain only here), an
    admin resumes the node with the fault still active: not drained again, and said in `hma
    status`, `hma fleet` and the agent's alerts; a new Xid drains it again."""
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) for the stand-in NVML library")
    name = "node3"
    sim = SimNode(fresh, name).build()
    text = sim.config.read_text().replace(  # each Xid its own event: no repeat held back
        "[sources.kernel_log]\n", "[sources.kernel_log]\ndedupe_s = 0.01\n"
    )
    sim.config.write_text(text + '[codes.GPU_XID_79]\naction = "none"\n')

    def inject() -> None:
        res = sim.hma(
            "inject", "xid", "--gpu", sim.gpu_pci(0), "--xid", "79", "--yes-really-drain",
            "--kmsg", str(sim.dev_kmsg),
        )  # fmt: skip
        assert res.returncode == 0, res.stderr

    def drains() -> int:
        return sim.actions().count(("drain", "done"))

    def drained_by_hma() -> bool:
        node = fresh.node(name)
        return "DRAIN" in node["state_flags"] and node["reason"].startswith("HMA: GPU_XID_79 gpu:")

    try:
        sim.start_agent()
        sim.wait(sim.healthy, 60, "a first healthy verdict")
        inject()
        sim.wait(lambda: drains() == 1 and drained_by_hma(), 60, "the drain")
        fresh.scontrol("update", f"NodeName={name}", "State=RESUME")  # an operator
        sim.wait(lambda: ("honour", "done") in sim.actions(), 60, "the resume honoured")
        said = "resumed by an operator while GPU_XID_79 is active; honoured until a new occurrence"
        rem = sim.status()["remediation"]
        assert rem["honoured"] == said and rem["episode"]["honoured"][0][0] == "GPU_XID_79"
        node = fresh.node(name)
        assert "DRAIN" not in node["state_flags"] and "h=operator" in node["extra"]
        assert said in sim.hma("status").stdout
        fleet = sim.hma("fleet")
        assert "resumed by an operator while the fault is active" in fleet.stdout, fleet.stderr
        sim.wait(lambda: said in sim.log.read_text(), 30, "the alert in the agent's log")
        # the same occurrence stays active: later passes (status written again) drain nothing
        seen = float(sim.status()["generated"])
        sim.wait(lambda: float(sim.status()["generated"]) > seen + 3, 30, "later passes")
        assert [f["code"] for f in sim.faults()] == ["GPU_XID_79"] and drains() == 1
        assert "DRAIN" not in fresh.node(name)["state_flags"]
        inject()  # a new occurrence: a new episode, drained again
        sim.wait(lambda: drains() == 2 and drained_by_hma(), 60, "the new occurrence drained")
        assert sim.status()["remediation"]["honoured"] is None
    finally:
        sim.close()


def test_a_forged_label_on_another_node_never_resumes_this_one(
    fresh: SlurmCluster, tmp_path: Path
) -> None:
    """Issue 28: node1 is drained for an active fault; node2 is drained after it with an HMA
    reason, then one ``scontrol update`` of node2's Extra claims it was drained long before
    (``d=``). node1's breaker recheck counts both and keeps node1 drained: only Slurm's record
    (the reason times) orders the drains."""
    limits = {"max_drained_percent": 25.0}  # 4 nodes: one may be held
    rem, _store = make(tmp_path, fresh, "node1", limits, {"heartbeat": 1.0})
    rechecks: list[tuple[object, object]] = []
    real = rem.applier.recheck

    def recheck() -> object:
        before = rem.breaker.last
        out = real()
        if rem.breaker.last is not before:  # this recheck counted
            rechecks.append((rem.breaker.last, out))
        return out

    rem.applier.recheck = recheck  # type: ignore[method-assign]
    try:
        rem.update(verdict(fault(action=Action.NONE, clears=Clears.OBSERVATION)), "boot-1")
        wait(lambda: "DRAIN" in fresh.state("node1"), what="drain")
        wait(lambda: ",d=" in fresh.node("node1")["extra"], what="node1's label")
        fresh.scontrol("update", "NodeName=node2", "State=DRAIN", f"Reason={REASON}")
        forged = "hma=unhealthy:GPU_XID_79:none,d=1000000000.000"
        fresh.scontrol("update", "NodeName=node2", f"Extra={forged}")
        wait(
            lambda: any("node2" in c.held for c, _out in rechecks),  # type: ignore[attr-defined]
            30,
            "a recheck that counts node2",
        )
        count, undone = next((c, o) for c, o in rechecks if "node2" in c.held)  # type: ignore[attr-defined]
        assert undone is None and count.held == ("node1", "node2")  # type: ignore[attr-defined]
        node = fresh.node("node1")
        assert "DRAIN" in node["state_flags"] and node["reason"] == REASON
        assert "h=breaker" not in node["extra"]
        assert rem.status()["breaker"]["held_nodes"] == ["node1", "node2"]
    finally:
        rem.close()


def test_fleet_renders_every_node_whatever_one_label_holds(
    fresh: SlurmCluster, tmp_path: Path
) -> None:
    """Issue 28: labels with ``t=nan``, ``t=inf``, ``t=1e300`` and a negative ``d=`` on three
    nodes of the real Slurm: ``hma fleet`` and ``--json`` exit 0 and list every node, those three
    with their label unreadable."""
    import subprocess
    import sys

    from tests.integration.remediation_helpers import write_config

    bad = {"node2": "t=nan", "node3": "t=1e300", "node4": "d=-1764410041.250"}
    for name, field in bad.items():
        fresh.scontrol("update", f"NodeName={name}", f"Extra=hma=unhealthy:GPU_XID_79:none,{field}")
    fresh.scontrol("update", "NodeName=node1", "Extra=hma=unhealthy:GPU_XID_79:none,t=inf")
    bad["node1"] = "t=inf"
    cfg = write_config(tmp_path / "hma.toml", fresh, "node1")
    outs = [
        subprocess.run(
            [sys.executable, "-m", "hma", "fleet", *args],
            env={"PATH": "/usr/bin:/bin", "HMA_CONFIG": str(cfg)},
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        for args in (["--json"], [])
    ]
    assert [o.returncode for o in outs] == [0, 0], [o.stderr for o in outs]
    rows = {r["node"]: r for r in json.loads(outs[0].stdout)["nodes"]}
    assert set(rows) == set(bad) and all(r["label"] == "unreadable" for r in rows.values())
    assert all(f"{name} " in outs[1].stdout for name in bad)
    assert outs[1].stdout.count("label unreadable") == len(bad)
