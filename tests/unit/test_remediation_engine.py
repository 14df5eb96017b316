"""Remediation decisions with a stand-in Slurm client (the outermost boundary) and the real store.

The same flows run against the real Slurm in tests/integration; these cover the rules that need
odd Slurm states or many reboots, and run anywhere (no Slurm installed).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import pytest

from hma import assembly
from hma.cluster.slurm.backend import SlurmBackend
from hma.cluster.slurm.client import SlurmClient
from hma.cluster.slurm.parse import SlurmError
from hma.cluster.slurm.parse import SlurmNodeState as NodeState
from hma.commands import fleet, status
from hma.contracts.cluster import Job
from hma.contracts.model import Action, Clears
from hma.health.model import Fault, Verdict
from hma.health.store import Store
from hma.remediation.engine import Remediator
from tests.faults import fault
from tests.unit.test_slurm_hostile_text import Slurm, client, node

pytestmark = pytest.mark.timeout(30)

STATUS_DOC = Path(__file__).resolve().parent.parent / "fixtures" / "status" / "hostile.json"


class FakeSlurm(SlurmClient):
    """In-memory Slurm: node states plus a log of every write."""

    def __init__(self, *names: str) -> None:
        super().__init__(scontrol=["/bin/true"])
        self.state = {n: NodeState(n, "idle", partitions=("gpu",)) for n in names}
        self.calls: list[tuple[Any, ...]] = []
        self.reads: list[str] = []  # node reads: a node name, "held" (breaker) or "all"
        self.job_reads = 0
        self.down = False

    def nodes(self, names: Any = (), partitions: Any = (), states: Any = ()) -> list[NodeState]:
        if self.down:
            raise SlurmError("Unable to contact slurm controller (connect failure)")
        self.reads.append("held" if states else ",".join(names) or "all")
        found = [self.state[n] for n in (names or sorted(self.state))]
        return [n for n in found if not states or n.out_of_service]

    def partition_size(self, partitions: Any) -> int:
        return len(self.state)

    def jobs(self, node: str) -> list[Job]:
        self.job_reads += 1  # the local slurmd: no controller query
        return []

    def update(self, node: str, **fields: str) -> None:
        if self.down:
            raise SlurmError("Unable to contact slurm controller (connect failure)")
        self.calls.append(("update", node, dict(fields)))
        n = self.state[node]
        flags = set(n.flags)
        state = fields.get("State")
        if state == "DRAIN":
            flags.add("DRAIN")
        elif state == "RESUME":
            flags -= {"DRAIN", "FAIL"}
        elif state == "FAIL":
            flags.add("FAIL")
        reason = fields.get("Reason", "" if state == "RESUME" else n.reason)
        self.state[node] = replace(
            n.with_field("extra", fields.get("Extra", n.field("extra"))),
            flags=frozenset(flags),
            reason=reason,
            reason_time=time.time() if "Reason" in fields else n.reason_time,
        )

    def reboot(self, node: str, reason: str) -> None:
        self.calls.append(("reboot", node, reason))
        n = self.state[node]
        self.state[node] = replace(n, flags=n.flags | {"REBOOT_REQUESTED"})


def make(
    tmp: Path,
    fake: FakeSlurm,
    node: str = "n1",
    slurm: Optional[dict[str, float]] = None,
    start: bool = False,
    **recovery: Any,
) -> Remediator:
    rec = {"recheck_interval": 0.1, "resume_after": 0.0, "min_reboot_interval": 0.0}
    # evidence bundles read no kernel log and no Slurm of this machine
    rec.update({"evidence_kernel_log": [], "evidence_node_record": [], **recovery})
    lines = [
        "[agent]",
        f'state_dir = "{tmp}/state"',
        f'run_dir = "{tmp}/run"',
        f'probes_dir = "{tmp}/probes.d"',
        "[slurm]",
        f'node_name = "{node}"',
        *(f"{key} = {value!r}" for key, value in (slurm or {}).items()),
        "[recovery]",
    ]
    for key, value in rec.items():
        lines.append(
            f"{key} = {repr(value).lower() if isinstance(value, bool) else repr(value)}".replace(
                "'", '"'
            )
        )
    (tmp / "hma.toml").write_text("\n".join(lines) + "\n")
    setup = assembly.load(str(tmp / "hma.toml"))
    backend = SlurmBackend(
        setup.config.section("slurm"), setup.config.section("recovery")["label_field"], fake
    )
    return Remediator(setup, Store(str(tmp / "state" / "state.db")), start=start, backend=backend)


def run(rem: Remediator, faults: tuple[Fault, ...], boot: str = "b1") -> None:
    assert isinstance(rem.backend, SlurmBackend)
    fake = rem.backend.client
    assert isinstance(fake, FakeSlurm)
    if boot != getattr(fake, "boot", "b1"):  # the node came back from a reboot
        for name, n in fake.state.items():
            fake.state[name] = replace(n, flags=n.flags - {"REBOOT_REQUESTED"})
    fake.boot = boot  # type: ignore[attr-defined]
    rem.update(Verdict(time.time(), boot, faults), boot)
    rem.flush(5)


def writes(fake: FakeSlurm) -> list[str]:
    return [c[0] if c[0] == "reboot" else str(c[2].get("State", "label")) for c in fake.calls]


def test_automatic_drain_reboot_resume(tmp_path: Path) -> None:
    fake = FakeSlurm("n1", "n2", "n3", "n4")
    rem = make(tmp_path, fake)
    run(rem, (fault(),))
    assert writes(fake) == ["DRAIN", "reboot"]
    assert fake.state["n1"].reason == "HMA: GPU_XID_79 gpu:0000:3b:00"
    run(rem, (fault(),))  # same boot: nothing more
    assert writes(fake) == ["DRAIN", "reboot"]
    run(rem, (), boot="b2")  # back, healthy
    assert writes(fake)[-1] == "RESUME" and "DRAIN" not in fake.state["n1"].flags
    assert "hma=recovered:GPU_XID_79:reboot" in fake.state["n1"].field("extra")
    assert rem.status()["reboots"] == {"GPU_XID_79 gpu:0000:3b:00": 1}


def test_escalates_to_replace_after_max_reboots(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, max_reboots=2, replace_mode="hyperpod", max_drained_percent=100.0)
    for boot in ("b1", "b2"):
        run(rem, (fault(),), boot=boot)
    assert writes(fake).count("reboot") == 2
    run(rem, (fault(),), boot="b3")
    assert fake.state["n1"].reason == "Action:Replace" and "FAIL" in fake.state["n1"].flags
    assert "hma=unhealthy:GPU_XID_79:replace" in fake.state["n1"].field("extra") and ",r=2" in (
        fake.state["n1"].field("extra")
    )


def test_fault_carried_over_the_reboot_waits_for_its_probe(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, max_drained_percent=100.0)
    lost = replace(fault(code="GPU_LOST"), clears=Clears.OBSERVATION)
    run(rem, (lost,), boot="b1")
    assert writes(fake) == ["DRAIN", "reboot"]
    # the agent starts on the new boot with the fault from before: no new evidence, no reboot
    run(rem, (lost,), boot="b2")
    assert writes(fake).count("reboot") == 1
    # its probe sees it again on this boot: the second reboot
    run(rem, (replace(lost, last_seen=time.time() + 1.0),), boot="b2")
    assert writes(fake).count("reboot") == 2


def test_reboot_rate_limit_holds(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, min_reboot_interval=3600.0, max_drained_percent=100.0)
    run(rem, (fault(),), boot="b1")
    run(rem, (fault(),), boot="b2")
    assert writes(fake).count("reboot") == 1
    status = rem.status()
    assert status["held"].startswith("rate") and ("reboot", "held") in [
        (r["kind"], r["state"]) for r in status["actions"]
    ]
    assert "h=rate" in fake.state["n1"].field("extra")


def test_state_not_understood_does_nothing(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    fake.state["n1"] = replace(fake.state["n1"], flags=frozenset({"BRAND_NEW_FLAG"}))
    rem = make(tmp_path, fake)
    run(rem, (fault(),))
    assert fake.calls == []
    assert "not understood" in rem.status()["held"]


def test_dry_run_and_policy_none(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    (tmp_path / "a").mkdir()
    rem = make(tmp_path / "a", fake, dry_run=True)
    run(rem, (fault(action=Action.REPLACE),))
    assert fake.calls == []
    assert [(r["kind"], r["state"]) for r in rem.status()["actions"]] == [
        ("drain", "dry_run"),
        ("replace", "dry_run"),
    ]
    (tmp_path / "b").mkdir()
    rem = make(tmp_path / "b", fake, policy="none")
    run(rem, (fault(),))
    assert writes(fake) == ["label"] and "h=policy" in fake.state["n1"].field("extra")
    run(rem, ())
    assert fake.state["n1"].field("extra") == "" and "DRAIN" not in fake.state["n1"].flags


def test_outage_retries_with_backoff_then_applies(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, retry_min=0.05, retry_max=0.1)
    fake.down = True
    run(rem, (fault(action=Action.NONE),))
    row = rem.status()["actions"][0]
    assert row["state"] == "failed" and "contact" in row["last_error"] and row["attempts"] == 1
    assert [a.kind for a in rem.alerts()] == ["action_requested", "action_failed"]
    fake.down = False
    time.sleep(0.1)
    rem.flush(5)
    assert rem.status()["actions"][0]["state"] == "done"
    assert writes(fake) == ["DRAIN"]


def test_seeds_reboot_count_from_label_after_wiped_disk(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    now = int(time.time())
    fake.state["n1"] = replace(
        fake.state["n1"],
        texts=(("extra", f"hma=recovered:GPU_XID_79:reboot,c=gpu:0000:3b:00,t={now},r=2"),),
    )
    rem = make(tmp_path, fake, replace_mode="hyperpod")
    rem.refresh()
    run(rem, (fault(),))
    assert "reboot" not in writes(fake)  # 2 reboots already: straight to replace
    assert fake.state["n1"].reason == "Action:Replace"


def test_missing_hook_is_a_config_error(tmp_path: Path) -> None:
    from hma.config.schema import ConfigError

    with pytest.raises(ConfigError, match="reboot_command"):
        make(tmp_path, FakeSlurm("n1"), reboot_mode="command")


def test_drain_that_raced_past_the_recount_undoes_itself(tmp_path: Path) -> None:
    fake = FakeSlurm("n1", "n2", "n3", "n4")
    rem = make(tmp_path, fake, max_drained_percent=25.0)
    run(rem, (fault(action=Action.NONE),))
    assert "DRAIN" in fake.state["n1"].flags
    # n2 was drained by its agent a moment *earlier* (Slurm's reason time), visible only now
    fake.state["n2"] = replace(
        fake.state["n2"],
        flags=frozenset({"DRAIN"}),
        reason="HMA: GPU_XID_79 gpu:0000:3b:00",
        reason_time=fake.state["n1"].reason_time - 1,
        texts=(("extra", "hma=unhealthy:GPU_XID_79:none"),),
    )
    rem.worker.recheck()  # what the worker does every recheck_interval
    rem.flush(5)
    assert "DRAIN" not in fake.state["n1"].flags and "h=breaker" in fake.state["n1"].field("extra")
    assert rem.status()["held"].startswith("breaker")
    assert [a.code for a in rem.alerts()].count("HMA_BREAKER_OPEN") == 1


def test_a_forged_drain_time_on_another_node_never_undoes_this_drain(tmp_path: Path) -> None:
    """Issue 28: n2, drained after n1 by Slurm's record, gets an earlier ``d=`` written into its
    Extra; n1's recheck keeps n1 drained (its fault is still active)."""
    fake = FakeSlurm("n1", "n2", "n3", "n4")
    rem = make(tmp_path, fake, max_drained_percent=25.0)
    run(rem, (fault(action=Action.NONE),))
    assert "DRAIN" in fake.state["n1"].flags
    fake.state["n2"] = replace(
        fake.state["n2"],
        flags=frozenset({"DRAIN"}),
        reason="HMA: GPU_XID_79 gpu:0000:3b:00",
        reason_time=fake.state["n1"].reason_time + 5,
        texts=(("extra", "hma=unhealthy:GPU_XID_79:none,d=1000000000.000"),),
    )
    rem.worker.recheck()
    rem.flush(5)
    assert "DRAIN" in fake.state["n1"].flags and "h=breaker" not in fake.state["n1"].field("extra")
    assert rem.applier.breaker.last is not None and rem.applier.breaker.last.held == ("n1", "n2")


def test_drain_found_in_slurm_without_state_is_resumed_when_healthy(tmp_path: Path) -> None:
    fake = FakeSlurm("n1", "n2")
    fake.state["n1"] = replace(
        fake.state["n1"],
        flags=frozenset({"DRAIN"}),
        reason="HMA: GPU_XID_79 gpu:0000:3b:00 : reboot issued",
        texts=(("extra", "rack=1 hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00"),),
    )
    fake.state["n2"] = replace(
        fake.state["n2"], texts=(("extra", "hma=unhealthy:GPU_XID_79:reboot"),)
    )
    rem = make(tmp_path, fake)  # a fresh state database (the disk was wiped)
    rem.refresh()
    run(rem, ())
    assert "DRAIN" not in fake.state["n1"].flags and fake.state["n1"].field("extra") == "rack=1"
    assert (
        fake.state["n2"].field("extra") == "hma=unhealthy:GPU_XID_79:reboot"
    )  # n1's agent: only n1
    (tmp_path / "b").mkdir()
    rem2 = make(tmp_path / "b", fake, "n2")
    rem2.refresh()
    run(rem2, ())
    assert fake.state["n2"].field("extra") == ""


def test_stale_facts_after_the_resume_are_not_taken_up(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, max_drained_percent=100.0)
    rem.refresh()
    run(rem, (replace(fault(action=Action.NONE), clears=Clears.OBSERVATION),))
    assert writes(fake) == ["DRAIN"]
    drained = fake.state["n1"]
    rem.update(Verdict(time.time(), "b1", ()), "b1")  # healthy: the resume is planned
    while rem.process_due():  # ... and applied, the episode closed
        pass
    assert writes(fake)[-1] == "RESUME" and "DRAIN" not in fake.state["n1"].flags
    # Slurm facts fetched just before the resume arrive after it: still drained by hma
    resumed, fake.state["n1"] = fake.state["n1"], drained
    rem.refresh()
    fake.state["n1"] = resumed
    rem.flush(5)
    assert writes(fake).count("RESUME") == 1
    assert [r["kind"] for r in rem.status()["actions"]] == ["drain", "resume"]


def test_each_queued_alert_wakes_the_owner(tmp_path: Path) -> None:
    """The daemon sleeps until remediation says it queued alerts (no polling)."""
    fake = FakeSlurm("n1")
    rem = make(tmp_path, fake, retry_min=0.05, retry_max=0.1)
    told: list[int] = []
    rem.on_alert = lambda: told.append(1)
    fake.down = True
    run(rem, (fault(action=Action.NONE),))
    assert [a.kind for a in rem.alerts()] == ["action_requested", "action_failed"]
    assert len(told) == 2


def test_controller_is_asked_once_per_heartbeat_while_nothing_happens(tmp_path: Path) -> None:
    fake = FakeSlurm("n1", "n2")
    fast = {"heartbeat": 3600.0, "facts_interval": 0.02}
    rem = make(tmp_path, fake, slurm=fast, start=True)
    try:
        wait_for(lambda: fake.job_reads >= 10, "jobs read from the local slurmd")
        assert fake.reads == ["n1"]  # one single-node read at start, none since
        rem.update(Verdict(time.time(), "b1", (fault(action=Action.NONE),)), "b1")
        wait_for(lambda: "DRAIN" in fake.state["n1"].flags, "drain")
        assert (
            "held" in fake.reads and "all" not in fake.reads
        )  # the breaker counted once, filtered
        before = len(fake.reads)
        wait_for(lambda: len(fake.reads) >= before + 3, "node watched while the episode is open")
        assert set(fake.reads[before:]) <= {"n1", "held"}  # single-node reads (+ breaker recheck)
        rem.update(Verdict(time.time(), "b1", ()), "b1")
        wait_for(lambda: rem.status()["episode"] is None, "resumed")
        settled = len(fake.reads)
        jobs = fake.job_reads
        wait_for(lambda: fake.job_reads >= jobs + 10, "jobs still read locally")
        assert len(fake.reads) <= settled + 1  # back to the heartbeat (one read may be in flight)
    finally:
        rem.close()


def wait_for(predicate: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Timeline(FakeSlurm):
    """FakeSlurm that records node reads and writes in one order."""

    def __init__(self, *names: str) -> None:
        super().__init__(*names)
        self.timeline: list[str] = []

    def nodes(self, names: Any = (), partitions: Any = (), states: Any = ()) -> list[NodeState]:
        self.timeline.append("read " + ("held" if states else ",".join(names) or "all"))
        return super().nodes(names, partitions, states)

    def update(self, node: str, **fields: str) -> None:
        self.timeline.append(f"update {fields.get('State', 'label')}")
        super().update(node, **fields)


@pytest.mark.parametrize(
    "ahead, fresh_s, first",
    [(True, 30.0, "update DRAIN"), (False, 30.0, "read n1"), (True, 0.0, "read n1")],
)
def test_read_ahead_stands_for_the_drains_own_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: bool, fresh_s: float, first: str
) -> None:
    """A read ahead (the daemon asks when a fault that drains at once arrives) saves the
    drain its own read, only while it is fresh."""
    from hma.remediation import actions

    monkeypatch.setattr(actions, "FRESH_S", fresh_s)
    fake = Timeline("n1", "n2", "n3", "n4")
    rem = make(tmp_path, fake, slurm={"heartbeat": 3600.0, "facts_interval": 60.0}, start=True)
    try:
        wait_for(lambda: rem.facts().job_running is not None, "facts at start")
        if ahead:
            rem.read_ahead()
            wait_for(lambda: rem.applier.ahead is not None, "read ahead")
            rem.read_ahead()  # at most once per facts_interval
        reads = len(fake.timeline)
        rem.update(Verdict(time.time(), "b1", (fault(action=Action.NONE),)), "b1")
        wait_for(lambda: "DRAIN" in fake.state["n1"].flags, "drain")
        assert fake.timeline[reads] == first
        assert fake.timeline[:reads].count("read n1") == (2 if ahead else 1)
    finally:
        rem.close()


def test_state_reset_keeps_a_drain_whose_reboot_is_owed(tmp_path: Path) -> None:
    """Issue 23: a reboot asked for and not done yet in this boot survives the loss of state."""
    fake = FakeSlurm("n1")
    drained = time.time() - 60  # after this machine booted (/proc/stat btime)
    fake.state["n1"] = replace(
        fake.state["n1"],
        flags=frozenset({"DRAIN"}),
        reason="HMA: GPU_XID_79 gpu:0000:3b:00 : reboot issued",
        reason_time=drained,
        texts=(
            (
                "extra",
                f"hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t={int(drained)},d={drained:.3f}",
            ),
        ),
    )
    rem = make(tmp_path, fake)  # a fresh state database: the Xid is forgotten
    rem.refresh()
    for _ in range(3):
        run(rem, ())
    assert "DRAIN" in fake.state["n1"].flags and "reboot" not in writes(fake)
    assert ",h=repair" in fake.state["n1"].field("extra") and rem.status()["held"].startswith(
        "repair"
    )
    assert "action_held" in [a.kind for a in rem.alerts()]
    run(rem, (), boot="b2")  # rebooted, healthy
    assert writes(fake)[-1] == "RESUME" and "DRAIN" not in fake.state["n1"].flags


def test_state_reset_with_a_forged_label_holds_and_never_reboots(tmp_path: Path) -> None:
    fake = FakeSlurm("n1")
    fake.state["n1"] = replace(
        fake.state["n1"],
        flags=frozenset({"DRAIN"}),
        reason="HMA: GPU_XID_79 gpu:0000:3b:00",
        reason_time=time.time() - 60,
        texts=(("extra", "hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t=1;reboot"),),
    )
    rem = make(tmp_path, fake, max_drained_percent=100.0)
    rem.refresh()
    run(rem, ())
    run(rem, (fault(),))  # even a fault hma sees itself: nothing until someone lets go
    run(rem, (), boot="b2")
    assert "DRAIN" in fake.state["n1"].flags and "reboot" not in writes(fake)
    assert ",h=label" in fake.state["n1"].field("extra") and rem.status()["held"].startswith(
        "label"
    )


def test_an_operator_s_resume_is_honoured_until_a_new_occurrence(tmp_path: Path) -> None:
    fake = FakeSlurm("n1", "n2", "n3", "n4")
    fake.state["n1"] = replace(fake.state["n1"], base="mixed")  # a job: the reboot waits
    rem = make(tmp_path, fake)
    seen = round(time.time()) - 5.0
    xid = fault(first=seen, last=seen)
    run(rem, (xid,))
    assert writes(fake) == ["DRAIN"] and rem.status()["episode"]["id"] == 1
    fake.update("n1", State="RESUME")  # an operator: scontrol update state=resume
    fake.state["n1"] = replace(fake.state["n1"], base="idle")  # the job ended
    rem.refresh()
    run(rem, (xid,))
    ep = rem.status()["episode"]
    assert ep["honoured"] == [["GPU_XID_79", "gpu:0000:3b:00", seen]] and ep["owned"] is False
    extra = fake.state["n1"].field("extra")
    assert "hma=unhealthy:GPU_XID_79:reboot" in extra and "h=operator" in extra
    said = [a.message for a in rem.alerts()]
    assert any(
        "resumed by an operator while GPU_XID_79 is active; honoured until a new occurrence" in m
        for m in said
    ), said
    doc = json.loads(STATUS_DOC.read_text("utf-8"))
    text = status.render({**doc, "remediation": rem.status()}, now=time.time())
    assert "OPERATOR'S RESUME: resumed by an operator while GPU_XID_79 is active; honoured" in text
    fleet_doc = fleet.collect(
        client(Slurm([node("n1", StateComplete="idle", Extra=extra, Reason="none")])),
        "extra",
        10.0,
        None,
    )
    assert fleet_doc["nodes"][0]["held"] == "operator"
    assert "resumed by an operator while the fault is active" in fleet.render_text(fleet_doc)
    for _ in range(2):  # the same occurrence: no drain, no reboot again
        rem.refresh()
        run(rem, (replace(xid, count=2),))
    assert writes(fake) == ["DRAIN", "RESUME", "label"]  # the operator's resume, hma's label
    assert "DRAIN" not in fake.state["n1"].flags
    rem.refresh()
    run(rem, (replace(xid, last_seen=seen + 1),))  # a new Xid: a new episode acts again
    assert writes(fake)[:4] == ["DRAIN", "RESUME", "label", "DRAIN"] and "reboot" in writes(fake)
    assert rem.status()["episode"]["id"] == 2 and "honoured" not in rem.status()["episode"]
