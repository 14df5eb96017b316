"""The finding catalogue: every code the agent can emit, declared once as data.

Each ``*.toml`` file in this package holds one table per code (files are split by domain only to
keep them readable). Codes are never renamed. A test checks that every code the program can emit is
declared here and that every declared code is emitted somewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from hma.adapters import tomlcompat
from hma.contracts.model import Action, Clears, Finding, Severity
from hma.contracts.options import parse_duration

CODE_RE = re.compile(r"^(GPU|NEURON|EFA|IB|SYS|KERNEL|HMA|SLURM|SITE|DEEP)_[A-Z0-9_]+$")
FAMILIES = ("GPU", "NEURON", "EFA", "IB", "SYS", "KERNEL", "HMA", "SLURM", "SITE", "DEEP")

_DEFAULT_FAIL_AFTER = 2
_DEFAULT_CLEAR_AFTER = 2

MODES = ("act", "observe")  # observe: decided, recorded and alerted, never acted on
PER = ("component", "node")  # what the occurrences of a code are counted per
MAX_WITHIN_S = 366 * 86400.0


@dataclass(frozen=True)
class Entry:
    """One catalogue entry (see docs/catalogue.md for the meaning of each field)."""

    code: str
    summary: str
    remedy: str
    severity: Severity
    action: Action
    clears: Clears
    drains: bool
    fatal: bool = False
    fail_after: int = _DEFAULT_FAIL_AFTER
    clear_after: int = _DEFAULT_CLEAR_AFTER
    window_s: float = 0.0
    enabled: bool = True
    after: int = 1  # occurrences within ``within`` seconds before the code takes its severity
    within: float = 0.0
    per: str = "component"
    mode: str = "act"
    reset_gpu: bool = False  # a GPU reset may clear it (NVIDIA's resolution RESET_GPU)
    source: str = ""  # what the detector is grounded in: driver source file and format, document
    # The cluster's scheduler took the node out itself (a drain hma reports, and takes over only
    # with [recovery] adopt_slurm_drains); never on a code hma's own probes detect
    scheduler: bool = False

    @property
    def family(self) -> str:
        """Code family (prefix), which selects the journald MESSAGE_ID."""
        return self.code.split("_", 1)[0]

    @property
    def counted(self) -> bool:
        """Whether occurrences are counted (``after`` > 1): below the count the code is a
        warning that never drains (``below``), at the count it takes its severity and action."""
        return self.after > 1

    @property
    def watch_s(self) -> float:
        """How long a counted code stays shown below its threshold without a recurrence: its
        ``window_s`` when it has one, else ``within`` (its occurrences still count for
        ``within``)."""
        return self.window_s if self.window_s > 0 else self.within

    @property
    def observe(self) -> bool:
        """Observe (shadow) mode: decided and alerted as what it would do, never acted on."""
        return self.mode == "observe"

    def threshold_text(self) -> str:
        """``3 within 1 h on one GPU``-style words for docs, ``hma explain`` and status."""
        scope = "on the node" if self.per == "node" else "on one component"
        return f"{self.after} occurrences within {seconds_text(self.within)} {scope}"


def below(severity: Severity) -> tuple[Severity, Action]:
    """Severity and action of a counted code below its threshold: at most a warning, no
    action (an ``unknown`` stays unknown: it is not an occurrence)."""
    if severity is Severity.UNKNOWN or severity.rank <= Severity.WARNING.rank:
        return severity, Action.NONE
    return Severity.WARNING, Action.NONE


def seconds_text(seconds: float) -> str:
    """A duration in its largest whole unit: ``1 h``, ``90 min``, ``7 d``, ``45 s``."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


_FIELDS: dict[str, Any] = {
    "summary": str,
    "remedy": str,
    "severity": str,
    "action": str,
    "clears": str,
    "drains": bool,
    "fatal": bool,
    "fail_after": int,
    "clear_after": int,
    "window_s": (int, float),
    "enabled": bool,
    "after": int,
    "within": (int, float, str),
    "per": str,
    "mode": str,
    "reset_gpu": bool,
    "source": str,
    "scheduler": bool,
}


class CatalogueError(ValueError):
    """A catalogue file is malformed."""


def parse_entry(code: str, raw: Mapping[str, Any]) -> Entry:
    """Build an entry from its TOML table; raises ``CatalogueError`` naming the problem."""
    if not CODE_RE.match(code):
        raise CatalogueError(f"{code}: code must be UPPER_SNAKE with a known domain prefix")
    for key, value in raw.items():
        kind = _FIELDS.get(key)
        if kind is None:
            raise CatalogueError(f"{code}.{key}: unknown field")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CatalogueError(f"{code}.{key}: wrong type {type(value).__name__}")
    for key in ("summary", "remedy", "severity", "action", "clears"):
        if key not in raw:
            raise CatalogueError(f"{code}.{key}: missing")
    try:
        entry = Entry(
            code=code,
            summary=raw["summary"],
            remedy=raw["remedy"],
            severity=Severity.parse(raw["severity"]),
            action=Action.parse(raw["action"]),
            clears=Clears(raw["clears"]),
            drains=bool(raw.get("drains", code.split("_", 1)[0] != "HMA")),
            fatal=bool(raw.get("fatal", False)),
            fail_after=int(raw.get("fail_after", _DEFAULT_FAIL_AFTER)),
            clear_after=int(raw.get("clear_after", _DEFAULT_CLEAR_AFTER)),
            window_s=float(raw.get("window_s", 0.0)),
            enabled=bool(raw.get("enabled", True)),
            after=int(raw.get("after", 1)),
            within=parse_duration(raw.get("within", 0.0)),
            per=str(raw.get("per", "component")),
            mode=str(raw.get("mode", "act")),
            reset_gpu=bool(raw.get("reset_gpu", False)),
            source=str(raw.get("source", "")),
            scheduler=bool(raw.get("scheduler", False)),
        )
    except ValueError as exc:
        raise CatalogueError(f"{code}: {exc}") from None
    problem = policy_problem(entry.after, entry.within, entry.per, entry.mode)
    if problem:
        raise CatalogueError(f"{code}.{problem}")
    if entry.family == "HMA" and entry.drains:
        raise CatalogueError(f"{code}: agent codes never drain")
    if entry.clears is Clears.WINDOW and entry.window_s <= 0:
        raise CatalogueError(f"{code}.window_s: required when clears = 'window'")
    if entry.reset_gpu and (entry.family != "GPU" or not entry.drains):
        raise CatalogueError(f"{code}.reset_gpu: only for GPU codes that drain")
    if entry.scheduler and not entry.drains:
        raise CatalogueError(f"{code}.scheduler: only for codes that drain")
    if entry.fail_after < 1 or entry.clear_after < 1:
        raise CatalogueError(f"{code}: fail_after and clear_after must be >= 1")
    return entry


OVERRIDABLE = (
    "severity",
    "action",
    "fail_after",
    "clear_after",
    "enabled",
    "window_s",
    "after",
    "within",
    "per",
    "mode",
)


def policy_problem(after: int, within: float, per: str, mode: str) -> str:
    """``key: problem`` when the count-in-window and mode fields do not fit together, else ''."""
    if after < 1:
        return f"after: must be >= 1, got {after}"
    if after > 1 and not 0 < within <= MAX_WITHIN_S:
        return f"within: required with after = {after}: a duration > 0 and <= 366 days"
    if per not in PER:
        return f"per: expected one of {', '.join(map(repr, PER))}, got {per!r}"
    if mode not in MODES:
        return f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}"
    return ""


_HEADER = re.compile(r"^\[([^\]\s]+)\][ \t]*(?:#.*)?$", re.MULTILINE)


class _Shipped:
    """The ``*.toml`` files of this package, each parsed when one of its codes is first asked
    for (``hma check system`` reads sys.toml, not the 48 KB of every file): an index of the table
    headers is read first, and a parsed file whose tables differ from the index is an error."""

    def __init__(self) -> None:
        self.index: dict[str, str] = {}  # code -> file
        self._texts: dict[str, str] = {}
        self._parsed: dict[str, dict[str, Entry]] = {}
        for item in sorted(Path(__file__).parent.iterdir(), key=lambda p: p.name):
            name = item.name
            if not name.endswith(".toml"):
                continue
            self._texts[name] = item.read_text(encoding="utf-8")
            for code in _HEADER.findall(self._texts[name]):
                if code in self.index:
                    raise CatalogueError(f"{code}: declared twice")
                self.index[code] = name

    def entry(self, code: str) -> Entry:
        """The built-in entry of an indexed code."""
        name = self.index[code]
        if name not in self._parsed:
            try:
                data = tomlcompat.loads(self._texts[name])
            except tomlcompat.TOMLDecodeError as exc:
                raise CatalogueError(f"{name}: {exc}") from None
            if sorted(data) != sorted(c for c, n in self.index.items() if n == name):
                raise CatalogueError(f"{name}: a code not declared as a [CODE] table")
            entries = {}
            for key, raw in data.items():
                if not isinstance(raw, dict):
                    raise CatalogueError(f"{name}: {key} is not a table")
                entries[key] = parse_entry(key, raw)
            self._parsed[name] = entries
        return self._parsed[name][code]


class Catalogue:
    """All entries, with the operator's ``[codes.<CODE>]`` overrides applied.

    The shipped entries are read when first used (``load_builtin``); iterating or ``len`` reads
    them all."""

    def __init__(
        self,
        entries: Iterable[Entry],
        overridden: Optional[Mapping[str, frozenset[str]]] = None,
        shipped: Optional[_Shipped] = None,
        overrides: Optional[Mapping[str, Mapping[str, Any]]] = None,
    ) -> None:
        self._overridden = dict(overridden or {})
        self._overrides = dict(overrides or {})  # applied to shipped entries when read
        self._shipped = shipped
        self._entries: dict[str, Entry] = {}
        for entry in entries:
            if entry.code in self._entries or (shipped and entry.code in shipped.index):
                raise CatalogueError(f"{entry.code}: declared twice")
            self._entries[entry.code] = entry

    def __contains__(self, code: object) -> bool:
        return code in self._entries or bool(self._shipped and code in self._shipped.index)

    def _all(self) -> list[Entry]:
        codes = [*self._entries, *(self._shipped.index if self._shipped else ())]
        return [e for e in map(self.get, dict.fromkeys(codes)) if e is not None]

    def __iter__(self) -> Any:
        return iter(sorted(self._all(), key=lambda e: natural_key(e.code)))

    def __len__(self) -> int:
        return len(self._all())

    def get(self, code: str) -> Optional[Entry]:
        """The entry for ``code``, or None."""
        found = self._entries.get(code)
        if found is None and self._shipped and code in self._shipped.index:
            found = _overridden(self._shipped.entry(code), self._overrides.get(code))
            self._entries[code] = found
        return found

    def entry(self, code: str) -> Entry:
        """The entry for ``code``; codes outside the catalogue fall back to ``HMA_UNCATALOGUED``."""
        found = self.get(code)
        if found is not None:
            return found
        return self.entry("HMA_UNCATALOGUED")

    def extended(self, entries: Iterable[Entry]) -> Catalogue:
        """A new catalogue with more entries (site codes declared in rule files); only ``SITE_``
        codes may be added and none may be declared twice (``CatalogueError``)."""
        added = list(entries)
        for entry in added:
            if entry.family != "SITE":
                raise CatalogueError(f"{entry.code}: site declarations must use SITE_ codes")
        read = [e for e in self._entries.values() if not self._is_shipped(e.code)]
        return Catalogue([*read, *added], self._overridden, self._shipped, self._overrides)

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> Catalogue:
        """A new catalogue with ``[codes.<CODE>]`` tables applied (validated by the config)."""
        merged = dict(self._overrides)
        overridden = dict(self._overridden)
        for code, raw in overrides.items():
            if raw and code in self:
                merged[code] = {**merged.get(code, {}), **raw}
                overridden[code] = overridden.get(code, frozenset()) | frozenset(raw)
        own = [
            _overridden(e, overrides.get(e.code))
            for e in self._entries.values()
            if not self._is_shipped(e.code)
        ]
        return Catalogue(own, overridden, self._shipped, merged)

    def _is_shipped(self, code: str) -> bool:
        return bool(self._shipped and code in self._shipped.index)

    def resolve(self, finding: Finding) -> Finding:
        """The finding with severity and action filled from the catalogue.

        A probe may set a severity itself (e.g. ``unknown`` when it could not measure); an
        operator override of the code's severity wins over both, except over ``unknown`` and
        ``ok`` (a kernel-log line saying the fault is over).
        """
        entry = self.entry(finding.code)
        fields = self._overridden.get(entry.code, frozenset())
        severity = finding.severity
        if severity is None or (
            "severity" in fields and severity not in (Severity.UNKNOWN, Severity.OK)
        ):
            severity = entry.severity
        action = finding.action
        if action is None or "action" in fields:
            action = entry.action
        return finding.with_(severity=severity, action=action)

    def at_count(self, finding: Finding, occurrences: int) -> Finding:
        """A resolved finding as the health model shows its ``occurrences``-th sighting when
        there is no other history (``hma logscan``): below a counted code's ``after`` it is at
        most a warning, without action."""
        entry = self.entry(finding.code)
        if not entry.counted or occurrences >= entry.after or finding.severity is None:
            return finding
        severity, action = below(finding.severity)
        return finding.with_(severity=severity, action=action)

    def resolve_all(self, findings: Sequence[Finding]) -> list[Finding]:
        """Each finding resolved, codes the operator disabled dropped, and a code outside the
        catalogue reported as ``HMA_UNCATALOGUED`` (its code kept in the details)."""
        out = []
        for finding in findings:
            if self.entry(finding.code).enabled:
                resolved = self.resolve(finding)
                if finding.code not in self:
                    resolved = resolved.with_(
                        details={**resolved.details, "uncatalogued_code": finding.code},
                        code="HMA_UNCATALOGUED",
                    )
                out.append(resolved)
        return out


def _overridden(entry: Entry, raw: Optional[Mapping[str, Any]]) -> Entry:
    """``entry`` with one ``[codes.<CODE>]`` table applied."""
    if not raw:
        return entry
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "severity":
            value = Severity.parse(value)
        elif key == "action":
            value = Action.parse(value)
        elif key == "within":
            value = parse_duration(value)
        changes[key] = value
    return replace(entry, **changes)


def natural_key(code: str) -> tuple[Any, ...]:
    """Sort key that orders numbers by value: GPU_XID_13 before GPU_XID_109."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", code))


def clears_text(entry: Entry) -> str:
    """How an active fault of this code goes away, in words."""
    return {
        Clears.OBSERVATION: f"by itself after {entry.clear_after} consecutive good observations",
        Clears.REBOOT: "when the node reboots (a new boot id)",
        Clears.OPERATOR: f"when an operator runs `hma ack {entry.code}`",
        Clears.WINDOW: f"by itself when it has not recurred for {entry.window_s:g} s",
    }[entry.clears] + (
        f"; below its threshold, also when it has not recurred for {seconds_text(entry.watch_s)}"
        if entry.counted
        else ""
    )


def explain(entry: Entry) -> str:
    """``hma explain CODE``: the entry in words, each line true for the code's default severity."""
    if not entry.drains:
        drains = "no"
    elif entry.severity is Severity.CRITICAL:
        drains = "yes, at its threshold (below it never)" if entry.counted else "yes"
    else:
        drains = (
            f"not at its severity {entry.severity}; yes when a probe or rule reports it "
            f"critical, or [codes.{entry.code}] overrides its severity"
        )
    onset = (
        "on the first observation"
        if entry.fatal
        else f"after {entry.fail_after} consecutive bad observations"
    )
    if entry.counted:
        onset = (
            f"as a warning at each occurrence; {entry.severity} with action {entry.action} "
            f"at {entry.threshold_text()}"
        )
    mode = ""
    if entry.observe:
        mode = "  mode:      observe (decided and alerted as what it would do, never acted on)\n"
    return (
        f"{entry.code}\n  {entry.summary}\n\n"
        f"  severity:  {entry.severity}\n  action:    {entry.action}\n  drains:    {drains}\n"
        f"  raised:    {onset}\n  clears:    {clears_text(entry)}\n{mode}\n"
        f"  What to do: {entry.remedy}" + (f"\n\n  Source: {entry.source}" if entry.source else "")
    )


def suggest(cat: Catalogue, text: str) -> list[str]:
    """Codes the user may have meant by ``text`` (``79`` -> GPU_XID_79, ``MCE``, typos)."""
    import difflib

    wanted = text.strip().upper()
    codes = [e.code for e in cat]
    found = [f"{family}_{wanted}" for family in FAMILIES if f"{family}_{wanted}" in cat]
    if wanted.isdigit() and wanted.isascii():  # an Xid number
        xid = f"GPU_XID_{int(wanted)}"
        found.append(xid if xid in cat else "GPU_XID_OTHER")
    if wanted:
        found += [c for c in codes if wanted in c]
    found += difflib.get_close_matches(wanted, codes, n=3, cutoff=0.6)
    return list(dict.fromkeys(found))[:5]


def load_builtin() -> Catalogue:
    """The ``*.toml`` files shipped in this package (each read when first used)."""
    return Catalogue([], shipped=_Shipped())
