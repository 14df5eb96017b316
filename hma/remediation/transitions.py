"""Every change of an episode besides the planner's pass, decided without any I/O.

An applier step (``actions``) reports what it observed and did as an ``Outcome``; ``fold`` is
the one function that turns an outcome into the episode's new fields, and the worker writes the
result once per attempt. ``release`` is what ``hma reset`` (a human says the node was repaired)
does to the episode and the records. With ``planner.plan``, these are the only writers of an
episode (docs/remediation.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

from hma.remediation.planner import (
    Acted,
    Cancel,
    Enqueue,
    Episode,
    Intent,
    Policy,
    Reboot,
    Remediation,
    remediation_count,
)


@dataclass(frozen=True)
class _Noted:
    """An outcome that carries only its note: the class says what happened. Each kind below
    is a plain subclass (equal only to its own kind, shown by its own name): one dataclass
    built at import instead of seven, which the health check pays for at every start."""

    note: str = ""


class Done(_Noted):
    """The step is done (or was in effect already); the episode stays as it is."""


class Skipped(_Noted):
    """The step is not needed any more (or cannot be done); the episode stays as it is."""


class Held(_Noted):
    """A rule holds the step (maintenance, a missing capability, the reboot rate, a hold)."""


class HeldByBreaker(_Noted):
    """The circuit breaker holds the step: too many nodes are out already."""


class Failed(_Noted):
    """The step failed with a reason (retried with backoff)."""


@dataclass(frozen=True)
class Drained:
    """hma drained the node (or found it drained by hma) at ``at``."""

    at: float
    note: str = ""


@dataclass(frozen=True)
class Adopted:
    """hma took over the cluster's own drain (``reason``) at ``at``."""

    at: float
    reason: str
    note: str = ""


class NotOwned(_Noted):
    """Someone else holds the node out of scheduling: labelled only."""


class Undone(_Noted):
    """A drain beyond the breaker's limit was resumed: the drain is decided again."""


@dataclass(frozen=True)
class SetDown:
    """The node was set down at ``at`` (its drain did not complete in time)."""

    at: float
    note: str


@dataclass(frozen=True)
class ActedOn:
    """A reboot or replace was asked for (``acted``: which, in which boot, when)."""

    acted: Acted
    note: str


@dataclass(frozen=True)
class ResetRefused:
    """The GPU reset was not done (``why``); the next rung follows."""

    why: str
    note: str


@dataclass(frozen=True)
class ResetRan:
    """The GPU reset of ``component`` ran: ended at ``at`` in boot ``boot_id``, ``ok`` or not,
    with ``detail`` (its output, or why it failed)."""

    component: str
    at: float
    boot_id: str
    ok: bool
    detail: str
    note: str


@dataclass(frozen=True)
class Resumed:
    """The node of episode ``episode`` was resumed (or its label cleared)."""

    episode: int
    note: str


@dataclass(frozen=True)
class Honoured:
    """An operator brought episode ``episode``'s node back into service at ``at`` while its
    faults were active (``planner.operator_resumed``): honoured for those occurrences
    (``marks``: ``planner.occurrences``)."""

    episode: int
    at: float
    marks: tuple[tuple[str, str, float], ...]
    note: str


Outcome = Union[
    Done,
    Skipped,
    Held,
    HeldByBreaker,
    Failed,
    Drained,
    Adopted,
    NotOwned,
    Undone,
    SetDown,
    ActedOn,
    ResetRefused,
    ResetRan,
    Resumed,
    Honoured,
]

_HELD = (Held, HeldByBreaker, Undone)
_SKIPPED = (Skipped, ResetRefused)


def state_of(outcome: Outcome) -> str:
    """The outbox row's state after ``outcome``: done, skipped, held or failed."""
    if isinstance(outcome, Failed):
        return "failed"
    if isinstance(outcome, _HELD):
        return "held"
    if isinstance(outcome, _SKIPPED) or (isinstance(outcome, ResetRan) and not outcome.ok):
        return "skipped"
    return "done"


def fold(ep: Optional[Episode], outcome: Outcome) -> Optional[Episode]:
    """The open episode ``ep`` after ``outcome`` (None: no episode is open any more)."""
    if ep is None:
        return None
    if isinstance(outcome, Drained):
        return replace(ep, owned=True, drained_at=outcome.at)
    if isinstance(outcome, Adopted):
        return replace(ep, owned=True, drained_at=outcome.at, adopted=outcome.reason)
    if isinstance(outcome, NotOwned):
        return replace(ep, owned=False)
    if isinstance(outcome, Undone):
        return replace(ep, owned=None, drained_at=None)
    if isinstance(outcome, SetDown):
        return replace(ep, down_at=outcome.at)
    if isinstance(outcome, ActedOn):
        return replace(ep, acted=outcome.acted)
    if isinstance(outcome, (ResetRefused, ResetRan)):
        return _reset(ep, outcome)
    if isinstance(outcome, Honoured) and outcome.episode == ep.id:
        return replace(ep, owned=False, held="", honoured=outcome.marks, honoured_at=outcome.at)
    if isinstance(outcome, Resumed) and outcome.episode == ep.id:
        if ep.phase == "resuming":
            return None
        # the fault came back while resuming: decide the drain again
        return replace(ep, owned=None, drained_at=None, acted=None)
    return ep


def _reset(ep: Episode, outcome: Union[ResetRefused, ResetRan]) -> Episode:
    """The episode after its GPU reset was refused or ran."""
    reset = ep.gpu_reset
    if reset is None:
        return ep
    if isinstance(outcome, ResetRefused):
        return replace(ep, gpu_reset=replace(reset, ok=False, note=outcome.why))
    done = replace(
        reset, at=outcome.at, boot_id=outcome.boot_id, ok=outcome.ok, note=outcome.detail
    )
    return replace(ep, gpu_reset=done)


@dataclass(frozen=True)
class Reset:
    """What ``hma reset`` asks: the records of ``code`` on ``component`` (None: all) go."""

    code: Optional[str]
    component: Optional[str]
    who: str
    now: float
    boot_id: str = ""  # the current boot's id (the label field's action carries it)


@dataclass(frozen=True)
class Release:
    """``release``'s answer: the episode, the reboot records kept, whether the hold for a
    human ends, how many remediations count still, and the intents (the hold's actions
    cancelled, the label field written again)."""

    episode: Optional[Episode]
    reboots: tuple[Reboot, ...]
    released: bool
    left: int
    intents: tuple[Intent, ...]


def matches(reset: Reset, code: str, component: str) -> bool:
    """A record of ``code`` on ``component`` is one ``reset`` clears."""
    return (reset.code is None or code == reset.code) and reset.component in (None, component)


def release(
    ep: Optional[Episode],
    reset: Reset,
    policy: Policy,
    remediations: Sequence[Remediation],
    reboots: Sequence[Reboot],
    human: float,
    open_rows: Sequence[tuple[int, str]],
    mirror: Optional[str],
) -> Release:
    """``hma reset`` of ``reset``'s records, with the remediations left after it
    (``remediations``): the hold for a human ends when the count left is within
    ``max_remediations`` (or all were cleared), and the episode held for a human lets go of
    its drain (resumed after a completed probe run: the planner's ``released``). ``mirror``:
    this node's name, to write its label field again (None: not known yet)."""
    kept = tuple(r for r in reboots if not matches(reset, r.code, r.component))
    left = remediation_count(remediations, reset.now, policy.remediation_window)
    released = bool(human) and (reset.code is None or left <= policy.max_remediations)
    intents: list[Intent] = []
    if ep is not None and released and ep.held == "human":
        why = f"hma reset by {reset.who}"
        intents.extend(Cancel(row_id, why) for row_id, kind in open_rows if kind == "hold")
        ep = replace(ep, held="", released=reset.now, reason=ep.reason.split(" : ")[0])
    if mirror is not None:
        about = ep or Episode(0, reset.code or "", reset.component or "node")
        intents.append(Enqueue("mirror", f"reset:{reset.now}", about, reset.boot_id))
    return Release(ep, kept, released, left, tuple(intents))
