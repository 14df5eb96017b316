"""``hma logscan FILE...``: the kernel-log rules over saved logs (the triage tool for dead nodes).

Reads plain dmesg, ``dmesg --ctime``/``--decode``, ISO-time logs, /dev/kmsg records, syslog and
journal lines (``journalctl -o short*``, ``-o json``; gzip-compressed files too, ``-`` for
stdin). Repeats of one (component, code, severity) are one finding with a count, the first
matching line as evidence and the last one beside it. The exit code is the worst severity, as
for ``hma check``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import re
import sys
import zlib
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, Mapping, Optional, Sequence

from hma.adapters.text import printable
from hma.contracts.catalogue import Catalogue
from hma.contracts.model import Finding, Severity
from hma.contracts.severity import worst
from hma.probes.kernel_log import formats
from hma.probes.kernel_log.lines import line_time, saved_line
from hma.probes.kernel_log.rules import RuleSet

SOURCE = "logscan"


@dataclass
class Hit:
    """One fault found in the logs: its first finding, how often it matched, the last line."""

    finding: Finding
    count: int = 1
    last: str = ""
    last_file: str = ""
    last_lineno: int = 0

    @property
    def last_where(self) -> str:
        """``file:line`` of the last matching line."""
        return f"{self.last_file}:{self.last_lineno}"


BLOCK = 1 << 20  # bytes read at a time
MAX_LINE = 65536  # bytes of one line kept (longer: cut; rules see MAX_MESSAGE characters anyway)
EXPORT_HEAD = b"__CURSOR="  # the first field of every entry of `journalctl -o export`
MAX_FINDINGS = 1000  # distinct faults kept (then one more per new code); the rest are counted


@contextlib.contextmanager
def _open(path: str) -> Iterator[IO[bytes]]:
    """The file (``-``: stdin, left open), decompressed on the fly when it is gzip."""
    with contextlib.ExitStack() as stack:
        raw: IO[bytes] = sys.stdin.buffer
        if path != "-":
            raw = stack.enter_context(open(path, "rb"))
        if hasattr(raw, "peek") and raw.peek(2)[:2] == b"\x1f\x8b":
            unpacked: Any = stack.enter_context(gzip.GzipFile(fileobj=raw))
            yield unpacked
        else:
            yield raw


def blocks(stream: IO[bytes]) -> Iterator[bytes]:
    """The stream in blocks of whole lines, each ending with a newline; a line longer than
    ``MAX_LINE`` is cut there (memory stays bounded whatever the input, gzip bombs included)."""
    rest = b""
    cutting = False  # the head of an over-long line went out: drop bytes up to its newline
    while True:
        chunk = stream.read(BLOCK)
        if not chunk:
            break
        if cutting:
            nl = chunk.find(b"\n")
            if nl < 0:
                continue
            chunk, cutting = chunk[nl + 1 :], False
        data = rest + chunk if rest else chunk
        end = data.rfind(b"\n") + 1
        block, rest = data[:end], data[end:]
        if len(rest) > MAX_LINE:
            block, rest, cutting = block + rest[:MAX_LINE] + b"\n", b"", True
        if block:
            yield block
    if rest:
        yield rest + b"\n"


def _line_before(block: bytes, start: int) -> int:
    """Start of the line before the one starting at ``start`` (> 0)."""
    return block.rfind(b"\n", 0, start - 1) + 1


# A record's continuation lines: at most this many after its first, which is in one of the
# shapes that print a record's later lines indented (dmesg's; journalctl's short ones)
CONTINUED = 4
RECORD_SHAPES = frozenset(
    {"dmesg", "ctime", "reltime", "iso", "syslog", "full", "unix", "monotonic"}
)
Key = tuple[str, str, Optional[Severity]]  # a fault: (component, code, severity)
Each = Callable[[str, int, Finding], None]  # (file, line number, finding) of every matched line


class _Scan:
    """One file through the rules: the literal prefilter finds candidate lines in whole blocks
    (:meth:`hma.probes.kernel_log.rules.Prefilter.lines`), only those are parsed, decoded and
    matched."""

    def __init__(
        self,
        path: str,
        rules: RuleSet,
        hits: dict[Key, Hit],
        not_kept: Optional[list[int]] = None,
        each: Optional[Each] = None,
    ) -> None:
        self.path = path
        self.each = each
        self.export = False  # a candidate line was a journal export field (not read)
        self.not_kept = not_kept if not_kept is not None else [0]  # lines of faults not kept
        self.matcher = rules.matcher(SOURCE)
        self.prefilter = rules.prefilter if rules.needles is not None else None
        self.history = rules.history
        self.look_back = rules.look_back
        self.hits = hits
        self.lineno = 0  # lines before the current block
        self.tail: list[bytes] = []  # the last ``history`` lines before the current block
        self._codes: Optional[set[str]] = None  # codes among the hits, once the cap is reached

    def block(self, block: bytes) -> None:
        """Match the candidate lines of one block (of :func:`blocks`)."""
        found: Mapping[int, Optional[list[str]]]  # line end (newline) -> the needles it holds
        if self.prefilter is None:
            found = dict.fromkeys(m.start() for m in re.finditer(b"\n", block))
        else:
            found = self.prefilter.lines(block)
        counted, lineno, count, rfind, line = 0, self.lineno, block.count, block.rfind, self._line
        for end in sorted(found):
            start = rfind(b"\n", 0, end) + 1
            lineno += count(b"\n", counted, start)
            counted = start
            line(block, start, end, lineno + 1, found[end])
        self.lineno += block.count(b"\n")
        if self.history:
            self.tail = (self.tail + self._before(block, len(block), self.history))[-self.history :]

    def _before(self, block: bytes, start: int, count: int) -> list[bytes]:
        lines: list[bytes] = []
        while start > 0 and len(lines) < count:
            prev = _line_before(block, start)
            lines.append(block[prev : start - 1])
            start = prev
        lines.reverse()
        return lines

    def _context(self, block: bytes, start: int) -> list[str]:
        before = self._before(block, start, self.history)
        before = (self.tail + before)[-self.history :] if len(before) < self.history else before
        context = (saved_line(b.decode("utf-8", "replace").rstrip("\r"))[1] for b in before)
        return [m for m in context if m is not None]

    def _line(
        self, block: bytes, start: int, end: int, lineno: int, needles: Optional[list[str]]
    ) -> None:
        line = block[start:end].decode("utf-8", "replace").rstrip("\r")
        fmt, message = saved_line(line)
        if message is None and line[:1] in (" ", "\t"):
            message = self._continued(block, start, line)
            fmt = "continuation" if message is not None else fmt
        if message is None:  # written by user space: no kernel message
            self.export = self.export or fmt == "export"
            return
        if self.history and (
            needles is None or self.look_back is None or not self.look_back.isdisjoint(needles)
        ):
            self.matcher.lazy_context(lambda: self._context(block, start))
        match = self.matcher.match(message, lambda: line_time(line), needles)
        if match is None:
            return
        if self.each is not None:
            self.each(self.path, lineno, match.finding(self._evidence(lineno, fmt)))
        if match.severity is Severity.OK:
            self._cleared(match.finding(self._evidence(lineno, fmt)), line, lineno)
            return
        key = (match.component, match.code, match.severity)
        hit = self.hits.get(key)
        if hit is None:  # a new fault: only now is its finding built (a repeat builds nothing)
            if len(self.hits) >= MAX_FINDINGS:
                if self._codes is None:
                    self._codes = {k[1] for k in self.hits}
                if match.code in self._codes:  # one fault per code is kept past the cap, so the
                    self.not_kept[0] += 1  # worst severity (the exit code) counts every code
                    return
                self._codes.add(match.code)
            found = match.finding(self._evidence(lineno, fmt))
            self.hits[key] = Hit(found.with_(details={**found.details, "raw": line[:1000]}))
        else:
            hit.count += 1
            hit.last, hit.last_file, hit.last_lineno = line[:1000], self.path, lineno

    def _continued(self, block: bytes, start: int, line: str) -> Optional[str]:
        """The text of ``line`` when it continues an NVIDIA driver record as dmesg and
        journalctl print one with newlines inside (the lines after the first indented: ``NVRM:
        The NVIDIA GPU ...``, then ``               NVRM: ... fallen off the bus ...``), else
        None. Only the driver's own text: the record's first line is a kernel message of one of
        those shapes that starts with ``NVRM: `` and quotes no user (``formats.classify``), and
        every line from it on starts with ``NVRM: `` after its indent."""
        text = line.strip()
        if not text.startswith("NVRM: "):
            return None
        before = self._before(block, start, CONTINUED)
        if len(before) < CONTINUED:
            before = (self.tail + before)[-CONTINUED:]
        for raw in reversed(before):
            prev = raw.decode("utf-8", "replace").rstrip("\r")
            if prev[:1] in (" ", "\t"):
                if not prev.strip().startswith("NVRM: "):
                    return None
                continue
            fmt, head = saved_line(prev)
            if fmt not in RECORD_SHAPES or head is None or not head.startswith("NVRM: "):
                return None
            return text if formats.classify(head) is None else None
        return None

    def _evidence(self, lineno: int, fmt: str) -> dict[str, Any]:
        """Where a matching line is: the details its finding carries beside the rule's."""
        return {"file": self.path, "lineno": lineno, "format": fmt}

    def _cleared(self, found: Finding, line: str, lineno: int) -> None:
        """A line saying a fault is over (NFS server OK): the open hits of its (component, code)
        become one cleared hit (severity ok, the clearing line beside it); a later fault of the
        same kind is a new hit."""
        for key in [k for k in self.hits if k[:2] == (found.component, found.code)]:
            if key[2] is Severity.OK:
                continue
            hit = self.hits.pop(key)
            done = (found.component, found.code, Severity.OK)
            before = self.hits.get(done)
            details = {**hit.finding.details, "cleared_line": line[:1000]}
            details["cleared_at"] = f"{self.path}:{lineno}"
            if before is not None:
                details["count"] = before.finding.details.get("count", before.count)
                hit.count += before.count
            self.hits[done] = Hit(
                hit.finding.with_(severity=Severity.OK, details=details),
                hit.count,
                hit.last,
                hit.last_file,
                hit.last_lineno,
            )


def scan(
    paths: Sequence[str],
    rules: RuleSet,
    not_kept: Optional[list[int]] = None,
    each: Optional[Each] = None,
) -> tuple[list[Hit], list[str]]:
    """Hits over every file (in order of first sight, at most ``MAX_FINDINGS``) and one error line
    per unreadable file; ``not_kept[0]`` counts the matching lines of faults beyond the cap;
    ``each`` sees the finding of every matching line."""
    hits: dict[Key, Hit] = {}
    errors: list[str] = []
    for path in paths:
        try:
            with _open(path) as stream:
                one = _Scan(path, rules, hits, not_kept, each)
                for i, block in enumerate(blocks(stream)):
                    if i == 0 and block.startswith(EXPORT_HEAD):
                        one.export = True  # not one line of it is read: a binary field value
                        break  # holds user text on lines of their own
                    one.block(block)
            if one.export:
                errors.append(
                    f"{path}: journal export format (journalctl -o export) is not read;"
                    " save the log with -o json or -o short-precise"
                )
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            errors.append(f"{path}: {getattr(exc, 'strerror', None) or exc}")  # path once
    return list(hits.values()), errors


def document(
    hits: Sequence[Hit], errors: Sequence[str], cat: Catalogue, not_kept: int = 0
) -> dict[str, Any]:
    """The ``--json`` document: worst severity, one entry per fault and (when the cap was reached)
    ``not_kept``, the number of matching lines of faults beyond it."""

    findings = []
    for hit in hits:
        resolved = cat.resolve_all([hit.finding])
        if not resolved:
            continue  # code disabled by the operator
        # a counted code is shown below its threshold: the scan keeps no window and cannot tell
        # one burst of lines (one occurrence to the daemon) from repeats; the lines are counted
        data = cat.at_count(resolved[0], 1).to_json()
        del data["ts"]
        data["details"]["count"] = hit.count
        if hit.last:
            data["details"]["last_line"] = hit.last
            data["details"]["last_at"] = hit.last_where
        findings.append(data)
    severities = [Severity.parse(f["severity"]) for f in findings]
    if errors:
        severities.append(Severity.UNKNOWN)
    doc: dict[str, Any] = {
        "severity": str(worst(severities)),
        "findings": findings,
        "errors": list(errors),
    }
    if not_kept:
        doc["not_kept"] = not_kept
    return doc


def render_text(doc: dict[str, Any]) -> str:
    """Human-readable report: one block per fault, with the matching line as evidence (log text
    escaped: hma.adapters.text)."""
    lines = [f"logscan: {doc['severity'].upper()} ({len(doc['findings'])} finding(s))"]
    for f in doc["findings"]:
        d = f["details"]
        times = f" x{d['count']}" if d["count"] > 1 else ""
        lines.append(
            f"[{f['severity']}] {printable(f['code'])} {printable(f['component'])}{times}: "
            + printable(f["message"])
        )
        lines.append(f"    action: {f['action']}    at {printable(d['file'])}:{d['lineno']}")
        lines.append(f"    {printable(d['raw'])}")
        if d.get("last_line"):
            lines.append(f"    last at {printable(d['last_at'])}: {printable(d['last_line'])}")
        if d.get("cleared_line"):
            cleared = f"{printable(d['cleared_at'])}: {printable(d['cleared_line'])}"
            lines.append(f"    cleared at {cleared}")
    if doc.get("not_kept"):
        lines.append(f"{doc['not_kept']} matching line(s) of further faults not kept")
    for err in doc["errors"]:
        lines.append(f"error: {printable(err)}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``hma logscan`` handler: exit code is the worst severity (3 for unreadable files)."""
    from hma import assembly
    from hma.commands import common
    from hma.config.files import ConfigError
    from hma.probes.kernel_log.rules import RulesError

    try:
        setup = assembly.load(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        if args.json:
            common.dump(
                common.problem("logscan", "invalid configuration: " + "; ".join(exc.errors))
            )
        return 3
    rules_dir: Optional[str] = args.rules_dir
    if rules_dir is None:
        rules_dir = setup.config.sources.get("kernel_log", {}).get("rules_dir")
    try:
        rules = RuleSet.load(rules_dir)
    except RulesError as exc:
        for line in exc.errors:
            print(f"hma logscan: {line}", file=sys.stderr)
        if args.json:
            common.dump(common.problem("logscan", "invalid rules: " + "; ".join(exc.errors)))
        return 3
    catalogue = setup.catalogue
    if args.rules_dir is not None:  # codes of an explicitly named folder join the catalogue
        from hma.probes.kernel_log.rules import load_site

        catalogue = catalogue.extended(
            e for e in load_site(args.rules_dir)[1] if e.code not in catalogue
        )
    not_kept = [0]
    hits, errors = scan(args.files, rules, not_kept)
    doc = document(hits, errors, catalogue, not_kept[0])
    print(json.dumps(doc, indent=2, allow_nan=False) if args.json else render_text(doc))
    return int(Severity.parse(doc["severity"]))
