"""The repair ladder (GPU reset, then reboot, then replace) and the repeat-offender rule of the
pure planner, the history mirror in the label field, and the catalogue's reset_gpu column."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import pytest

from hma.contracts import label as label_mod
from hma.contracts.catalogue import load_builtin
from hma.contracts.cluster import NodeState
from hma.contracts.model import Action
from hma.health.model import Fault, Verdict
from hma.probes.nvidia.reset import pci_bus_id
from hma.remediation.planner import (
    Acted,
    Enqueue,
    Episode,
    GpuReset,
    Plan,
    Policy,
    Reboot,
    Remediation,
    Situation,
    plan,
    remediation_count,
)
from tests import faults

NOW = 1_800_000_000.0
GPU = "gpu:0000:3b:00"
XID46 = "GPU_XID_46"  # NVIDIA: RESET_GPU
POLICY = Policy(reset_codes=frozenset({XID46, "GPU_XID_119"}), resume_after=0.0)


def fault(code: str = XID46, component: str = GPU, **given: Any) -> Fault:
    return faults.fault(code=code, component=component, **{"first": NOW - 5, "last": NOW, **given})


def drained() -> NodeState:
    return NodeState("n1", "idle", frozenset({"DRAIN"}), f"HMA: {XID46} {GPU}", NOW - 60)


def episode(**changes: Any) -> Episode:
    ep = Episode(1, XID46, GPU, action="reboot", since=NOW - 5, reason=f"HMA: {XID46} {GPU}")
    return replace(ep, owned=True, **changes)


def decide(
    ep: Optional[Episode],
    found: tuple[Fault, ...],
    n: Optional[NodeState] = None,
    policy: Policy = POLICY,
    **situation: Any,
) -> Plan:
    s = Situation(NOW, Verdict(NOW, "b1", found), n or drained(), boot_id="b1", **situation)
    return plan(ep, 1 if ep else 0, s, policy, True)


def kinds(result: Plan) -> list[str]:
    return [i.kind for i in result.intents if isinstance(i, Enqueue)]


# --- the GPU reset rung ---------------------------------------------------------------------------


def test_catalogue_marks_the_reset_gpu_codes_from_nvidia_resolution() -> None:
    cat = load_builtin()
    assert cat.entry("GPU_XID_46").reset_gpu  # RESET_GPU / CONTACT_SUPPORT
    assert cat.entry("GPU_XID_119").reset_gpu  # RESET_GPU / INVESTIGATE_SW
    assert not cat.entry("GPU_XID_79").reset_gpu  # fallen off the bus: a reboot
    assert not cat.entry("GPU_XID_48").reset_gpu
    assert not cat.entry("GPU_XID_13").reset_gpu  # application
    assert all(e.family == "GPU" and e.drains for e in cat if e.reset_gpu)


def test_a_reset_code_on_a_drained_node_gets_a_gpu_reset_not_a_reboot() -> None:
    result = decide(episode(), (fault(),))
    assert kinds(result) == ["reset_gpu"]
    assert result.episode is not None and result.episode.gpu_reset == GpuReset(GPU, XID46)
    enq = result.intents[0]
    assert isinstance(enq, Enqueue) and enq.payload()["gpu"] == GPU


@pytest.mark.parametrize(
    "found, policy, why",
    [
        ((fault("GPU_XID_79"),), POLICY, "a reboot code"),
        ((fault(), fault("GPU_XID_79", "gpu:0000:5d:00")), POLICY, "another GPU needs a reboot"),
        ((fault(component="node"),), POLICY, "not a GPU"),
        ((fault(),), replace(POLICY, gpu_reset=False), "gpu_reset = false"),
    ],
)
def test_no_gpu_reset_where_it_cannot_help(
    found: tuple[Fault, ...], policy: Policy, why: str
) -> None:
    assert kinds(decide(episode(), found, policy=policy)) == ["reboot"], why


def test_no_gpu_reset_while_jobs_still_run() -> None:
    draining = NodeState("n1", "allocated", frozenset({"DRAIN"}), f"HMA: {XID46} {GPU}", NOW - 60)
    assert kinds(decide(episode(), (fault(),), draining)) == []


def test_a_reset_asked_for_waits_for_its_outcome() -> None:
    ep = episode(gpu_reset=GpuReset(GPU, XID46))
    assert kinds(decide(ep, (fault(),), open_rows=((7, "reset_gpu"),))) == []


@pytest.mark.parametrize("note", ["refused: in use by another client", "failed: exited 255"])
def test_a_refused_or_failed_reset_goes_on_to_the_reboot(note: str) -> None:
    ep = episode(gpu_reset=GpuReset(GPU, XID46, NOW - 1, "b1", False, note))
    assert kinds(decide(ep, (fault(last=NOW - 2),))) == ["reboot"]


def test_a_fault_seen_again_after_the_reset_goes_on_to_the_reboot() -> None:
    ep = episode(gpu_reset=GpuReset(GPU, XID46, NOW - 10, "b1", True))
    assert kinds(decide(ep, (fault(last=NOW - 20),))) == []  # not cleared yet: wait
    assert kinds(decide(ep, (fault(last=NOW - 1),))) == ["reboot"]  # came back after it


def test_a_reset_that_does_not_clear_in_time_goes_on_to_the_reboot() -> None:
    ep = episode(gpu_reset=GpuReset(GPU, XID46, NOW - 301, "b1", True))
    assert kinds(decide(ep, (fault(last=NOW - 400),))) == ["reboot"]


def test_a_successful_reset_resumes_only_once_the_gpu_probe_read_the_gpu() -> None:
    ep = episode(gpu_reset=GpuReset(GPU, XID46, NOW - 10, "b1", True))
    waiting = decide(ep, ())
    assert kinds(waiting) == [] and waiting.episode is not None
    assert kinds(decide(ep, (), verified=NOW - 20)) == []  # a run from before the reset
    assert kinds(decide(ep, (), verified=NOW - 5)) == ["resume"]


def test_an_unverified_reset_reboots_when_the_verification_times_out() -> None:
    ep = episode(gpu_reset=GpuReset(GPU, XID46, NOW - 301, "b1", True))
    assert kinds(decide(ep, ())) == ["reboot"]


def test_reboots_beyond_max_still_escalate_to_replace_after_a_reset() -> None:
    ep = episode(gpu_reset=GpuReset(GPU, XID46, NOW - 1, "b1", False, "failed"))
    reboots = tuple(Reboot(XID46, GPU, NOW - 100) for _ in range(2))
    assert kinds(decide(ep, (fault(),), reboots=reboots)) == ["label", "replace"]


def test_the_reset_is_tried_once_per_episode() -> None:
    done = GpuReset(GPU, XID46, NOW - 100, "b0", True)  # worked in the last boot
    ep = episode(gpu_reset=done, acted=Acted("reboot", "b0", NOW - 90))
    assert kinds(decide(ep, (fault(),))) == ["reboot"]


def test_dry_run_shows_the_reset_and_the_reboot_after_it() -> None:
    result = decide(None, (fault(),), NodeState("n1", "idle"), replace(POLICY, dry_run=True))
    assert kinds(result) == ["drain", "reset_gpu", "reboot"]


def test_pci_bus_id_of_a_gpu_component() -> None:
    assert pci_bus_id("gpu:0000:3b:00") == "00000000:3B:00.0"
    assert pci_bus_id("gpu:00000001:5d:00") == "00000001:5D:00.0"
    for bad in ("node", "gpu:0000:3b", "gpu:0000:3b:00 -x", "gpu:../3b:00", "efa:rdmap16s27"):
        assert pci_bus_id(bad) is None


# --- repeat offenders -----------------------------------------------------------------------------


def history(*codes: str, age: float = 3600.0) -> tuple[Remediation, ...]:
    return tuple(
        Remediation(NOW - age - i, i + 1, code, "node", "drain") for i, code in enumerate(codes)
    )


def test_remediations_are_counted_per_episode_within_the_window() -> None:
    rows = (
        Remediation(NOW - 100, 1, "A", "node", "drain"),
        Remediation(NOW - 90, 1, "A", "node", "reboot"),  # the same episode
        Remediation(NOW - 80, 2, "B", "node", "reset_gpu"),
        Remediation(NOW - 8 * 86400, 3, "C", "node", "drain"),  # outside 7 days
        Remediation(NOW - 50, None, "D", "", "drain"),  # seeded from the mirror
        Remediation(NOW - 40, None, "", "", "reset"),  # hma reset: not a remediation
    )
    assert remediation_count(rows, NOW, 7 * 86400) == 3


def test_the_fourth_remediation_in_a_week_is_held_for_a_human() -> None:
    three = history("SYS_A", "SYS_B", "SYS_C")
    ok = decide(None, (fault("GPU_XID_79"),), NodeState("n1", "idle"), remediations=three[:2])
    assert kinds(ok) == ["drain"] and ok.episode is not None and not ok.episode.held
    held = decide(None, (fault("GPU_XID_79"),), NodeState("n1", "idle"), remediations=three)
    assert kinds(held) == ["drain", "hold"]
    ep = held.episode
    assert ep is not None and ep.held == "human"
    assert ep.reason.startswith(f"HMA: GPU_XID_79 {GPU} : repeat offender (4 remediations in 7 d)")
    # drained and idle: no reset, reboot or replace, and never resumed while held
    drained_node = replace(drained(), reason=ep.reason)
    assert kinds(decide(replace(ep, owned=True), (fault("GPU_XID_79"),), drained_node)) == []
    assert kinds(decide(replace(ep, owned=True), (), drained_node)) == []


def test_old_remediations_do_not_count() -> None:
    old = history("SYS_A", "SYS_B", "SYS_C", age=8 * 86400)
    assert kinds(decide(None, (fault(),), NodeState("n1", "idle"), remediations=old)) == ["drain"]


def test_a_node_held_for_a_human_stays_held_with_a_new_fault() -> None:
    result = decide(None, (fault(),), NodeState("n1", "idle"), human=NOW - 100)
    assert kinds(result) == ["drain", "hold"]


def test_after_a_wipe_the_held_drain_is_taken_up_from_the_mirror() -> None:
    n = NodeState(
        "n1",
        "idle",
        frozenset({"DRAIN"}),
        f"HMA: {XID46} {GPU} : repeat offender (4 remediations in 7 d), needs hma reset",
        NOW - 60,
    )
    s = Situation(NOW, Verdict(NOW, "b1", ()), n, boot_id="b1", human=NOW - 60)
    result = plan(None, 0, s, POLICY, False)
    assert kinds(result) == ["hold"]
    assert result.episode is not None and result.episode.held == "human"


def test_released_by_hma_reset_resumes_only_after_an_observation() -> None:
    ep = episode(released=NOW - 10, healthy_since=NOW - 100)
    assert kinds(decide(ep, ())) == []
    assert kinds(decide(ep, (), observed=NOW - 20)) == []
    assert kinds(decide(ep, (), observed=NOW - 5)) == ["resume"]


def test_released_with_the_fault_still_there_goes_on_with_the_ladder() -> None:
    ep = episode(released=NOW - 10)
    assert kinds(decide(ep, (fault(),))) == ["reset_gpu"]


def test_episode_with_a_reset_round_trips_through_json() -> None:
    ep = episode(gpu_reset=GpuReset(GPU, XID46, NOW, "b1", False, "in use"), released=NOW)
    assert Episode.from_json(ep.to_json()) == ep


# --- the mirror in the label field ----------------------------------------------------------------


def test_history_token_round_trip_and_edit_keeps_the_rest() -> None:
    hist = label_mod.History(((NOW - 10, "GPU_XID_46"), (NOW, "SYS_X")), held=NOW)
    token = hist.token()
    assert token == f"hmah=H{int(NOW)},{int(NOW - 10)}:GPU_XID_46,{int(NOW)}:SYS_X"
    assert label_mod.parse_history(token) == hist
    text = label_mod.edit_history("rack=12 hma=unhealthy:A:reboot", hist)
    assert text == f"rack=12 hma=unhealthy:A:reboot {token}"
    assert label_mod.find(text) is not None and label_mod.find_history(text) == hist
    assert label_mod.edit_history(text, None) == "rack=12 hma=unhealthy:A:reboot"
    assert label_mod.edit_history(text, label_mod.History()) == "rack=12 hma=unhealthy:A:reboot"


@pytest.mark.parametrize(
    "token",
    [
        "hmah=",
        "hmah=1:gpu",
        "hmah=H1,H2",
        "hmah=1:A,,2:B",
        "hmah=12:A:reboot",
        "hmah=1:A " + ",1:A" * 8,
        "hmah=" + ",".join(f"{i}:A" for i in range(9)),
        "hmah=x1:A",
    ],
)
def test_history_token_not_as_written_is_no_history(token: str) -> None:
    assert label_mod.parse_history(token.split()[0] if " " not in token else token) is None


def test_history_counts_within_the_window() -> None:
    hist = label_mod.History(((NOW - 8 * 86400, "A"), (NOW - 10, "B"), (NOW, "C")))
    assert hist.within(NOW, 7 * 86400) == 2
    assert Action.REBOOT  # the ladder's last rungs are the existing actions
