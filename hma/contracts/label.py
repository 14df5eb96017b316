"""The node label: one ``hma=...`` token in the node's Extra (or Comment) field.

Format (no spaces; fields after the first comma are optional and in any order)::

    hma=<state>:<CODE>:<action>,c=<component>,t=<since>,r=<reboots>,j=<job>+<job>,h=<held>

``state`` is ``unhealthy`` while a fault is active, ``recovered`` after a resume while reboots are
still counted within the window (so that a node whose disk a reboot wiped still knows), ``blind``
while a health check cannot check (an invalid configuration: hma.remediation.blind), ``t`` the
unix time the fault was first seen, ``r`` the reboots for this fault within the window, ``j`` the
jobs on the node when the fault hit (at most 8), ``h`` why an action is held (``breaker``,
``rate``, ``policy``, ``dry_run``, ``not_owned``, ``maintenance``, ``unsupported``: the backend
lacks the capability; ``repair``, ``label``: a drain kept after a state loss), ``d`` when hma
drained the node (whether a boot came since: ``planner._owed``). The rest of the field is never
touched: the token is replaced in place, added at the end, or removed with its separating space.

Anyone with ``scontrol update`` rights can write this text: the readers return a typed label or
None (unreadable), never raise; every value they return is within its form and bounds (times
``dated``, text printable), and nothing in another node's label orders or resumes this node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from hma.adapters.text import plain, refused

PREFIX = "hma="
MAX_JOBS = 8


@dataclass(frozen=True)
class Label:
    """A parsed (or to be written) label token."""

    state: str
    code: str
    action: str
    component: str = ""
    since: float = 0.0
    reboots: int = 0
    jobs: tuple[str, ...] = ()
    held: str = ""
    drained: float = 0.0  # when hma drained the node (unix seconds, to the millisecond)

    def token(self) -> str:
        """The token text (every value cleaned to what the readers accept)."""
        parts = [f"{PREFIX}{self.state}:{self.code}:{self.action}"]
        component = _clean(self.component, 128)
        if component:
            parts.append(f"c={component}")
        if self.since:
            parts.append(f"t={int(self.since)}")
        if self.reboots:
            parts.append(f"r={self.reboots}")
        jobs = [j for j in (_clean(job, 32) for job in self.jobs) if j][:MAX_JOBS]
        if jobs:
            parts.append("j=" + "+".join(jobs))
        if self.held:
            parts.append(f"h={_clean(self.held, 32)}")
        if self.drained:
            parts.append(f"d={self.drained:.3f}")
        return ",".join(parts)


def _clean(text: str, limit: int) -> str:
    """``text`` as a field value: no blank, separator or character the terminal rule refuses
    (``hma.adapters.text.refused``: controls, bidi and format characters, tags), at most
    ``limit`` characters."""
    kept = (ch for ch in text if not refused(ch) and not ch.isspace() and ch not in ",+=")
    return "".join(kept)[:limit]


# Times in a label: 0 (none) or within [MIN_TIME, MAX_TIME]; a reader with a clock also refuses
# one more than SKEW seconds ahead of it (another node's clock may be a little ahead).
MIN_TIME = 1_000_000_000.0  # 2001-09-09: before any label hma wrote
MAX_TIME = 4_102_444_800.0  # 2100-01-01
SKEW = 300.0

STATES = ("unhealthy", "recovered", "blind")
ACTIONS = ("none", "reboot", "replace")
_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_HEAD = re.compile(r"[^\s,:]{1,64}")
_TIME = re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?")
_VALUES = {
    "c": re.compile(r"[^\s,+=]{1,128}"),
    "t": _TIME,
    "r": re.compile(r"[0-9]{1,4}"),
    "j": re.compile(r"[^\s,+=]{1,32}(\+[^\s,+=]{1,32}){0,7}"),
    "h": re.compile(r"[a-z_]{1,32}"),
    "d": _TIME,
}


def dated(ts: float, now: Optional[float] = None) -> bool:
    """``ts`` is a time a label may carry: 0 (none), or finite within [MIN_TIME, MAX_TIME] and,
    when ``now`` is given, not more than ``SKEW`` seconds after it."""
    if ts == 0:
        return True
    return MIN_TIME <= ts <= MAX_TIME and (now is None or ts <= now + SKEW)


def parse(token: str, now: Optional[float] = None) -> Optional[Label]:
    """A label from its token; None when it is not a well-formed hma token (unreadable): the
    head or a known field out of its form or bounds (``dated`` with ``now``), a known field twice.
    Fields hma does not know are skipped."""
    return _read(token, now, strict=False)


def parse_strict(token: str, now: Optional[float] = None) -> Optional[Label]:
    """A label only when every part of ``token`` is what hma writes (a known state, code and
    action; each field known, once, in its form); None otherwise. For a label hma would act on."""
    return _read(token, now, strict=True)


def _read(token: str, now: Optional[float], strict: bool) -> Optional[Label]:
    if not token.startswith(PREFIX):
        return None
    head, _, rest = token[len(PREFIX) :].partition(",")
    parts = head.split(":")
    if len(parts) != 3 or not all(_HEAD.fullmatch(p) and plain(p) for p in parts):
        return None
    if strict and (
        parts[0] not in STATES or not _CODE.fullmatch(parts[1]) or parts[2] not in ACTIONS
    ):
        return None
    values = _fields(rest, strict)
    if values is None:
        return None
    since, drained = float(values.get("t", 0)), float(values.get("d", 0))
    if not (dated(since, now) and dated(drained, now)):
        return None
    return Label(
        parts[0],
        parts[1],
        parts[2],
        values.get("c", ""),
        since,
        int(values.get("r", 0)),
        tuple(values["j"].split("+")) if "j" in values else (),
        values.get("h", ""),
        drained,
    )


def _fields(rest: str, strict: bool) -> Optional[dict[str, str]]:
    """The known fields of a token's tail, each in its form and printable; None when one is
    not, or is there twice (``strict``: also when an item is not a known field)."""
    values: dict[str, str] = {}
    for item in rest.split(",") if rest else ():
        key, sep, value = item.partition("=")
        form = _VALUES.get(key)
        if not sep or form is None:
            if strict:
                return None
            continue
        if key in values or not form.fullmatch(value) or not plain(value):
            return None
        values[key] = value
    return values


def find(text: str, now: Optional[float] = None) -> Optional[Label]:
    """The hma label in a field's text, if any and readable (``parse``)."""
    token = find_token(text, PREFIX)
    return parse(token, now) if token is not None else None


def edit(text: str, label: Optional[Label]) -> str:
    """``text`` with the hma token replaced by ``label`` (removed when None), the rest unchanged."""
    return edit_token(text, PREFIX, label.token() if label is not None else None)


def find_token(text: str, prefix: str) -> Optional[str]:
    """The first space-separated word of ``text`` that starts with ``prefix``, if any."""
    for word in text.split():
        if word.startswith(prefix):
            return word
    return None


def edit_token(text: str, prefix: str, token: Optional[str]) -> str:
    """``text`` with its ``prefix`` token replaced by ``token`` (removed when None), added at the
    end when absent; every other word and its spacing is kept (also used for job comments)."""
    words = text.split(" ")
    out: list[str] = []
    placed = False
    for word in words:
        if word.startswith(prefix):
            if token is not None and not placed:
                out.append(token)
                placed = True
            continue
        out.append(word)
    if token is not None and not placed:
        out.append(token)
    result = " ".join(out)
    if token is None or not placed:
        result = _squeeze(result, text)
    return result.strip(" ")


def _squeeze(result: str, original: str) -> str:
    """Drop the space a removed token leaves behind (keep other spacing as it was)."""
    while "  " in result and "  " not in original:
        result = result.replace("  ", " ")
    return result


def jobs_of(labels: Sequence[Optional[Label]]) -> tuple[str, ...]:
    """Jobs named by the first label that names any."""
    for item in labels:
        if item is not None and item.jobs:
            return item.jobs
    return ()


# --- the history mirror: ``hmah=`` ----------------------------------------------------------------
#
# The node's remediations within the window, one entry per episode, in the same field as the label
# (so that they survive a wiped state store, like ``r=``)::
#
#     hmah=[H<held since>,]<time>:<CODE>[,<time>:<CODE>...]
#
# ``H``: the node is held for a human (repeat offender) since that time; each entry the time of
# an episode's first remediation and its code. At most ``MAX_HISTORY`` entries, newest last
# (written once per episode: a reboot after the drain changes nothing). Read only through
# ``parse_history`` (strict: anything else is no history at all).

HISTORY_PREFIX = "hmah="
MAX_HISTORY = 8
_ENTRY = re.compile(r"([0-9]{1,12}):([A-Z][A-Z0-9_]{0,63})")
_HELD = re.compile(r"H([0-9]{1,12})")


@dataclass(frozen=True)
class History:
    """The mirrored history: (time, code) per episode, and since when the node is held for a
    human (0: it is not)."""

    entries: tuple[tuple[float, str], ...] = ()
    held: float = 0.0

    def token(self) -> Optional[str]:
        """The token text; None when there is nothing to mirror."""
        parts = [f"H{int(self.held)}"] if self.held else []
        for ts, code in self.entries[-MAX_HISTORY:]:
            parts.append(f"{int(ts)}:{code}")
        return HISTORY_PREFIX + ",".join(parts) if parts else None

    def within(self, now: float, window: float) -> int:
        """How many entries fall within ``window`` seconds before ``now`` (one dated more than
        ``SKEW`` after ``now`` never counts)."""
        return sum(1 for ts, _code in self.entries if now - window <= ts <= now + SKEW)


def parse_history(token: str, now: Optional[float] = None) -> Optional[History]:
    """The history of a ``hmah=`` token when every part is what hma writes and every time is
    ``dated`` (with ``now``: none beyond the skew into the future); None otherwise."""
    if not token.startswith(HISTORY_PREFIX):
        return None
    parts = token[len(HISTORY_PREFIX) :].split(",")
    held = 0.0
    if parts and _HELD.fullmatch(parts[0]):
        held = float(parts.pop(0)[1:])
    entries = []
    for part in parts:
        m = _ENTRY.fullmatch(part)
        if m is None:
            return None
        entries.append((float(m.group(1)), m.group(2)))
    times = [ts for ts, _code in entries] + ([held] if held else [])
    if not all(ts and dated(ts, now) for ts in times):
        return None
    if len(entries) > MAX_HISTORY or (not entries and not held):
        return None
    return History(tuple(entries), held)


def find_history(text: str, now: Optional[float] = None) -> Optional[History]:
    """The mirrored history in a field's text, if any (and well-formed: ``parse_history``)."""
    token = find_token(text, HISTORY_PREFIX)
    return parse_history(token, now) if token is not None else None


def edit_history(text: str, history: Optional[History]) -> str:
    """``text`` with the ``hmah=`` token replaced (removed when None or empty)."""
    return edit_token(text, HISTORY_PREFIX, history.token() if history is not None else None)


# --- the post-mortem: ``hmap=`` ----------------------------------------------------------------
#
# What killed the node's previous boot, as the agent read it on the next boot (the postmortem
# source's ``POSTMORTEM_CODE`` finding), in the same field as the label, for the controller's
# watcher (``hma watch``: what happened to a node it power-cycled)::
#
#     hmap=<time>:<CAUSE>
#
# ``time``: when the agent read it (unix seconds, in the boot that followed the crash);
# ``CAUSE``: the kernel-log code that ended the boot (KERNEL_PANIC, KERNEL_OOPS,
# KERNEL_MCE_HW_ERROR, KERNEL_HARD_LOCKUP, KERNEL_SOFT_LOCKUP, a GPU's Xid code...). The newest
# crash within ``remediation_window`` only; read only through ``parse_postmortem`` (strict).

POSTMORTEM_PREFIX = "hmap="
POSTMORTEM_CODE = "KERNEL_PREVIOUS_BOOT_CRASH"  # the finding the agent raises on the next boot
_POSTMORTEM = re.compile(r"([0-9]{1,12}):([A-Z][A-Z0-9_]{0,63})")


@dataclass(frozen=True)
class PostMortem:
    """The newest crash of a previous boot: when the agent read it, and its cause's code."""

    ts: float
    cause: str

    def token(self) -> str:
        """The token text."""
        return f"{POSTMORTEM_PREFIX}{int(self.ts)}:{self.cause}"


def parse_postmortem(token: str, now: Optional[float] = None) -> Optional[PostMortem]:
    """The post-mortem of a ``hmap=`` token when it is exactly what hma writes and its time is
    ``dated`` (with ``now``: not beyond the skew into the future); None otherwise."""
    if not token.startswith(POSTMORTEM_PREFIX):
        return None
    m = _POSTMORTEM.fullmatch(token[len(POSTMORTEM_PREFIX) :])
    if m is None:
        return None
    ts = float(m.group(1))
    if not ts or not dated(ts, now):
        return None
    return PostMortem(ts, m.group(2))


def find_postmortem(text: str, now: Optional[float] = None) -> Optional[PostMortem]:
    """The post-mortem in a field's text, if any and well-formed (``parse_postmortem``)."""
    token = find_token(text, POSTMORTEM_PREFIX)
    return parse_postmortem(token, now) if token is not None else None


def edit_postmortem(text: str, post: Optional[PostMortem]) -> str:
    """``text`` with the ``hmap=`` token replaced (removed when None)."""
    return edit_token(text, POSTMORTEM_PREFIX, post.token() if post is not None else None)
