"""Table tests of the pure remediation planner: episode, verdict, node state, policy, now in;
episode and intents out (no store, no cluster)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import pytest

from hma.contracts.cluster import NodeState
from hma.contracts.model import Action, Clears
from hma.health.model import Fault, Verdict
from hma.remediation.planner import (
    Acted,
    Cancel,
    Enqueue,
    Episode,
    Plan,
    Policy,
    Reboot,
    Situation,
    plan,
    reason_for,
)
from tests import faults

NOW = 1_800_000_000.0
XID79 = ("GPU_XID_79", "gpu:0000:3b:00")


def fault(action: Action = Action.REBOOT, **given: Any) -> Fault:
    """The shared test fault on this module's clock: first seen 5 s before NOW."""
    return faults.fault(action=action, **{"first": NOW - 5, "last": NOW, **given})


def node(base: str = "idle", *flags: str, reason: str = "", extra: str = "") -> NodeState:
    return NodeState("n1", base, frozenset(flags), reason, NOW - 60, texts=(("", extra),))


def episode(**changes: object) -> Episode:
    ep = Episode(1, *XID79, action="reboot", since=NOW - 5, reason="HMA: GPU_XID_79 gpu:0000:3b:00")
    return replace(ep, **changes)  # type: ignore[arg-type]


def decide(
    ep: Optional[Episode],
    faults: tuple[Fault, ...] = (),
    n: Optional[NodeState] = None,
    policy: Optional[Policy] = None,
    stale_checked: bool = True,
    **situation: object,
) -> Plan:
    s = Situation(NOW, Verdict(NOW, "b1", faults), n or node(), boot_id="b1", **situation)  # type: ignore[arg-type]
    return plan(ep, 1 if ep else 0, s, policy or Policy(), stale_checked)


def kinds(result: Plan) -> list[str]:
    return [
        f"{i.kind}@{i.key}" if isinstance(i, Enqueue) else f"cancel#{i.row_id}"
        for i in result.intents
    ]


@pytest.mark.parametrize(
    "ep, faults, n, policy, want",
    [
        # a new fault: a new episode and its drain (label only under policy none)
        (None, (fault(),), node(), Policy(), ["drain@ep1:drain"]),
        (None, (fault(),), node(), Policy(automatic=False), ["label@ep1:label"]),
        # drained by hma and idle: the recovery step of the action
        (
            episode(owned=True),
            (fault(),),
            node("idle", "DRAIN"),
            Policy(),
            ["reboot@ep1:reboot:b1"],
        ),
        (
            episode(owned=True, action="replace"),
            (fault(Action.REPLACE),),
            node("idle", "DRAIN"),
            Policy(),
            ["replace@ep1:replace"],
        ),
        # still draining: wait, until drain_timeout passes: set it down
        (
            episode(owned=True, drained_at=NOW - 10),
            (fault(),),
            node("mixed", "DRAIN"),
            Policy(),
            [],
        ),
        (
            episode(owned=True, drained_at=NOW - 4000),
            (fault(),),
            node("mixed", "DRAIN"),
            Policy(),
            ["down@ep1:down"],
        ),
        # rebooted in this boot: wait for the reboot; a replace waits for a human
        (
            episode(owned=True, acted=Acted("reboot", "b1", NOW)),
            (fault(),),
            node("idle", "DRAIN"),
            Policy(),
            [],
        ),
        (
            episode(owned=True, acted=Acted("replace", "b0", NOW)),
            (fault(),),
            node("idle", "DRAIN"),
            Policy(),
            [],
        ),
        # someone else holds the node: nothing; once they let go, hma drains it
        (episode(owned=False), (fault(),), node("idle", "DRAIN", reason="admin"), Policy(), []),
        (episode(owned=False), (fault(),), node(), Policy(), [f"drain@ep1:drain:{int(NOW)}"]),
        # healthy: resume after resume_after (at once when never drained)
        (episode(owned=True, healthy_since=NOW - 10), (), node("idle", "DRAIN"), Policy(), []),
        (
            episode(owned=True, healthy_since=NOW - 200),
            (),
            node("idle", "DRAIN"),
            Policy(),
            ["resume@ep1:resume"],
        ),
        (episode(owned=None), (), node(), Policy(), ["resume@ep1:resume"]),
        # Slurm's own drains are only acted on when adopted
        (
            None,
            (fault(code="SLURM_NODE_DRAINED_KILL_TASK"),),
            node(),
            Policy(scheduler_codes=frozenset({"SLURM_NODE_DRAINED_KILL_TASK"})),
            [],
        ),
        (
            None,
            (fault(code="SLURM_NODE_DRAINED_KILL_TASK"),),
            node(),
            Policy(
                adopt_slurm_drains=True,
                scheduler_codes=frozenset({"SLURM_NODE_DRAINED_KILL_TASK"}),
            ),
            ["drain@ep1:drain"],
        ),
    ],
)
def test_rules(
    ep: Optional[Episode], faults: tuple[Fault, ...], n: NodeState, policy: Policy, want: list[str]
) -> None:
    assert kinds(decide(ep, faults, n, policy)) == want


def test_new_episode_records_the_fault_and_jobs() -> None:
    result = decide(None, (fault(),), jobs=(("7", "alice"), ("8", "bob")))
    ep = result.episode
    assert ep is not None and result.seq == 1
    assert (ep.code, ep.component, ep.action, ep.jobs, ep.users) == (
        *XID79,
        "reboot",
        ("7", "8"),
        ("alice", "bob"),
    )
    assert ep.reason == reason_for(fault()) == "HMA: GPU_XID_79 gpu:0000:3b:00"


def test_reboots_beyond_max_become_replace() -> None:
    reboots = tuple(Reboot(*XID79, NOW - 100 * i) for i in range(1, 3))
    result = decide(None, (fault(),), reboots=reboots)
    assert result.episode is not None and result.episode.action == "replace"
    old = tuple(Reboot(*XID79, NOW - 8 * 86400) for _ in range(2))  # outside reboot_window
    assert decide(None, (fault(),), reboots=old).episode.action == "reboot"  # type: ignore[union-attr]


def test_auto_resume_job_hit_gets_replace() -> None:
    result = decide(None, (fault(),), jobs=(("7", "alice"),), auto_resume_jobs=frozenset({"7"}))
    assert result.episode is not None and result.episode.action == "replace"


def test_stronger_fault_relabels_and_takes_over_the_episode() -> None:
    ue = fault(Action.REPLACE, code="GPU_ROW_REMAP_FAILURE")
    result = decide(episode(owned=None), (fault(), ue), open_rows=((4, "drain"),))
    assert kinds(result) == ["label@ep1:label:replace"]  # the open drain is left to finish
    assert result.episode is not None and result.episode.code == "GPU_ROW_REMAP_FAILURE"


def test_fault_back_while_resuming_cancels_the_resume() -> None:
    ep = episode(owned=True, phase="resuming", healthy_since=NOW - 300)
    result = decide(ep, (fault(),), node("idle", "DRAIN"), open_rows=((9, "resume"),))
    assert [i for i in result.intents if isinstance(i, Cancel)] == [
        Cancel(9, "the fault came back")
    ]
    assert result.episode is not None and result.episode.phase == "open"


def test_healthy_cancels_open_steps_before_resuming() -> None:
    ep = episode(owned=True, healthy_since=NOW - 300)
    result = decide(ep, (), node("idle", "DRAIN"), open_rows=((5, "reboot"),))
    assert kinds(result) == ["cancel#5", "resume@ep1:resume"]


def test_resume_hold_keeps_an_owned_drain() -> None:
    ep = episode(owned=True, healthy_since=NOW - 300)
    held = decide(ep, (), node("idle", "DRAIN"), resume_hold="deep check pending")
    assert kinds(held) == [] and held.episode is not None and held.episode.phase == "open"


def test_fault_carried_over_a_reboot_waits_for_its_probe() -> None:
    ep = episode(owned=True, acted=Acted("reboot", "b0", NOW - 600))
    seen_before = fault(clears=Clears.OBSERVATION, last=NOW - 300)
    assert kinds(decide(ep, (seen_before,), node("idle", "DRAIN"), boot_since=NOW - 60)) == []
    seen_again = fault(clears=Clears.OBSERVATION, last=NOW)
    want = ["reboot@ep1:reboot:b1"]
    assert kinds(decide(ep, (seen_again,), node("idle", "DRAIN"), boot_since=NOW - 60)) == want


def test_dry_run_decides_every_step_at_once() -> None:
    result = decide(None, (fault(),), policy=Policy(dry_run=True))
    assert kinds(result) == ["drain@ep1:drain", "reboot@ep1:reboot:b1"]
    ep = result.episode
    assert ep is not None and ep.owned and ep.acted == Acted("reboot", "b1", NOW)


def test_stale_drain_in_slurm_is_taken_up_once() -> None:
    drained = node("idle", "DRAIN", reason="HMA: GPU_XID_79 gpu:0000:3b:00")
    result = decide(None, (), drained, stale_checked=False)
    ep = result.episode
    assert ep is not None and ep.stale and ep.owned and (ep.code, ep.component) == XID79
    assert result.stale_checked and kinds(result) == []  # healthy_since starts now
    assert decide(None, (), drained, stale_checked=True).episode is None


def test_episode_json_round_trip() -> None:
    ep = episode(owned=True, acted=Acted("reboot", "b1", NOW), adopted="Kill task failed")
    assert Episode.from_json(ep.to_json()) == ep
    assert "stale" not in ep.to_json() and Episode.from_json({"id": 2}).phase == "open"


def test_plan_does_not_change_its_input() -> None:
    ep = episode(owned=True)
    before = ep.to_json()
    decide(ep, (fault(),), node("idle", "DRAIN"))
    assert ep.to_json() == before


# A drain hma owns, found in Slurm without a record (state reset): what its label says it owes.
OWED = f"hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t={NOW - 90:.0f},r=1,d={NOW - 60:.3f}"


def owned_drain(extra: str) -> NodeState:
    return node(
        "idle", "DRAIN", reason="HMA: GPU_XID_79 gpu:0000:3b:00 : reboot issued", extra=extra
    )


def after_reset(
    n: NodeState, faults: tuple[Fault, ...] = (), boot: str = "b1", booted: float = NOW - 3600
) -> Plan:
    """Plan at start with no episode (healthy: the fault was forgotten), then once more later
    with ``faults`` on the episode it took up."""
    policy = Policy(resume_after=0.0)
    first = plan(
        None, 0, Situation(NOW, Verdict(NOW, "b1", ()), n, boot_id="b1", booted=booted), policy
    )
    s = Situation(NOW + 600, Verdict(NOW + 600, boot, faults), n, boot_id=boot, booted=booted)
    return plan(first.episode, first.seq, s, policy, True)


def test_reset_keeps_a_drain_whose_reboot_is_owed_in_this_boot() -> None:
    result = after_reset(owned_drain(OWED))
    ep = result.episode
    assert ep is not None and ep.held == "repair" and ep.action == "reboot" and ep.owned
    assert ep.acted == Acted("reboot", "b1", NOW - 60) and kinds(result) == []
    first = plan(
        None,
        0,
        Situation(NOW, Verdict(NOW, "b1", ()), owned_drain(OWED), boot_id="b1", booted=NOW - 3600),
        Policy(),
    )
    assert kinds(first) == ["hold@ep1:hold"]
    # the fault seen again in the same boot: no second reboot
    assert kinds(after_reset(owned_drain(OWED), (fault(),))) == []
    # Slurm says the reboot is still pending: the same, whatever the boot time says
    pending = replace(owned_drain(OWED), flags=frozenset({"DRAIN", "REBOOT_REQUESTED"}))
    assert after_reset(pending, booted=NOW).episode.held == "repair"  # type: ignore[union-attr]


def test_reset_resumes_after_a_new_boot_and_a_healthy_cycle() -> None:
    assert kinds(after_reset(owned_drain(OWED), boot="b2")) == ["resume@ep1:resume"]
    # booted after the drain (the reboot happened before the state was lost): the usual rules
    ep = after_reset(owned_drain(OWED), booted=NOW - 30).episode
    assert ep is not None and not ep.held and ep.phase == "resuming"


@pytest.mark.parametrize(
    "extra",
    [
        "hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,t=oops",  # garbled
        "hma=unhealthy:GPU_XID_79",  # cut
        "hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,x=1",  # a field hma never writes
        "hma=unhealthy:GPU_XID_48:reboot,c=gpu:0000:3b:00",  # another fault than the reason's
        "hma=recovered:GPU_XID_79:reboot,c=gpu:0000:3b:00",  # recovered, yet drained
        "hma=unhealthy:GPU_XID_79:none,c=gpu:0000:3b:00,h=label",  # held before
        f"hma=unhealthy:GPU_XID_79:reboot,c=gpu:0000:3b:00,d={NOW + 86400:.0f}",  # future
    ],
)
def test_reset_with_a_label_not_trusted_holds_and_never_acts(extra: str) -> None:
    for faults_now in ((), (fault(),)):
        result = after_reset(owned_drain(extra), faults_now)
        ep = result.episode
        assert ep is not None and ep.held == "label" and ep.holds("b1")
        assert not [k for k in kinds(result) if k.split("@")[0] in ("reboot", "replace", "resume")]

    ep = after_reset(owned_drain(extra)).episode
    assert ep is not None and "not trusted" in ep.message and ep.action == "none"


def test_held_drain_is_let_go_once_someone_else_holds_the_node() -> None:
    held = after_reset(owned_drain("hma=unhealthy:GPU_XID_79")).episode
    resumed = node(extra="hma=unhealthy:GPU_XID_79")  # an admin resumed it
    s = Situation(NOW + 900, Verdict(NOW + 900, "b1", ()), resumed, boot_id="b1")
    assert kinds(plan(held, 1, s, Policy(resume_after=0.0), True)) == ["resume@ep1:resume"]


# --- an operator's resume (planner.operator_resumed: the one rule) ---------------------------

DRAINED = {"owned": True, "drained_at": NOW - 30}
HONOURED = {
    "owned": False,
    "honoured": (("GPU_XID_79", "gpu:0000:3b:00", NOW),),
    "honoured_at": NOW,
}


@pytest.mark.parametrize(
    "ep, n, policy, situation, want",
    [
        # hma's drain, back in service with the fault active: an operator resumed it
        (episode(**DRAINED), node(), Policy(), {}, [f"honour@ep1:honour:{int(NOW)}"]),
        (episode(**DRAINED), node("mixed"), Policy(), {}, [f"honour@ep1:honour:{int(NOW)}"]),
        (
            episode(**DRAINED, acted=Acted("reboot", "b1", NOW - 20)),
            node(),
            Policy(),
            {},
            [f"honour@ep1:honour:{int(NOW)}"],
        ),
        (
            episode(**DRAINED, held="human"),
            node(),
            Policy(),
            {"open_rows": ((3, "hold"),)},
            [f"honour@ep1:honour:{int(NOW)}"],
        ),
        # the honour asked already: once
        (episode(**DRAINED), node(), Policy(), {"open_rows": ((4, "honour"),)}, []),
        # not an operator's resume: still drained, the read failed, hma's own resume, a dry
        # run (nothing was drained), back after the repair hma asked in an earlier boot
        (episode(**DRAINED), node("mixed", "DRAIN", reason="HMA: x"), Policy(), {}, []),
        (episode(**DRAINED), node(), Policy(), {"facts_ok": False}, []),
        (episode(**DRAINED, acted=Acted("reboot", "b0", NOW - 900)), node(), Policy(), {}, []),
        (episode(**DRAINED), node(), Policy(dry_run=True), {}, ["reboot@ep1:reboot:b1"]),
    ],
)
def test_an_operator_s_resume_is_honoured(
    ep: Episode, n: NodeState, policy: Policy, situation: dict[str, Any], want: list[str]
) -> None:
    assert kinds(decide(ep, (fault(),), n, policy, **situation)) == want


def test_hma_s_own_resume_racing_the_fault_is_no_operator_s() -> None:
    ep = episode(**DRAINED, phase="resuming", healthy_since=NOW - 300)
    result = decide(ep, (fault(),), node(), open_rows=((9, "resume"),))
    assert kinds(result) == ["cancel#9"]


@pytest.mark.parametrize(
    "faults_now",
    [
        (fault(last=NOW),),  # the same event: no new occurrence
        (fault(last=NOW - 100),),
        (fault(clears=Clears.OBSERVATION, first=NOW - 5, last=NOW + 60),),  # polled again
    ],
)
def test_an_honoured_occurrence_is_not_acted_on_again(faults_now: tuple[Fault, ...]) -> None:
    honoured = {**HONOURED, "honoured": (("GPU_XID_79", "gpu:0000:3b:00", NOW - 5),)}
    marks = honoured if faults_now[0].clears is Clears.OBSERVATION else HONOURED
    ep = episode(**marks)
    result = decide(ep, faults_now, node(), open_rows=((5, "reboot"), (6, "mirror")))
    assert [i for i in result.intents if isinstance(i, Enqueue)] == []
    assert [i.row_id for i in result.intents if isinstance(i, Cancel)] == [5]  # the repair
    assert result.episode == ep and result.seq == 1
    assert decide(ep, faults_now, node()).intents == ()  # every pass: nothing


@pytest.mark.parametrize(
    "faults_now",
    [
        (fault(last=NOW + 30),),  # the event again (a new Xid)
        (fault(), fault(code="GPU_XID_48")),  # another fault
        (fault(clears=Clears.OBSERVATION, first=NOW + 30, last=NOW + 30),),  # cleared, back
    ],
)
def test_a_new_occurrence_opens_a_new_episode_and_drains(faults_now: tuple[Fault, ...]) -> None:
    result = decide(episode(**HONOURED), faults_now, node(), open_rows=((5, "hold"),))
    assert kinds(result) == ["cancel#5", "drain@ep2:drain"]
    assert result.episode is not None and (result.episode.id, result.seq) == (2, 2)
    assert not result.episode.honoured and result.episode.owned is None


def test_an_honoured_episode_ends_when_the_fault_clears() -> None:
    result = decide(episode(**HONOURED), (), node())
    assert kinds(result) == ["resume@ep1:resume"]  # clears the label; the node is in service


def test_the_honour_survives_the_state_store() -> None:
    ep = episode(**HONOURED)
    assert Episode.from_json(ep.to_json()) == ep
    assert ep.to_json()["honoured"] == [["GPU_XID_79", "gpu:0000:3b:00", NOW]]
    assert "honoured" not in episode().to_json()
