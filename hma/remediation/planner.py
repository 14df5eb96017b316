"""The planner: what remediation should do next, decided without any I/O.

``plan`` takes the open episode (one stretch of unhealthiness of this node), the health model's
verdict, the node's state as the backend last read it, the policy (``[recovery]``) and the time,
and returns the episode as it is now and the intents: actions to add to the outbox (``Enqueue``)
and open ones to cancel (``Cancel``). The engine applies them; the outbox makes each key happen
once. Every rule is described in docs/remediation.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence, Union

from hma.contracts import label as label_mod
from hma.contracts.cluster import OWNED_PREFIX, NodeState
from hma.contracts.model import Action, Clears
from hma.health.model import Fault, Verdict


def reason_for(fault: Fault) -> str:
    """The drain reason hma sets: ``HMA: <CODE> <component>``."""
    return f"{OWNED_PREFIX} {fault.code} {fault.component}"


def recovery_action(action: Action, auto_resume: bool) -> Action:
    """The recovery for a fault: ``reboot`` becomes ``replace`` when it hit an auto-resume job."""
    return Action.REPLACE if auto_resume and action is Action.REBOOT else action


@dataclass(frozen=True)
class Acted:
    """A reboot or replace hma asked for, in which boot."""

    kind: str
    boot_id: str
    at: float


@dataclass(frozen=True)
class GpuReset:
    """The GPU reset of an episode (the first rung of the repair ladder): which GPU, for which
    fault, when, and how it went (``ok`` None: asked, not carried out yet)."""

    component: str
    code: str
    at: float = 0.0
    boot_id: str = ""
    ok: Optional[bool] = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The stored and shown form."""
        return {
            "component": self.component,
            "code": self.code,
            "at": self.at,
            "boot_id": self.boot_id,
            "ok": self.ok,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GpuReset:
        """From ``to_json``."""
        ok = doc.get("ok")
        return cls(
            str(doc.get("component") or ""),
            str(doc.get("code") or ""),
            float(doc.get("at") or 0.0),
            str(doc.get("boot_id") or ""),
            ok if isinstance(ok, bool) else None,
            str(doc.get("note") or ""),
        )


@dataclass(frozen=True)
class Episode:
    """One stretch of unhealthiness of this node, from the first draining fault to the resume
    (status.json ``remediation.episode``)."""

    id: int
    code: str
    component: str
    severity: str = "critical"
    message: str = ""
    action: str = "none"
    since: float = 0.0
    jobs: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    boot_id: str = ""
    reason: str = ""
    phase: str = "open"  # open, resuming
    owned: Optional[bool] = None  # hma drained it (True), someone else holds it (False)
    drained_at: Optional[float] = None
    acted: Optional[Acted] = None
    down_at: Optional[float] = None
    healthy_since: Optional[float] = None
    stale: bool = False  # taken up from Slurm, without a record in the state store
    adopted: Optional[str] = None  # Slurm's own drain reason hma took over
    # Why a drain taken up from Slurm stays whatever the verdict: "label" (its label cannot be
    # trusted: until someone else lets go) or "repair" (its label says a reboot or replace was
    # asked and no boot came since: until a new boot); "human": a repeat offender, until
    # ``hma reset`` (or someone else lets go)
    held: str = ""
    gpu_reset: Optional[GpuReset] = None
    released: float = 0.0  # when ``hma reset`` released it (0: not)
    # An operator's resume honoured (``operator_resumed``): the occurrences it was honoured for
    # (``occurrences``) and when
    honoured: tuple[tuple[str, str, float], ...] = ()
    honoured_at: float = 0.0

    def holds(self, boot_id: str) -> bool:
        """Whether ``held`` still keeps the drain in boot ``boot_id``."""
        if self.held == "repair":
            return self.acted is not None and self.acted.boot_id == boot_id
        return self.held in ("label", "human")

    def to_json(self) -> dict[str, Any]:
        """The stored and shown form."""
        doc: dict[str, Any] = {
            "id": self.id,
            "code": self.code,
            "component": self.component,
            "severity": self.severity,
            "message": self.message,
            "action": self.action,
            "since": self.since,
            "jobs": list(self.jobs),
            "users": list(self.users),
            "boot_id": self.boot_id,
            "reason": self.reason,
            "phase": self.phase,
            "owned": self.owned,
            "drained_at": self.drained_at,
            "acted": (
                {"kind": self.acted.kind, "boot_id": self.acted.boot_id, "at": self.acted.at}
                if self.acted
                else None
            ),
            "down_at": self.down_at,
            "healthy_since": self.healthy_since,
        }
        if self.stale:
            doc["stale"] = True
        if self.adopted is not None:
            doc["adopted"] = self.adopted
        if self.held:
            doc["held"] = self.held
        if self.gpu_reset is not None:
            doc["gpu_reset"] = self.gpu_reset.to_json()
        if self.released:
            doc["released"] = self.released
        if self.honoured:
            doc["honoured"] = [list(mark) for mark in self.honoured]
            doc["honoured_at"] = self.honoured_at
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Episode:
        """From ``to_json`` (or an action's payload: the fields it has)."""
        acted, reset = doc.get("acted"), doc.get("gpu_reset")
        return cls(
            id=int(doc.get("id") or 0),
            code=str(doc.get("code") or ""),
            component=str(doc.get("component") or ""),
            severity=str(doc.get("severity") or "critical"),
            message=str(doc.get("message") or ""),
            action=str(doc.get("action") or "none"),
            since=float(doc.get("since") or 0.0),
            jobs=tuple(str(j) for j in doc.get("jobs") or ()),
            users=tuple(str(u) for u in doc.get("users") or ()),
            boot_id=str(doc.get("boot_id") or ""),
            reason=str(doc.get("reason") or ""),
            phase=str(doc.get("phase") or "open"),
            owned=doc.get("owned"),
            drained_at=doc.get("drained_at"),
            acted=(
                Acted(str(acted.get("kind")), str(acted.get("boot_id")), float(acted.get("at", 0)))
                if isinstance(acted, dict)
                else None
            ),
            down_at=doc.get("down_at"),
            healthy_since=doc.get("healthy_since"),
            stale=bool(doc.get("stale")),
            adopted=doc.get("adopted"),
            held=str(doc.get("held") or ""),
            gpu_reset=GpuReset.from_json(reset) if isinstance(reset, dict) else None,
            released=float(doc.get("released") or 0.0),
            honoured=tuple(
                (str(m[0]), str(m[1]), float(m[2]))
                for m in doc.get("honoured") or ()
                if len(m) == 3
            ),
            honoured_at=float(doc.get("honoured_at") or 0.0),
        )


@dataclass(frozen=True)
class Reboot:
    """One reboot hma had done for a fault (counted within ``reboot_window``)."""

    code: str
    component: str
    ts: float
    episode: Optional[int] = None
    boot_id: str = ""


def reboot_count(
    reboots: Sequence[Reboot], code: str, component: str, now: float, window: float
) -> int:
    """Reboots of (code, component) within ``window`` seconds of ``now``."""
    return sum(
        1 for r in reboots if r.code == code and r.component == component and now - r.ts <= window
    )


# What counts as a remediation (``hma reset`` records its own rows, which do not count).
# "crash": a previous boot's crash the post-mortem read (docs/remediation.md, "Post-mortem")
ACTIONS_COUNTED = ("drain", "reset_gpu", "reboot", "replace", "crash")
# The probe whose completed run verifies a GPU after its reset (a good observation of the GPU).
VERIFY_PROBE = "gpu"


@dataclass(frozen=True)
class Remediation:
    """One remediation hma carried out on this node (the state store's ``remediations``): a
    drain, a GPU reset, a reboot or a replace, in episode ``episode``; or a crash of a previous
    boot (``crash``, no episode), which counts like one."""

    ts: float
    episode: Optional[int]
    code: str
    component: str
    action: str
    boot_id: str = ""


def remediation_count(rows: Sequence[Remediation], now: float, window: float) -> int:
    """Remediations within ``window`` seconds of ``now``: the episodes they belong to (a drain
    and the reboot that followed it are one remediation)."""
    episodes = {
        r.episode if r.episode is not None else f"t{r.ts}"
        for r in rows
        if now - r.ts <= window and r.action in ACTIONS_COUNTED
    }
    return len(episodes)


@dataclass(frozen=True)
class Policy:
    """The ``[recovery]`` keys the planner uses; ``reset_codes``: the catalogue's codes that a
    GPU reset may clear (``reset_gpu = true``); ``scheduler_codes``: its codes of drains the
    scheduler made itself (``scheduler = true``)."""

    automatic: bool = True
    dry_run: bool = False
    adopt_slurm_drains: bool = False
    max_reboots: int = 2
    reboot_window: float = 7 * 86400.0
    resume_after: float = 120.0
    drain_timeout: float = 3600.0
    label_field: str = ""  # [recovery] label_field: the name of the node's field with the label
    gpu_reset: bool = True
    gpu_reset_verify: float = 300.0
    reset_codes: frozenset[str] = frozenset()
    scheduler_codes: frozenset[str] = frozenset()
    max_remediations: int = 3
    remediation_window: float = 7 * 86400.0

    @classmethod
    def of(
        cls,
        recovery: Mapping[str, Any],
        reset_codes: frozenset[str] = frozenset(),
        scheduler_codes: frozenset[str] = frozenset(),
    ) -> Policy:
        """From the ``[recovery]`` section's values."""
        return cls(
            automatic=recovery["policy"] == "automatic",
            dry_run=bool(recovery["dry_run"]),
            adopt_slurm_drains=bool(recovery["adopt_slurm_drains"]),
            max_reboots=int(recovery["max_reboots"]),
            reboot_window=float(recovery["reboot_window"]),
            resume_after=float(recovery["resume_after"]),
            drain_timeout=float(recovery["drain_timeout"]),
            label_field=str(recovery["label_field"]),
            gpu_reset=bool(recovery["gpu_reset"]),
            gpu_reset_verify=float(recovery["gpu_reset_verify"]),
            reset_codes=reset_codes,
            scheduler_codes=scheduler_codes,
            max_remediations=int(recovery["max_remediations"]),
            remediation_window=float(recovery["remediation_window"]),
        )

    def offender(self, rows: Sequence[Remediation], now: float) -> int:
        """The count of remediations when one more makes the node a repeat offender (more
        than ``max_remediations`` within ``remediation_window``), else 0."""
        count = remediation_count(rows, now, self.remediation_window)
        return count + 1 if count + 1 > self.max_remediations else 0


@dataclass(frozen=True)
class Situation:
    """Everything the planner looks at besides the episode and the policy."""

    now: float
    verdict: Verdict
    node: Optional[NodeState]  # as last read (None: not read yet)
    facts_ok: bool = True  # the last read of the node's state and jobs worked
    jobs: tuple[tuple[str, str], ...] = ()  # (job id, user) on the node
    boot_id: str = ""
    boot_since: float = 0.0  # when the current boot id was first heard of
    booted: float = 0.0  # when the current boot started (the node's clock; 0: unknown)
    reboots: tuple[Reboot, ...] = ()
    auto_resume_jobs: frozenset[str] = frozenset()  # jobs seen running under hma srun
    open_rows: tuple[tuple[int, str], ...] = ()  # (id, kind) of the episode's open actions
    # Why an owned drain must not be resumed yet although the node is healthy (a check that
    # must pass after a reboot or replace first); empty: nothing holds the resume.
    resume_hold: str = ""
    remediations: tuple[Remediation, ...] = ()
    human: float = 0.0  # held for a human (a repeat offender) since then; 0: not
    observed: float = 0.0  # start of the last completed probe run (0: none seen)
    verified: float = 0.0  # start of the last completed run of VERIFY_PROBE (0: none seen)


@dataclass(frozen=True)
class Enqueue:
    """Add the action ``kind`` under ``key`` to the outbox (once per key)."""

    kind: str
    key: str
    episode: Episode  # as it was when decided (the action's payload and alert)
    boot_id: str

    def payload(self) -> dict[str, Any]:
        """What the outbox row carries."""
        ep = self.episode
        return {
            "episode": ep.id,
            "code": ep.code,
            "component": ep.component,
            "action": ep.action,
            "boot_id": self.boot_id,
            "jobs": list(ep.jobs),
        } | ({"gpu": ep.gpu_reset.component} if ep.gpu_reset is not None else {})


@dataclass(frozen=True)
class Cancel:
    """Cancel the open action ``row_id``."""

    row_id: int
    why: str


Intent = Union[Enqueue, Cancel]


@dataclass(frozen=True)
class Plan:
    """The planner's answer."""

    episode: Optional[Episode]
    seq: int  # the last episode id used
    intents: tuple[Intent, ...] = ()
    stale_checked: bool = False  # Slurm was looked at for a drain without a record


def _effective(fault: Fault, policy: Policy, s: Situation) -> Action:
    if (
        fault.action is Action.REBOOT
        and reboot_count(s.reboots, fault.code, fault.component, s.now, policy.reboot_window)
        >= policy.max_reboots
    ):
        return Action.REPLACE
    return fault.action


def _considered(s: Situation, policy: Policy) -> tuple[Fault, ...]:
    """The draining faults remediation acts on (Slurm's own drains only when adopted)."""
    faults = s.verdict.draining
    if not policy.adopt_slurm_drains:  # Slurm's own drains: reported, never acted on
        faults = tuple(f for f in faults if f.code not in policy.scheduler_codes)
    return faults


def primary(s: Situation, policy: Policy) -> tuple[Optional[Fault], Action]:
    """The fault the episode is about (strongest effective action, then oldest) and its
    action."""
    faults = _considered(s, policy)
    if not faults:
        return None, Action.NONE
    ranked = sorted(
        faults,
        key=lambda f: (-int(_effective(f, policy, s)), f.first_seen, f.code, f.component),
    )
    return ranked[0], _effective(ranked[0], policy, s)


# --- an operator's resume ----------------------------------------------------------------------
#
# The one rule (docs/remediation.md, "An operator's resume"): hma acts once per occurrence of a
# fault. When a node hma drained is back in service while the episode's fault is still active
# (someone ran `scontrol update state=resume`), that is an operator's decision about these
# occurrences: it is honoured for the episode (no drain, reset, reboot or replace again; the
# open repairs cancelled; labelled ``h=operator`` and said in status, fleet and journald). A new
# occurrence of a fault (or another fault) is not covered by it: it opens a new episode, which
# acts again. A drain someone else held is not hma's: when they let go, hma drains (``_faulty``).

HONOURED = "resumed by an operator while {code} is active; honoured until a new occurrence"
# What an operator's resume cancels: the steps that would take the node out of service again
_REPAIRS = ("drain", "down", "hold", "label", "reset_gpu", "reboot", "replace")


def occurrences(faults: Sequence[Fault]) -> tuple[tuple[str, str, float], ...]:
    """Which occurrence each of ``faults`` is: (code, component, stamp). A polled fault is one
    occurrence from its first observation until it clears (stamp: ``first_seen``); an event
    fault's occurrence is its latest event (``last_seen``: a new event is a new occurrence)."""
    return tuple(
        sorted(
            (f.code, f.component, f.first_seen if f.clears is Clears.OBSERVATION else f.last_seen)
            for f in faults
        )
    )


def operator_resumed(ep: Episode, s: Situation, policy: Policy) -> bool:
    """Whether the node of ``ep``, which hma drained, is back in service by someone else's
    hand (not hma's own resume, not a dry run's simulated drain, not the end of a repair hma
    asked for in an earlier boot), as the last read of the node shows."""
    node = s.node
    return (
        policy.automatic
        and not policy.dry_run
        and ep.owned is True
        and ep.phase == "open"
        and not ep.honoured
        and s.facts_ok
        and node is not None
        and not node.out_of_service
        and (ep.acted is None or ep.acted.boot_id == s.boot_id)
    )


def new_occurrence(ep: Episode, faults: Sequence[Fault]) -> bool:
    """Whether one of ``faults`` is an occurrence the operator's resume of ``ep`` did not
    cover (another fault, or a later occurrence of one it covered)."""
    marks = {(code, component): stamp for code, component, stamp in ep.honoured}
    return any(
        (code, component) not in marks or stamp > marks[(code, component)]
        for code, component, stamp in occurrences(faults)
    )


@dataclass
class _Work:
    """One planning pass (the mutable part)."""

    s: Situation
    policy: Policy
    seq: int
    stale_checked: bool
    open_rows: list[tuple[int, str]]
    intents: list[Intent] = field(default_factory=list)

    def enqueue(self, ep: Episode, kind: str, key: str) -> Episode:
        self.intents.append(Enqueue(kind, key, ep, self.s.boot_id))
        if self.policy.dry_run:  # simulate, so that the next steps are decided (and shown) too
            if kind == "drain":
                return replace(ep, owned=True, drained_at=self.s.now)
            if kind in ("reboot", "replace"):
                return replace(ep, acted=Acted(kind, self.s.boot_id, self.s.now))
            if kind == "reset_gpu" and ep.gpu_reset is not None:
                return replace(ep, gpu_reset=replace(ep.gpu_reset, ok=False, note="dry run"))
        return ep

    def cancel(self, kinds: Optional[str], why: str) -> None:
        for row_id, kind in list(self.open_rows):
            if kinds is None or kind == kinds:
                self.intents.append(Cancel(row_id, why))
                self.open_rows.remove((row_id, kind))


def plan(
    episode: Optional[Episode],
    seq: int,
    s: Situation,
    policy: Policy,
    stale_checked: bool = False,
) -> Plan:
    """Bring the outbox in line with the verdict (see the module doc)."""
    w = _Work(s, policy, seq, stale_checked, list(s.open_rows))
    ep = episode
    if ep is not None and s.node is not None and s.facts_ok:
        w.stale_checked = True  # an episode at start: nothing in Slurm to take up later
    fault, action = primary(s, policy)
    hit = ep.jobs if ep is not None else tuple(j for j, _u in s.jobs)
    action = recovery_action(action, any(j in s.auto_resume_jobs for j in hit))
    if fault is not None:
        ep = _faulty(w, ep, fault, action)
    elif ep is None:
        ep = _stale_episode(w)
    if fault is None and ep is not None and ep.phase == "open":
        ep = _healthy(w, ep)
    return Plan(ep, w.seq, tuple(w.intents), w.stale_checked)


def _faulty(w: _Work, ep: Optional[Episode], fault: Fault, action: Action) -> Episode:
    s, now = w.s, w.s.now
    if ep is None:
        w.seq += 1
        kind = "drain" if w.policy.automatic else "label"
        ep = Episode(
            id=w.seq,
            code=fault.code,
            component=fault.component,
            severity=str(fault.severity),
            message=fault.message,
            action=str(action),
            since=fault.first_seen or now,
            jobs=tuple(j for j, _u in s.jobs),
            users=tuple(sorted({u for _j, u in s.jobs})),
            boot_id=s.boot_id,
            reason=reason_for(fault),
        )
        count = w.policy.offender(s.remediations, now)
        if w.policy.automatic and (count or s.human):
            ep = _for_a_human(w, ep, count)
        ep = w.enqueue(ep, kind, f"ep{ep.id}:{kind}")
        if ep.held:
            ep = w.enqueue(ep, "hold", f"ep{ep.id}:hold")
    elif ep.honoured:
        if new_occurrence(ep, _considered(s, w.policy)):
            for kind in _REPAIRS:
                w.cancel(kind, "a new occurrence: a new episode")
            return _faulty(w, None, fault, action)
        for kind in _REPAIRS:
            w.cancel(kind, HONOURED.format(code=ep.code))
        return ep
    elif operator_resumed(ep, s, w.policy):
        if not any(kind == "honour" for _id, kind in w.open_rows):
            ep = w.enqueue(ep, "honour", f"ep{ep.id}:honour:{int(now)}")
        return ep
    else:
        if ep.phase == "resuming":
            w.cancel("resume", "the fault came back")
            ep = replace(ep, phase="open")
        ep = replace(ep, healthy_since=None)
        node = s.node
        released = ep.owned is False and node is not None
        if w.policy.automatic and released and node is not None and not node.out_of_service:
            ep = replace(ep, owned=None)  # whoever held it let go: drain it now
            ep = w.enqueue(ep, "drain", f"ep{ep.id}:drain:{int(now)}")
        elif w.policy.automatic and ep.owned is None and not w.open_rows:
            ep = w.enqueue(ep, "drain", f"ep{ep.id}:drain:{int(now)}")
        if str(action) != ep.action:
            old = ep.action
            ep = replace(ep, action=str(action))
            if Action.parse(old) < action:
                ep = replace(
                    ep,
                    code=fault.code,
                    component=fault.component,
                    severity=str(fault.severity),
                    message=fault.message,
                )
            ep = w.enqueue(ep, "label", f"ep{ep.id}:label:{action}")
    if w.policy.automatic:
        ep = _progress(w, ep, action, fault)
    return ep


def _for_a_human(w: _Work, ep: Episode, count: int) -> Episode:
    """A new episode of a repeat offender: drained for a human, no automatic repair."""
    days = w.policy.remediation_window / 86400
    why = f"{count} remediations in {days:g} d" if count else "held since before"
    return replace(
        ep,
        held="human",
        reason=f"{ep.reason} : repeat offender ({why}), needs hma reset",
        message=f"{ep.message}; repeat offender ({why}): no automatic repair until hma reset",
    )


def _unverified(w: _Work, ep: Episode) -> str:
    """Why a healthy node must wait before its resume for what this episode did: a GPU reset
    not yet verified by a completed run of ``VERIFY_PROBE``, or ``hma reset`` not yet followed
    by a completed probe run ("" nothing)."""
    reset, s = ep.gpu_reset, w.s
    if reset is not None and reset.ok and ep.acted is None and s.verified < reset.at:
        return f"GPU reset of {reset.component}: waiting for the {VERIFY_PROBE} probe"
    if ep.released and s.observed < ep.released:
        return "hma reset: waiting for a healthy observation"
    return ""


def _healthy(w: _Work, ep: Episode) -> Optional[Episode]:
    """No draining fault: resume once healthy for ``resume_after`` (at once if never drained)."""
    now = w.s.now
    if ep.holds(w.s.boot_id) and not _let_go(w.s):
        return ep  # healthy_since starts once nothing holds it
    unverified = _unverified(w, ep)
    reset = ep.gpu_reset
    if unverified and reset is not None and reset.ok and ep.acted is None and ep.owned:
        if now - reset.at >= w.policy.gpu_reset_verify and w.policy.automatic:
            # the reset could not be verified in time: the next rung
            return w.enqueue(ep, "reboot", f"ep{ep.id}:reboot:{w.s.boot_id}")
    if ep.healthy_since is None:
        ep = replace(ep, healthy_since=now)
    never_drained = not ep.owned
    healthy_for = now - float(ep.healthy_since or now)
    held = w.s.resume_hold or unverified
    if not never_drained and (healthy_for < w.policy.resume_after or held):
        return ep
    ep = replace(ep, phase="resuming")
    w.cancel(None, "the fault cleared")
    ep = w.enqueue(ep, "resume", f"ep{ep.id}:resume")
    return None if w.policy.dry_run else ep


def _stale_episode(w: _Work) -> Optional[Episode]:
    """A healthy node that Slurm shows labelled or drained by hma, with no episode in the
    state store (a wiped disk, a replaced instance, a state reset): take it up again, so that
    the drain is resumed after ``resume_after`` and the label cleared, by the usual rules, unless
    its label says more is owed (``_owed``)."""
    s, node = w.s, w.s.node
    if node is None or not s.facts_ok or w.stale_checked:
        return None
    w.stale_checked = True  # once, at start: later labels are this instance's own
    field_text = node.field(w.policy.label_field)
    found = label_mod.find(field_text)
    owned = node.owned and node.out_of_service
    if not owned and (found is None or found.state != "unhealthy"):
        return None
    code, component = (found.code, found.component) if found else ("", "")
    if owned:
        text = node.reason[len(OWNED_PREFIX) :].split(" : ", 1)[0].strip()
        code, _, component = text.partition(" ")
    w.seq += 1
    ep = Episode(
        id=w.seq,
        code=code or "?",
        component=component or "node",
        severity="critical",
        message="found in Slurm without a record in the state store",
        action=found.action if found else "none",
        since=(found.since if found and found.since else node.reason_time) or s.now,
        jobs=tuple(found.jobs) if found else (),
        users=(),
        boot_id=s.boot_id,
        reason=node.reason.split(" : ", 1)[0] if owned else f"{OWNED_PREFIX} {code}",
        owned=owned or None,
        drained_at=node.reason_time if owned else None,
        stale=True,
    )
    if owned and s.human:  # a repeat offender's drain (the history mirror says so)
        ep = replace(ep, held="human", message=f"{ep.message}; repeat offender: needs hma reset")
        return w.enqueue(ep, "hold", f"ep{ep.id}:hold")
    token = label_mod.find_token(field_text, label_mod.PREFIX)
    return _owed(w, ep, node, token) if owned and token is not None else ep


def _let_go(s: Situation) -> bool:
    """Whoever holds the node now is not hma (an admin resumed it or took the drain over)."""
    return s.node is not None and s.facts_ok and not s.node.owned


def _distrust(lab: Optional[label_mod.Label], ep: Episode, now: float) -> str:
    """Why the label of a drain hma owns cannot be taken as hma's own record ("" if it can)."""
    if lab is None:
        return "not a well-formed hma label"
    if lab.state != "unhealthy":
        return f"state {lab.state} on a drained node"
    if (lab.code, lab.component or "node") != (ep.code, ep.component):
        return f"it names {lab.code} {lab.component}, the drain reason {ep.code} {ep.component}"
    if lab.held == "label":
        return "held before: its label was not trusted"
    if max(lab.since, lab.drained) > now + label_mod.SKEW:
        return "a time in the future"
    return ""


def _owed(w: _Work, ep: Episode, node: NodeState, token: str) -> Episode:
    """What a drain hma owns, found without a record, is owed by its label (``token``). Only
    ever more than the drain alone: a reboot or replace the label says was asked keeps the node
    drained until a boot after the drain; a label that cannot be trusted keeps it drained until
    someone else lets go. Nothing here acts: a reboot or replace comes only from a fault hma
    observes itself, and never while the label is distrusted."""
    s = w.s
    lab = label_mod.parse_strict(token)
    why = _distrust(lab, ep, s.now)
    if why or lab is None:
        note = f"{ep.message}; its label {token[:200]!r} is not trusted: {why}"
        held = replace(ep, action="none", held="label", message=note)
        return w.enqueue(held, "hold", f"ep{ep.id}:hold")
    ep = replace(ep, action=lab.action, since=lab.since or ep.since, jobs=lab.jobs)
    if lab.action not in ("reboot", "replace"):
        return ep
    drained = lab.drained or node.reason_time
    rebooted = bool(drained) and s.booted > drained
    if not node.reboot_pending and (rebooted or not drained):
        return replace(ep, drained_at=drained or None, acted=Acted(lab.action, "", drained))
    ep = replace(
        ep,
        drained_at=drained or None,
        acted=Acted(lab.action, s.boot_id, drained),
        held="repair",
        message=f"{ep.message}; its label says {lab.action}, and no boot came since the drain",
    )
    return w.enqueue(ep, "hold", f"ep{ep.id}:hold")


def _progress(w: _Work, ep: Episode, action: Action, fault: Fault) -> Episode:
    """Next recovery step of an open episode whose drain hma owns (``fault``: its primary)."""
    s, now = w.s, w.s.now
    if not ep.owned or ep.phase != "open" or ep.holds(s.boot_id):
        return ep
    node, acted = s.node, ep.acted
    if acted and acted.boot_id == s.boot_id:
        return ep  # acted in this boot; wait for the reboot (or a human, for replace)
    if acted and fault.clears is Clears.OBSERVATION and fault.last_seen < s.boot_since:
        return ep  # carried over the reboot, not seen on this boot: wait for its probe to look
    if acted and acted.kind == "replace":
        return ep
    if w.policy.dry_run:
        idle = node is None or not node.busy  # as if the drain had happened
    else:
        idle = bool(ep.down_at) or (node is not None and node.drained)
    if not idle and node is not None and node.draining:
        if now - float(ep.drained_at or now) >= w.policy.drain_timeout:
            ep = w.enqueue(ep, "down", f"ep{ep.id}:down")
        return ep
    if not idle:
        return ep
    if action is Action.REBOOT:
        rung = _reset_rung(w, ep, fault)
        if rung is not None and not (w.policy.dry_run and rung.gpu_reset and rung.gpu_reset.note):
            return rung
        ep = rung or ep  # dry run: the simulated reset shown, then the reboot after it
        return w.enqueue(ep, "reboot", f"ep{ep.id}:reboot:{s.boot_id}")
    if action is Action.REPLACE:
        return w.enqueue(ep, "replace", f"ep{ep.id}:replace")
    return ep


def _resettable(w: _Work, fault: Fault) -> bool:
    """A GPU reset may clear every draining fault: each is on the GPU of ``fault`` and of a
    code whose catalogue entry says a reset can clear it."""
    faults = [f for f in w.s.verdict.draining if f.code not in w.policy.scheduler_codes]
    return (
        w.policy.gpu_reset
        and fault.component.startswith("gpu:")
        and all(f.component == fault.component and f.code in w.policy.reset_codes for f in faults)
    )


def _reset_rung(w: _Work, ep: Episode, fault: Fault) -> Optional[Episode]:
    """The GPU reset before a reboot (once per episode): the episode while the reset is asked
    for or being verified, None when the ladder goes on to the reboot (the reset was refused,
    failed, did not hold, or cannot help)."""
    reset = ep.gpu_reset
    if reset is None:
        if not _resettable(w, fault):
            return None
        ep = replace(ep, gpu_reset=GpuReset(fault.component, fault.code))
        return w.enqueue(ep, "reset_gpu", f"ep{ep.id}:reset_gpu")
    if reset.ok is None:
        if any(kind == "reset_gpu" for _id, kind in w.open_rows):
            return ep  # asked for: wait for its outcome
        return w.enqueue(ep, "reset_gpu", f"ep{ep.id}:reset_gpu")
    if not reset.ok or fault.last_seen > reset.at:
        return None  # refused or failed, or the fault came back after it: reboot
    if w.s.now - reset.at >= w.policy.gpu_reset_verify:
        return None  # the fault was not cleared in time
    return ep  # reset done: the daemon clears the fault, the gpu probe verifies
