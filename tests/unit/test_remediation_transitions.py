"""Table tests of every change of an episode besides the planner's pass: the fold of each
applier outcome (hma.remediation.transitions.fold) and ``hma reset`` (``release``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import pytest

from hma.remediation.planner import (
    Acted,
    Cancel,
    Enqueue,
    Episode,
    GpuReset,
    Policy,
    Reboot,
    Remediation,
)
from hma.remediation.transitions import (
    ActedOn,
    Adopted,
    Done,
    Drained,
    Failed,
    Held,
    HeldByBreaker,
    Honoured,
    NotOwned,
    Outcome,
    Release,
    Reset,
    ResetRan,
    ResetRefused,
    Resumed,
    SetDown,
    Skipped,
    Undone,
    fold,
    matches,
    release,
    state_of,
)

EP = Episode(7, "GPU_XID_79", "gpu:0000:3b:00", reason="HMA: GPU_XID_79 gpu:0000:3b:00", owned=True)
ASKED = replace(EP, gpu_reset=GpuReset("gpu:0000:3b:00", "GPU_XID_79"))
REBOOT = Acted("reboot", "b1", 50.0)
MARKS = (("GPU_XID_79", "gpu:0000:3b:00", 40.0),)


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (Done(), "done"),
        (Done("the node rebooted since"), "done"),
        (Skipped("nothing to hold any more"), "skipped"),
        (Held("maintenance: node is in a maintenance reservation"), "held"),
        (HeldByBreaker("breaker: 1 node(s) held, limit 1"), "held"),
        (Failed("scontrol exited 1"), "failed"),
        (Drained(10.0), "done"),
        (Adopted(10.0, "bad disk"), "done"),
        (NotOwned("not owned: left drained"), "done"),
        (Undone("breaker: drain undone"), "held"),
        (SetDown(10.0, "drain did not complete"), "done"),
        (ActedOn(REBOOT, "reboot via slurm"), "done"),
        (ResetRefused("jobs still on the node", "GPU reset not done"), "skipped"),
        (ResetRan("gpu:0000:3b:00", 10.0, "b1", True, "ok", "GPU reset of gpu"), "done"),
        (ResetRan("gpu:0000:3b:00", 10.0, "b1", False, "exited 3", "failed"), "skipped"),
        (Resumed(7, "resumed"), "done"),
        (Honoured(7, 60.0, MARKS, "resumed by an operator"), "done"),
    ],
)
def test_each_outcome_leaves_its_row_in_one_state(outcome: Outcome, state: str) -> None:
    assert state_of(outcome) == state


@pytest.mark.parametrize(
    ("before", "outcome", "changes"),
    [
        # what a step observed and did -> the episode's fields it changes
        (replace(EP, owned=None), Drained(12.5), {"owned": True, "drained_at": 12.5}),
        (
            replace(EP, owned=None),
            Adopted(12.5, "bad disk"),
            {"owned": True, "drained_at": 12.5, "adopted": "bad disk"},
        ),
        (replace(EP, owned=None), NotOwned("not owned"), {"owned": False}),
        (replace(EP, drained_at=12.5), Undone("undone"), {"owned": None, "drained_at": None}),
        (EP, SetDown(99.0, "down"), {"down_at": 99.0}),
        (EP, ActedOn(REBOOT, "reboot via slurm"), {"acted": REBOOT}),
        (
            ASKED,
            ResetRefused("jobs still on the node", "not done"),
            {"gpu_reset": replace(ASKED.gpu_reset, ok=False, note="jobs still on the node")},
        ),
        (
            ASKED,
            ResetRan("gpu:0000:3b:00", 60.0, "b1", True, "GPU reset", "done"),
            {"gpu_reset": GpuReset("gpu:0000:3b:00", "GPU_XID_79", 60.0, "b1", True, "GPU reset")},
        ),
        (
            ASKED,
            ResetRan("gpu:0000:3b:00", 60.0, "b1", False, "exited 3", "failed"),
            {"gpu_reset": GpuReset("gpu:0000:3b:00", "GPU_XID_79", 60.0, "b1", False, "exited 3")},
        ),
        # an operator resumed hma's drain: honoured for these occurrences, the drain not hma's
        (
            replace(EP, drained_at=1.0, held="human"),
            Honoured(7, 60.0, MARKS, "resumed by an operator"),
            {"owned": False, "held": "", "honoured": MARKS, "honoured_at": 60.0},
        ),
        # the fault came back while resuming: the drain is decided again
        (
            replace(EP, drained_at=1.0, acted=REBOOT),
            Resumed(7, "resumed"),
            {"owned": None, "drained_at": None, "acted": None},
        ),
    ],
)
def test_an_outcome_changes_only_its_fields(
    before: Episode, outcome: Outcome, changes: dict[str, Any]
) -> None:
    assert fold(before, outcome) == replace(before, **changes)


@pytest.mark.parametrize(
    "outcome",
    [
        Done(),
        Skipped("gone"),
        Held("rate: last reboot 5 s ago"),
        HeldByBreaker("breaker: 2 node(s) held, limit 1"),
        Failed("hook exited 1"),
        Resumed(8, "another episode's resume"),
        Honoured(8, 60.0, MARKS, "another episode's"),
        ResetRefused("no reset asked", "not done"),  # no reset asked for: nothing to record
        ResetRan("gpu:0000:3b:00", 60.0, "b1", True, "", "done"),
    ],
)
def test_an_outcome_without_a_change_leaves_the_episode_as_it_is(outcome: Outcome) -> None:
    assert fold(EP, outcome) is EP


@pytest.mark.parametrize(
    "outcome", [Drained(1.0), Resumed(7, "resumed"), Undone("undone"), Honoured(7, 1.0, (), "")]
)
def test_no_open_episode_stays_none(outcome: Outcome) -> None:
    assert fold(None, outcome) is None


def test_the_resume_of_a_resuming_episode_ends_it() -> None:
    assert fold(replace(EP, phase="resuming"), Resumed(7, "resumed")) is None


@pytest.mark.parametrize(
    ("code", "component", "matched"),
    [
        (None, None, True),
        ("GPU_XID_79", None, True),
        ("GPU_XID_79", "gpu:0000:3b:00", True),
        ("GPU_XID_48", None, False),
        (None, "gpu:0000:5d:00", False),
    ],
)
def test_reset_matches_its_code_and_component(
    code: Optional[str], component: Optional[str], matched: bool
) -> None:
    assert matches(Reset(code, component, "ops", 0.0), "GPU_XID_79", "gpu:0000:3b:00") is matched


HUMAN = replace(
    EP, held="human", reason="HMA: GPU_XID_79 gpu:0000:3b:00 : repeat offender (4 in 7 d)"
)
DAY = 86400.0
RECENT = tuple(Remediation(100.0 * i, i, "GPU_XID_79", "gpu:0000:3b:00", "drain") for i in (1, 2))
MANY = tuple(Remediation(100.0 * i, i, "GPU_XID_79", "gpu:0000:3b:00", "drain") for i in range(9))
REBOOTS = (
    Reboot("GPU_XID_79", "gpu:0000:3b:00", 10.0),
    Reboot("GPU_XID_48", "gpu:0000:3b:00", 20.0),
)
POLICY = Policy(max_remediations=3, remediation_window=7 * DAY)


def _release(
    ep: Optional[Episode],
    code: Optional[str] = None,
    human: float = 5.0,
    left: tuple[Remediation, ...] = (),
    rows: tuple[tuple[int, str], ...] = ((3, "hold"), (4, "label")),
    mirror: Optional[str] = "n1",
) -> Release:
    return release(
        ep, Reset(code, None, "ops", 1000.0, "b2"), POLICY, left, REBOOTS, human, rows, mirror
    )


def test_release_of_all_lets_the_repeat_offender_go_and_writes_the_label_again() -> None:
    out = _release(HUMAN, left=MANY)
    assert out.released and out.left == 9  # all cleared: released whatever the count
    assert out.reboots == ()
    assert out.episode == replace(
        HUMAN, held="", released=1000.0, reason="HMA: GPU_XID_79 gpu:0000:3b:00"
    )
    assert out.intents == (
        Cancel(3, "hma reset by ops"),
        Enqueue("mirror", "reset:1000.0", out.episode, "b2"),
    )


def test_release_of_one_code_keeps_the_others_reboots() -> None:
    out = _release(HUMAN, code="GPU_XID_79", left=RECENT)
    assert out.reboots == (REBOOTS[1],)
    assert out.released and out.left == 2
    assert out.episode is not None and out.episode.held == ""


def test_release_of_one_code_keeps_the_hold_while_too_many_are_left() -> None:
    out = _release(HUMAN, code="GPU_XID_48", left=MANY)
    assert not out.released and out.episode is HUMAN
    assert out.intents == (Enqueue("mirror", "reset:1000.0", HUMAN, "b2"),)


def test_release_of_a_node_held_for_nobody_changes_no_episode() -> None:
    out = _release(EP, human=0.0)
    assert not out.released and out.episode is EP
    assert [type(i) for i in out.intents] == [Enqueue]


def test_release_without_an_episode_mirrors_what_was_reset() -> None:
    out = _release(None, code="GPU_XID_79")
    assert out.episode is None
    assert out.intents == (
        Enqueue("mirror", "reset:1000.0", Episode(0, "GPU_XID_79", "node"), "b2"),
    )


def test_release_before_the_node_is_known_writes_no_label() -> None:
    out = _release(HUMAN, mirror=None)
    assert out.intents == (Cancel(3, "hma reset by ops"),)
