"""``hma logscan FILE...``: the kernel-log rules over saved logs (the triage tool for dead nodes).

Reads plain dmesg, ``dmesg --ctime``, ISO-time logs, /dev/kmsg records and syslog/journal lines
(gzip-compressed files too, ``-`` for stdin). Repeats of one (component, code, severity) are one
finding with a count, the first matching line as evidence and the last one beside it. The exit
code is the worst severity, as for ``hma check``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from dataclasses import dataclass
from typing import IO, Any, Iterator, Optional, Sequence

from hma.catalogue import Catalogue
from hma.model import Finding, Severity, worst
from hma.rules import RuleSet
from hma.rules.lines import saved_line

SOURCE = "logscan"


@dataclass
class Hit:
    """One fault found in the logs: its first finding, how often it matched, the last line."""

    finding: Finding
    count: int = 1
    last: str = ""
    last_where: str = ""


def _lines(path: str) -> Iterator[str]:
    raw: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        stream: IO[bytes] = raw
        if hasattr(raw, "peek") and raw.peek(2)[:2] == b"\x1f\x8b":
            stream = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline=None)
        try:
            yield from text
        finally:
            text.detach()  # leave stdin open
    finally:
        if path != "-":
            raw.close()


def scan(paths: Sequence[str], rules: RuleSet) -> tuple[list[Hit], list[str]]:
    """Hits over every file (in order of first sight) and one error line per unreadable file."""
    hits: dict[tuple[str, str, str], Hit] = {}
    errors: list[str] = []
    for path in paths:
        matcher = rules.matcher(SOURCE)
        try:
            for lineno, line in enumerate(_lines(path), 1):
                fmt, message = saved_line(line)
                if message is None:  # written by user space: no kernel message
                    continue
                where = f"{path}:{lineno}"
                found = matcher.feed(message, 0.0, {"file": path, "lineno": lineno, "format": fmt})
                if found is None:
                    continue
                key = (found.component, found.code, str(found.severity))
                hit = hits.get(key)
                if hit is None:
                    hits[key] = Hit(found.with_(details={**found.details, "raw": line.rstrip()}))
                else:
                    hit.count += 1
                    hit.last, hit.last_where = line.rstrip()[:1000], where
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            errors.append(f"{path}: {exc}")
    return list(hits.values()), errors


def document(hits: Sequence[Hit], errors: Sequence[str], cat: Catalogue) -> dict[str, Any]:
    """The ``--json`` document: worst severity and one entry per fault."""
    from hma.check import resolve

    findings = []
    for hit in hits:
        resolved = resolve([hit.finding], cat)
        if not resolved:
            continue  # code disabled by the operator
        data = resolved[0].to_json()
        del data["ts"]
        data["details"]["count"] = hit.count
        if hit.last:
            data["details"]["last_line"] = hit.last
            data["details"]["last_at"] = hit.last_where
        findings.append(data)
    severities = [Severity.parse(f["severity"]) for f in findings]
    if errors:
        severities.append(Severity.UNKNOWN)
    return {"severity": str(worst(severities)), "findings": findings, "errors": list(errors)}


def render_text(doc: dict[str, Any]) -> str:
    """Human-readable report: one block per fault, with the matching line as evidence."""
    lines = [f"logscan: {doc['severity'].upper()} ({len(doc['findings'])} finding(s))"]
    for f in doc["findings"]:
        d = f["details"]
        times = f" x{d['count']}" if d["count"] > 1 else ""
        lines.append(f"[{f['severity']}] {f['code']} {f['component']}{times}: {f['message']}")
        lines.append(f"    action: {f['action']}    at {d['file']}:{d['lineno']}")
        lines.append(f"    {d['raw']}")
        if d.get("last_line"):
            lines.append(f"    last at {d['last_at']}: {d['last_line']}")
    for err in doc["errors"]:
        lines.append(f"error: {err}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``hma logscan`` handler: exit code is the worst severity (3 for unreadable files)."""
    from hma import assembly
    from hma.configfile import ConfigError
    from hma.rules import RulesError

    try:
        setup = assembly.load(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return 3
    rules_dir: Optional[str] = args.rules_dir
    if rules_dir is None:
        rules_dir = setup.config.sources.get("kernel_log", {}).get("rules_dir")
    try:
        rules = RuleSet.load(rules_dir)
    except RulesError as exc:
        for line in exc.errors:
            print(f"hma logscan: {line}", file=sys.stderr)
        return 3
    catalogue = setup.catalogue
    if args.rules_dir is not None:  # codes of an explicitly named folder join the catalogue
        from hma.rules import load_site

        catalogue = catalogue.extended(
            e for e in load_site(args.rules_dir)[1] if e.code not in catalogue
        )
    hits, errors = scan(args.files, rules)
    doc = document(hits, errors, catalogue)
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return int(Severity.parse(doc["severity"]))
