"""Kernel-log rules as data: regular expressions over kernel messages that raise catalogue codes.

Built-in rules ship as ``*.toml`` in this package; sites add their own in ``rules_dir``
(``/etc/hma/rules.d/*.toml``), each file declaring the ``SITE_*`` codes its rules raise. One rule
set serves the ``kernel_log`` event source and ``hma logscan``. See docs/kernel-log.md.

A rule file::

    [[rules]]
    name = "nvrm-fallen-off-bus"          # unique, used in the finding's details
    needles = ["fallen off the bus"]      # literal prefilter: one must occur (cheap under storms)
    pattern = 'NVRM: GPU (?P<pci>[0-9a-f:.]+): GPU has fallen off the bus'  # Python regex,
    #                                     matched from the START of the message (re.match)
    code = "GPU_FALLEN_OFF_BUS"
    component = ["{gpu}", "node"]         # first template whose groups matched; {gpu} <- pci
    message = "GPU {pci} has fallen off the bus"
    # optional: severity / action (override the catalogue for this rule), kind = "xid" (a
    # decoder registered in the hma.kernel_log.decoders entry point group, built-in rules only),
    # before = 'regex' + before_lines = N (fill missing groups from the N previous lines),
    # count = N + window_s = S (raise only on the N-th match for one component within S seconds:
    # a storm), clears = true (the line says the fault is over: it clears (component, code)),
    # formats = ["hung-task"] (the rule reads the messages of these kernel formats that quote
    # users, hma.probes.kernel_log.formats; no other rule ever sees them)

    [codes.SITE_EXAMPLE]                  # site files only: catalogue entries for their rules
    summary = "..."  ...

A pattern (and ``before``) is matched from the start of the message, after the record's prefix
and time stamp (``re.match``, not ``re.search``): write the subsystem's printk format as the
driver prints it, prefix included, with each field in its real shape (``\\d+``, a PCI address),
never ``.*`` into text the kernel fills from user space.
"""

from __future__ import annotations

import collections
import functools
import re
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

try:
    from re import _parser as _sre_parse  # type: ignore[attr-defined]  # Python 3.11+
except ImportError:  # pragma: no cover - Python 3.9, 3.10
    import sre_parse as _sre_parse

from hma.adapters import tomlcompat
from hma.contracts.catalogue import Catalogue, CatalogueError, Entry, parse_entry
from hma.contracts.model import Action, Finding, Severity
from hma.probes.kernel_log import decoders, formats

MAX_MESSAGE = 4096  # characters of a message that rules see (longer ones are cut)
_RULE_KEYS = {
    "name",
    "kind",
    "needles",
    "pattern",
    "code",
    "component",
    "message",
    "severity",
    "action",
    "before",
    "before_lines",
    "count",
    "window_s",
    "clears",
    "formats",
}
MAX_STORM_KEYS = 4096  # (rule, component) pairs whose recent matches are remembered
MAX_NEEDLE_SETS = 1024  # sets of needles found together whose candidate rules are remembered


class RulesError(ValueError):
    """Rule files are malformed; ``errors`` holds one ``file: problem`` line each."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


@dataclass(frozen=True)
class Rule:
    """One compiled rule."""

    name: str
    kind: str  # "code" (raise ``code``) or the name of a registered decoder (decoders.load)
    pattern: re.Pattern[str]
    code: str
    needles: tuple[str, ...] = ()
    component: tuple[str, ...] = ("node",)
    message: str = ""
    severity: Optional[Severity] = None
    action: Optional[Action] = None
    before: Optional[re.Pattern[str]] = None
    before_lines: int = 0
    count: int = 1  # matches for one component within ``window_s`` that raise the finding
    window_s: float = 0.0
    clears: bool = False  # a match clears (component, code) instead of raising it
    origin: str = ""
    decoder: Optional[decoders.Decoder] = None  # the decoder of a kind other than "code"
    formats: tuple[str, ...] = ()  # the formats quoting users whose messages it reads (formats)


def derive_needles(pattern: re.Pattern[str]) -> list[str]:
    """A literal every match of ``pattern`` contains (the longest run of plain characters at its
    top level, 3 or more), as a one-needle list; [] when there is none (no prefilter then)."""
    if pattern.flags & re.IGNORECASE:
        return []
    try:
        parsed = _sre_parse.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001 - compiled already; a parser difference only costs speed
        return []
    best, run = "", ""
    for op, arg in [*parsed, (None, None)]:
        if op is _sre_parse.LITERAL:
            run += chr(arg)
            continue
        best, run = max(best, run, key=len), ""
    return [best] if len(best) >= 3 else []


@functools.lru_cache(maxsize=1024)
def _fields(template: str) -> tuple[str, ...]:
    """The named fields of a component or message template (cached: a few templates, parsed
    once, not per matching line)."""
    return tuple(f for _, f, _, _ in string.Formatter().parse(template) if f)


def compile_rule(raw: Mapping[str, Any], origin: str) -> Rule:
    """A rule from its TOML table; raises ``ValueError`` naming the problem."""
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(sorted(unknown))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("name: required string")
    kind = raw.get("kind", "code")
    decoder = _decoder(name, kind)
    pattern_text = raw.get("pattern", decoder.pattern if decoder else None)
    if not isinstance(pattern_text, str) or not pattern_text:
        raise ValueError(f"{name}: pattern: required string")
    try:
        pattern = re.compile(pattern_text)
        before = re.compile(raw["before"]) if "before" in raw else None
    except (re.error, TypeError) as exc:
        raise ValueError(f"{name}: bad regular expression: {exc}") from None
    code = raw.get("code", decoder.code if decoder else None)
    if not isinstance(code, str) or not code:
        raise ValueError(f"{name}: code: required string")
    needles = raw.get("needles", [])
    if not isinstance(needles, list) or not all(isinstance(n, str) and n for n in needles):
        raise ValueError(f"{name}: needles: expected a list of non-empty strings")
    if not needles:
        needles = derive_needles(pattern)
    component = raw.get("component", ["node"])
    if isinstance(component, str):
        component = [component]
    if not isinstance(component, list) or not all(isinstance(c, str) for c in component):
        raise ValueError(f"{name}: component: expected a string or a list of strings")
    groups = set(pattern.groupindex) | set(before.groupindex if before else ())
    groups.add("gpu")
    for template in [*component, str(raw.get("message", ""))]:
        missing = [f for f in _fields(template) if f not in groups]
        if missing:
            raise ValueError(f"{name}: template {template!r} names unknown group(s) {missing}")
    try:
        severity = Severity.parse(raw["severity"]) if "severity" in raw else None
        action = Action.parse(raw["action"]) if "action" in raw else None
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{name}: {exc}") from None
    before_lines = raw.get("before_lines", 3 if before else 0)
    if not isinstance(before_lines, int) or not 0 <= before_lines <= 32:
        raise ValueError(f"{name}: before_lines: expected an integer 0..32")
    count, window_s = raw.get("count", 1), raw.get("window_s", 0.0)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 100_000:
        raise ValueError(f"{name}: count: expected an integer 1..100000")
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or window_s < 0:
        raise ValueError(f"{name}: window_s: expected a number >= 0")
    if (count > 1) != (window_s > 0):
        raise ValueError(f"{name}: count and window_s go together (a storm: count > 1 in window_s)")
    clears = raw.get("clears", False)
    if not isinstance(clears, bool) or (clears and (kind != "code" or count > 1)):
        raise ValueError(f"{name}: clears: expected true or false, on a code rule without count")
    return Rule(
        name=name,
        kind=kind,
        pattern=pattern,
        code=code,
        needles=tuple(needles),
        component=tuple(component),
        message=str(raw.get("message", "")),
        severity=severity,
        action=action,
        before=before,
        before_lines=before_lines,
        count=count,
        window_s=float(window_s),
        clears=clears,
        origin=origin,
        decoder=decoder,
        formats=_quoting(name, raw.get("formats", [])),
    )


def _quoting(name: str, value: Any) -> tuple[str, ...]:
    """A rule's ``formats``: names of kernel formats that quote users (formats.FORMATS)."""
    if (
        not isinstance(value, list)
        or not all(isinstance(f, str) for f in value)
        or not set(value) <= formats.names()
    ):
        known = ", ".join(sorted(formats.names()))
        raise ValueError(f"{name}: formats: expected a list of kernel formats ({known})")
    return tuple(value)


def _decoder(name: str, kind: Any) -> Optional[decoders.Decoder]:
    """The decoder of a rule's ``kind`` (None for ``code``); raises ``ValueError``."""
    if kind == "code":
        return None
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{name}: kind must be 'code' or a registered decoder")
    try:
        return decoders.load(kind)
    except LookupError:
        raise ValueError(
            f"{name}: kind must be 'code' or a registered decoder ({decoders.GROUP}), not {kind!r}"
        ) from None
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _parse_file(name: str, text: str, site: bool) -> tuple[list[Rule], list[Entry], list[str]]:
    errors: list[str] = []
    try:
        data = tomlcompat.loads(text)
    except tomlcompat.TOMLDecodeError as exc:
        return [], [], [f"{name}: invalid TOML: {exc}"]
    extra = set(data) - {"rules", "codes"}
    if extra:
        errors.append(f"{name}: unknown table(s) {', '.join(sorted(extra))}")
    entries: list[Entry] = []
    codes = data.get("codes", {})
    if codes and not site:
        errors.append(f"{name}: built-in rule files declare no codes (the catalogue does)")
    if not isinstance(codes, dict):
        errors.append(f"{name}: codes: expected tables")
        codes = {}
    for code, raw in codes.items():
        if not code.startswith("SITE_"):
            errors.append(f"{name}: codes.{code}: site codes must start with SITE_")
            continue
        if not isinstance(raw, dict):
            errors.append(f"{name}: codes.{code}: expected a table")
            continue
        try:
            entries.append(parse_entry(code, raw))
        except CatalogueError as exc:
            errors.append(f"{name}: codes.{exc}")
    rules: list[Rule] = []
    raw_rules = data.get("rules", [])
    if not isinstance(raw_rules, list):
        errors.append(f"{name}: rules: expected [[rules]] tables")
        raw_rules = []
    for i, raw in enumerate(raw_rules):
        if not isinstance(raw, dict):
            errors.append(f"{name}: rules[{i}]: expected a table")
            continue
        try:
            rule = compile_rule(raw, name)
        except ValueError as exc:
            errors.append(f"{name}: rules[{i}]: {exc}")
            continue
        if site and (rule.kind != "code" or not rule.code.startswith("SITE_")):
            errors.append(f"{name}: rules[{i}] {rule.name}: site rules raise SITE_ codes only")
            continue
        rules.append(rule)
    return rules, entries, errors


def builtin_rules() -> list[Rule]:
    """The rules shipped with hma (``probes/kernel_log/rules/*.toml``, in file-name order)."""
    rules: list[Rule] = []
    errors: list[str] = []
    folder = resources.files(__name__)
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".toml"):
            more, _codes, errs = _parse_file(item.name, item.read_text(encoding="utf-8"), False)
            rules += more
            errors += errs
    if errors:
        raise RulesError(errors)
    return rules


def load_site(folder: Optional[str]) -> tuple[list[Rule], list[Entry]]:
    """Site rules and the SITE_ codes they declare, from ``folder/*.toml`` (absent: none).

    Raises ``RulesError`` with every problem at once; a rule whose code no site file declares
    (and that is not a built-in SITE_ code) is an error too.
    """
    if not folder:
        return [], []
    path = Path(folder)
    if not path.is_dir():
        return [], []
    rules: list[Rule] = []
    entries: list[Entry] = []
    errors: list[str] = []
    for item in sorted(path.glob("*.toml")):
        try:
            text = item.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{item}: cannot read: {exc}")
            continue
        more, codes, errs = _parse_file(str(item), text, True)
        rules += more
        entries += codes
        errors += errs
    seen: set[str] = set()
    for entry in entries:
        if entry.code in seen:
            errors.append(f"{folder}: {entry.code} declared twice")
        seen.add(entry.code)
    if errors:
        raise RulesError(errors)
    return rules, entries


# Bytes rare in kernel logs, rarest first: each makes up at most 0.12 % of the bytes of the real
# logs of tests/fixtures/kernel-log/corpus (460,000 bytes; 'G' and 'O', as rare there, are left
# out: every NVIDIA line holds "GPU", every I/O line "I/O"). A needle holding
# one is found by looking for that byte alone (``bytes.find`` of one byte: memchr, one pass for
# every needle that byte gates) and comparing the needle where it would start; any other needle
# is one pass of its own. A pass costs about as much whatever the needle's length: fewer passes,
# faster noise (docs/kernel-log.md, "Throughput").
RARE = "%`|^{}~?!\t;ZYj@<J*W'q\"QKzH+V\\#"


class Prefilter:
    """Which of a rule set's needles a line holds: one pass over a block per gate (a rare byte
    that several needles share, :data:`RARE`) or per needle without one, instead of one pass per
    needle. The kernel_log source asks it of each message (:meth:`found`), ``hma logscan`` of
    each block (:meth:`lines`): one piece of logic for both."""

    def __init__(self, needles: Iterable[str]) -> None:
        self.needles = tuple(sorted(set(needles)))
        whole: list[str] = []
        gated: dict[str, list[str]] = {}
        for needle in self.needles:
            gate = next((c for c in RARE if c in needle), None)
            if gate is None:
                whole.append(needle)
            else:
                gated.setdefault(gate, []).append(needle)
        self._whole = tuple(whole)
        self._whole_bytes = tuple((n.encode(), n) for n in whole)
        # gate -> the needles it gates; in bytes with the gate's offset in each needle
        self._gated = tuple((g, tuple(ns)) for g, ns in gated.items())
        self._gated_bytes = tuple(
            (g.encode(), tuple((n.encode(), n.encode().index(g.encode()), n) for n in ns))
            for g, ns in gated.items()
        )

    def passes(self) -> int:
        """Passes over a block that :meth:`lines` makes (one per gate, one per other needle)."""
        return len(self._whole) + len(self._gated)

    def found(self, message: str) -> list[str]:
        """The needles ``message`` holds."""
        out = [n for n in self._whole if n in message]
        for gate, needles in self._gated:
            if gate in message:
                out += [n for n in needles if n in message]
        return out

    def lines(self, block: bytes) -> dict[int, list[str]]:
        """Line end (the offset of its newline) -> the needles the line holds, for each line of
        ``block`` (whole lines, each ending with a newline) that holds one."""
        found: dict[int, list[str]] = {}
        find, starts = block.find, block.startswith  # (bound once: a storm makes many calls)
        for needle, text in self._whole_bytes:
            pos = find(needle)
            while pos >= 0:  # every block ends with a newline: the next search is further on
                end = find(b"\n", pos)
                held = found.get(end)
                if held is None:
                    found[end] = [text]
                else:
                    held.append(text)
                pos = find(needle, end + 1)
        for gate, checks in self._gated_bytes:
            pos = find(gate)
            while pos >= 0:
                for needle, offset, text in checks:
                    if pos >= offset and starts(needle, pos - offset):
                        end = find(b"\n", pos)
                        held = found.get(end)
                        if held is None:
                            found[end] = [text]
                        elif text not in held:
                            held.append(text)
                pos = find(gate, pos + 1)
        return found


class RuleSet:
    """Built-in rules followed by site rules; the first matching rule of a line wins."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        names = [r.name for r in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RulesError([f"rule name(s) used twice: {', '.join(dupes)}"])
        self.history = max((r.before_lines for r in self.rules), default=0)
        # the needles of the rules that look back (``before``): a caller that skips lines sets
        # the context (Matcher.lazy_context) only for a message holding one of them (None: such
        # a rule has no needle, any message may need it)
        looking_back = [r for r in self.rules if r.before is not None]
        self.look_back: Optional[frozenset[str]] = frozenset(
            n for r in looking_back for n in r.needles
        )
        if not all(r.needles for r in looking_back):
            self.look_back = None
        # the literal prefilter: a message without any of these matches no rule (None: a rule
        # without a literal, every message goes through the regular expressions)
        self.needles: Optional[tuple[str, ...]] = None
        if all(r.needles for r in self.rules):
            self.needles = tuple(sorted({n for r in self.rules for n in r.needles}))
        # needle -> the rules (their positions) that need it, so that a message is tried only
        # against the rules whose literals it holds; rules without needles are always tried
        by_needle: dict[str, list[int]] = {}
        for i, rule in enumerate(self.rules):
            for needle in rule.needles:
                by_needle.setdefault(needle, []).append(i)
        self.by_needle: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in by_needle.items()}
        self.always: tuple[int, ...] = tuple(i for i, r in enumerate(self.rules) if not r.needles)
        # a format quoting users -> the rules (positions) that read its messages (no other does)
        by_format: dict[str, list[int]] = {}
        for i, rule in enumerate(self.rules):
            for name in rule.formats:
                by_format.setdefault(name, []).append(i)
        self.by_format: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in by_format.items()}
        self.prefilter = Prefilter(by_needle)

    @classmethod
    def load(cls, site_folder: Optional[str] = None) -> RuleSet:
        """Built-in plus site rules; raises ``RulesError``."""
        site, _codes = load_site(site_folder)
        return cls([*builtin_rules(), *site])

    def codes(self) -> set[str]:
        """Codes the rules can raise (a decoder's rules: every code the decoder can raise)."""
        out = {r.code for r in self.rules if r.kind == "code"}
        for decoder in self._decoders():
            out |= decoder.codes()
        return out

    def prepare(self) -> None:
        """Let the decoders read ahead what their first line would read (the Xid catalogue:
        14-28 ms that were on the path from the line to the drain, docs/scale.md)."""
        for decoder in self._decoders():
            decoder.prepare()

    def tell_apart(self) -> dict[str, str]:
        """The catch-all codes of the decoders and the detail that tells their faults apart
        (for :class:`hma.probes.kernel_log.dedup.Dedup`)."""
        out: dict[str, str] = {}
        for decoder in self._decoders():
            out.update(decoder.tell_apart)
        return out

    def _decoders(self) -> list[decoders.Decoder]:
        """The decoders of the rules, each once, in rule order."""
        out: list[decoders.Decoder] = []
        for rule in self.rules:
            if rule.decoder is not None and rule.decoder not in out:
                out.append(rule.decoder)
        return out

    def check(self, catalogue: Catalogue) -> list[str]:
        """Problems: rule codes the catalogue does not declare."""
        return [
            f"{r.origin}: rule {r.name} raises {r.code}, which the catalogue does not declare"
            for r in self.rules
            if r.kind == "code" and r.code not in catalogue
        ]

    def matcher(self, source: str = "kernel_log") -> Matcher:
        """A stateful matcher (it remembers the previous lines for multi-line rules)."""
        return Matcher(self, source)


class Match:
    """What the first matching rule makes of one message: the fault (``code``, ``component``,
    ``severity``, as its finding carries them), and :meth:`finding`, which builds the finding
    only when asked (``hma logscan`` counts repeats of a fault it holds without building one)."""

    __slots__ = ("code", "component", "severity", "_build", "_args")

    def __init__(
        self,
        code: str,
        component: str,
        severity: Optional[Severity],
        build: Callable[..., Finding],
        args: tuple[Any, ...],
    ) -> None:
        self.code = code
        self.component = component
        self.severity = severity
        self._build = build  # build(*args, evidence, ts)
        self._args = args

    def finding(self, evidence: Optional[Mapping[str, Any]] = None, ts: float = 0.0) -> Finding:
        """The finding, ``evidence`` in its details (after the line and the rule's name)."""
        return self._build(*self._args, evidence or {}, ts)


class _Groups(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


class Matcher:
    """Feeds kernel messages one at a time through a rule set."""

    def __init__(self, ruleset: RuleSet, source: str) -> None:
        self.rules = ruleset.rules
        self.needles = ruleset.needles
        self._found = ruleset.prefilter.found
        self._by_needle = ruleset.by_needle
        self._always = ruleset.always
        self._by_format = ruleset.by_format
        # the needles found in a message -> the rules (positions, in order) to try
        self._candidates: dict[tuple[str, ...], tuple[int, ...]] = {}
        # each rule's component templates with the fields they need (not parsed per line)
        self._components = [
            tuple((t, frozenset(_fields(t))) for t in rule.component) for rule in self.rules
        ]
        # each rule's decoder (its bound ``fault``), None for a code rule: looked up once
        self._decode = tuple(None if r.decoder is None else r.decoder.fault for r in self.rules)
        self.source = source
        self._recent: collections.deque[str] = collections.deque(maxlen=max(ruleset.history, 1))
        self._pending: Optional[Callable[[], Sequence[str]]] = None
        # storm rules: (rule, component) -> times of its recent matches
        self._storms: dict[tuple[str, str], collections.deque[float]] = {}

    def feed(
        self,
        message: str,
        ts: float = 0.0,
        evidence: Optional[Mapping[str, Any]] = None,
        at: Union[None, float, Callable[[], Optional[float]]] = None,
        needles: Optional[Sequence[str]] = None,
    ) -> Optional[Finding]:
        """The finding of the first rule that matches ``message``, or None (:meth:`match`);
        ``evidence`` goes into its details."""
        match = self.match(message, at, needles)
        return None if match is None else match.finding(evidence, ts)

    def match(
        self,
        message: str,
        at: Union[None, float, Callable[[], Optional[float]]] = None,
        needles: Optional[Sequence[str]] = None,
    ) -> Optional[Match]:
        """The fault that the first rule matching ``message`` raises, or None.

        ``needles``: the rules' needles the caller already found in the line the message comes
        from (``hma logscan`` finds them in whole blocks), which saves looking for them again;
        a superset of those in the message is fine (a rule's expression still decides).

        ``at`` is the record's own time in seconds (the kernel's monotonic stamp, the time a
        saved line carries; or a function that returns it, called only when a storm rule
        matches), which storm rules (``count`` in ``window_s``) count by; None where the line
        has none: then ``count`` matches make a storm whatever their spacing. A clearing rule's
        finding has severity ``ok``."""
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE]
        try:
            found = self._found(message) if needles is None else needles
            if not found and not self._always:
                return None  # the common case: literal checks only, no regular expression
            quoted = formats.classify(message)
            if quoted is not None:  # a format that quotes a user: its own rules only
                return self._match(message, at, self._by_format.get(quoted.name, ()))
            key = tuple(found)
            candidates = self._candidates.get(key)
            if candidates is None:
                if len(self._candidates) >= MAX_NEEDLE_SETS:
                    self._candidates.clear()
                candidates = self._candidates[key] = tuple(
                    sorted({*self._always, *(i for n in found for i in self._by_needle[n])})
                )
            return self._match(message, at, candidates)
        finally:
            if self._pending is not None:  # not needed: the lines before are unknown here
                self._pending = None
                self._recent.clear()
            self._recent.append(message)

    def context(self, messages: Sequence[str]) -> None:
        """The messages before the next one fed (for multi-line rules), when the caller skipped
        lines without feeding them (``hma logscan`` feeds prefiltered lines only)."""
        self._recent.clear()
        self._recent.extend(m[:MAX_MESSAGE] for m in messages)

    def lazy_context(self, messages: Callable[[], Sequence[str]]) -> None:
        """:meth:`context` computed only if a multi-line rule looks back (bounded cost per line)."""
        self._pending = messages

    def _match(
        self,
        message: str,
        at: Union[None, float, Callable[[], Optional[float]]],
        candidates: Sequence[int],
    ) -> Optional[Match]:
        """The first of the ``candidates`` rules (positions, in rule order) that matches."""
        for i in candidates:
            rule = self.rules[i]
            decode = self._decode[i]
            if decode is not None:  # its pattern is the decoder's: decode once
                fault = decode(message)
                if fault is None:
                    continue
                code, component, severity = fault
                severity = rule.severity or severity  # as _override decides
                return Match(code, component, severity, self._decoded, (rule, message))
            m = rule.pattern.match(message)
            if m is None:
                continue
            groups = m.groupdict()
            if None in groups.values():
                groups = {k: v for k, v in groups.items() if v is not None}
            if rule.before is not None and not groups.keys() >= rule.before.groupindex.keys():
                groups.update(self._look_back(rule))
            if "pci" in groups:
                groups["gpu"] = decoders.component_of(groups["pci"])
            component = _component(self._components[i], groups)
            if rule.count > 1 and not self._storm(rule, component, at):
                return None  # one more match counted; not (yet) a storm
            severity = Severity.OK if rule.clears else rule.severity
            args = (rule, message, groups, component)
            return Match(rule.code, component, severity, self._finding, args)
        return None

    def _decoded(self, rule: Rule, message: str, evidence: Mapping[str, Any], ts: float) -> Finding:
        assert rule.decoder is not None  # only a decoder's rule matched so
        details = {"line": message[:1000], "rule": rule.name, **evidence}
        return _override(rule.decoder.finding(message, details, self.source, ts), rule)

    def _finding(
        self,
        rule: Rule,
        message: str,
        groups: dict[str, str],
        component: str,
        evidence: Mapping[str, Any],
        ts: float,
    ) -> Finding:
        details = {"line": message[:1000], "rule": rule.name, **evidence, **groups}
        details.pop("gpu", None)  # derived from pci, not evidence
        if rule.count > 1:
            details.update(storm_count=rule.count, storm_window_s=rule.window_s)
        message_text = rule.message.format_map(_Groups(groups)) if rule.message else message
        return Finding(
            rule.code,
            component,
            message_text[:400],
            details,
            Severity.OK if rule.clears else rule.severity,
            Action.NONE if rule.clears else rule.action,
            probe=self.source,
            ts=ts,
        )

    def _storm(
        self, rule: Rule, component: str, at: Union[None, float, Callable[[], Optional[float]]]
    ) -> bool:
        """Count one match of a storm rule; whether it is the ``count``-th for this component
        within ``window_s`` (the count then starts again)."""
        if callable(at):
            at = at()
        key = (rule.name, component)
        times = self._storms.get(key)
        if times is None:
            if len(self._storms) >= MAX_STORM_KEYS:  # bounded under hostile input
                self._storms.clear()
            times = self._storms[key] = collections.deque(maxlen=rule.count)
        if at is not None:
            while times and at - times[0] > rule.window_s:
                times.popleft()
        times.append(at if at is not None else 0.0)
        if len(times) < rule.count:
            return False
        times.clear()
        return True

    def _look_back(self, rule: Rule) -> dict[str, str]:
        assert rule.before is not None
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.context(pending())
        for previous in list(self._recent)[-rule.before_lines :][::-1]:
            m = rule.before.match(previous)
            if m:
                return {k: v for k, v in m.groupdict().items() if v is not None}
        return {}


def _override(finding: Finding, rule: Rule) -> Finding:
    if rule.severity is None and rule.action is None:
        return finding
    return finding.with_(
        severity=rule.severity or finding.severity, action=rule.action or finding.action
    )


def _component(templates: Sequence[tuple[str, frozenset[str]]], groups: dict[str, str]) -> str:
    """The first component template (with its fields) whose fields all matched, filled in."""
    for template, fields in templates:
        if fields <= groups.keys():
            return template.format_map(groups)
    return "node"
