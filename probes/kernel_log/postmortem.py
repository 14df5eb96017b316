"""``postmortem`` event source: what killed the previous boot, read once per boot.

At its start in a boot it reads the records a crashed kernel leaves behind: pstore
(``/sys/fs/pstore``: ``dmesg-ramoops-N``, ``dmesg-efi-N``, ``dmesg-erst-N``, a compressed
``.enc.z`` the kernel could not decompress), systemd-pstore's copies
(``/var/lib/systemd/pstore``, a record's files in a folder of its own), kdump's
(``/var/crash/<dir>/vmcore-dmesg.txt``, Ubuntu's ``/var/crash/<stamp>/dmesg.<stamp>``) and the
previous boot's kernel journal (``journalctl -k -b -1 -o json``, bounded). Every line goes
through the kernel-log rules (the same ``RuleSet`` and saved-line formats as ``hma logscan``:
a task's name in a line is user text there too); a panic, oops, ``BUG:``, fatal machine check,
hard or soft lockup (``CAUSES``), or any other line a rule makes critical (an Xid on a GPU),
becomes ``KERNEL_PREVIOUS_BOOT_CRASH`` (``hma.contracts.label.POSTMORTEM_CODE``) on the rule's
component, with the cause's code, the record and the lines (escaped) in its details and
``previous_boot = true``.

Such a finding is evidence, not a current fault: a warning that never drains (its catalogue
entry); the crash counts once in the node's remediation history (docs/remediation.md,
"Post-mortem"). A record is raised once: the keys of the records read (path, size, mtime; the
journal's boot id) and the boot that read them are kept in the state store, so a restart in the
same boot reads nothing and a later boot raises only records that are new. Records that cannot be
read (a symlink, a file past ``max_record_bytes``, binary, a broken ``.enc.z``, no permission)
are ``KERNEL_PREVIOUS_BOOT_UNKNOWN``, never a crash. Files are read through
``hma.adapters.files`` (size limits, no symlink followed).
"""

from __future__ import annotations

import json
import logging
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping

from hma.adapters.files import ReadError, RootReader
from hma.adapters.text import printable
from hma.contracts.label import POSTMORTEM_CODE
from hma.contracts.model import Finding, Severity
from hma.contracts.options import Option, positive
from hma.contracts.source import EventSource, SourceContext
from hma.probes.kernel_log.lines import saved_line
from hma.probes.kernel_log.rules import RuleSet

UNKNOWN_CODE = "KERNEL_PREVIOUS_BOOT_UNKNOWN"
KV_KEY = "postmortem.seen"
# The rule codes that say what killed a boot (besides any a rule makes critical)
CAUSES = frozenset(
    {
        "KERNEL_PANIC",
        "KERNEL_OOPS",
        "KERNEL_HARD_LOCKUP",
        "KERNEL_SOFT_LOCKUP",
        "KERNEL_MCE_HW_ERROR",
    }
)
MAX_KEYS = 512  # record keys remembered (the newest)
MAX_RECORDS = 64  # records read per boot (the newest first)
EVIDENCE_LINES = 20  # lines kept in a finding: the match and those before it
LINE_CHARS = 300
PSTORE_NAME = re.compile(r"dmesg-[a-z_]{1,16}-\d{1,24}(?:\.enc\.z)?")
KDUMP_NAME = re.compile(r"vmcore-dmesg\.txt|dmesg\.\d{12}")
TEXT_NAME = re.compile(r"dmesg\.txt")

log = logging.getLogger("hma.postmortem")


@dataclass
class Crash:
    """What one record says killed its boot: the first cause per component."""

    record: str
    causes: dict[str, Finding] = field(default_factory=dict)


class PostmortemSource(EventSource):
    """What killed the previous boot (pstore, kdump, the previous boot's journal), once per boot."""

    name = "postmortem"
    description = "What killed the previous boot: pstore, kdump, the previous boot's kernel journal"
    options: ClassVar[Mapping[str, Option]] = {
        "pstore_dir": Option("path", "/sys/fs/pstore", "The kernel's pstore file system."),
        "systemd_pstore_dir": Option(
            "path", "/var/lib/systemd/pstore", "Where systemd-pstore keeps the records."
        ),
        "kdump_dir": Option("path", "/var/crash", "kdump's folder (one folder per crash)."),
        "journal": Option("bool", True, "Read the previous boot's kernel journal (journalctl)."),
        "journalctl": Option("path", "journalctl", "The journalctl program."),
        "journal_lines": Option(
            "int", 20000, "Kernel entries of the previous boot read at most.", minimum=100
        ),
        "timeout": Option("float", 30.0, "Seconds journalctl may run.", check=positive),
        "max_record_bytes": Option(
            "int",
            4 * 1024 * 1024,
            "Bytes of one record read at most (larger: unknown).",
            minimum=4096,
        ),
        "rules_dir": Option(
            "path", "/etc/hma/rules.d", "Site rule files (as [sources.kernel_log] rules_dir)."
        ),
    }

    def run(self, ctx: SourceContext, emit: Callable[[Finding], None]) -> None:
        """Read once in this boot, emit, remember; then wait for the stop."""
        stored = ctx.kv.get(KV_KEY) or {}
        if not isinstance(stored, dict):
            stored = {}
        if stored.get("boot_id") != ctx.boot_id:
            before = [k for k in stored.get("keys", []) if isinstance(k, str)]
            findings, keys = scan(ctx.options, ctx, set(before))
            for finding in findings:
                emit(finding)
            kept = [*before, *sorted(keys - set(before))][-MAX_KEYS:]  # the newest last
            ctx.kv.set(KV_KEY, {"boot_id": ctx.boot_id, "keys": kept})
        ctx.started("files")
        ctx.stop.wait()


def scan(
    options: Mapping[str, Any], ctx: SourceContext, seen: set[str]
) -> tuple[list[Finding], set[str]]:
    """The findings of every record not in ``seen``, and the keys of the records read."""
    rules = RuleSet.load(options.get("rules_dir"))
    limit = int(options.get("max_record_bytes", 4 * 1024 * 1024))
    findings: list[Finding] = []
    keys: set[str] = set()
    records = list(_file_records(options))
    records.sort(key=lambda r: r[2], reverse=True)
    for where, rel, _mtime, key in records[:MAX_RECORDS]:
        if key in seen:
            continue
        keys.add(key)
        try:
            text = _record_text(where, rel, limit)
        except ReadError as exc:
            findings.append(_unknown(f"{where.root / rel}", str(exc)))
            continue
        findings += crash_findings(rules, f"{where.root / rel}", text.splitlines())
    if options.get("journal", True):
        found, key = _journal(options, ctx, seen, rules)
        if key:
            keys.add(key)
        findings += found
    return findings, keys


def crash_findings(rules: RuleSet, record: str, lines: list[str]) -> list[Finding]:
    """The crash findings of one record's lines (saved-line formats, the kernel-log rules)."""
    matcher = rules.matcher("postmortem")
    crash = Crash(record)
    recent: list[str] = []
    for line in lines:
        _fmt, message = saved_line(line)
        if message is None:
            continue
        recent = [*recent[-(EVIDENCE_LINES - 1) :], message]
        match = matcher.match(message)
        if match is None or match.severity is Severity.OK:
            continue
        if match.code not in CAUSES and match.severity is not Severity.CRITICAL:
            continue
        if match.code == "KERNEL_MCE_HW_ERROR" and match.severity is not Severity.CRITICAL:
            continue  # a corrected machine check killed nothing
        if match.component not in crash.causes:
            crash.causes[match.component] = _crash(match.finding(), record, recent)
    return list(crash.causes.values())


def _crash(cause: Finding, record: str, recent: list[str]) -> Finding:
    """``POSTMORTEM_CODE`` on the cause's component, the cause and its lines in the details."""
    lines = [printable(line[:LINE_CHARS]) for line in recent]
    return Finding(
        POSTMORTEM_CODE,
        cause.component,
        f"previous boot ended by {cause.code} ({printable(cause.message[:200])}), from {record}",
        {
            "previous_boot": True,
            "cause": cause.code,
            "cause_message": printable(cause.message[:400]),
            "record": printable(record),
            "rule": cause.details.get("rule", ""),
            "lines": lines,
        },
        probe="postmortem",
    )


def _unknown(record: str, why: str) -> Finding:
    return Finding(
        UNKNOWN_CODE,
        "node",
        f"a crash record of the previous boot cannot be read: {printable(why[:300])}",
        {"previous_boot": True, "record": printable(record), "reason": printable(why[:300])},
        severity=Severity.UNKNOWN,
        probe="postmortem",
    )


def _file_records(options: Mapping[str, Any]) -> Iterator[tuple[RootReader, str, float, str]]:
    """(reader, path under it, mtime, key) of every record file found (symlinks included: they
    are refused when read)."""
    folders = (
        ("pstore", str(options.get("pstore_dir") or ""), PSTORE_NAME, False),
        ("systemd-pstore", str(options.get("systemd_pstore_dir") or ""), PSTORE_NAME, True),
        ("kdump", str(options.get("kdump_dir") or ""), KDUMP_NAME, True),
    )
    for kind, folder, names, nested in folders:
        if not folder or not os.path.isdir(folder) or os.path.islink(folder):
            continue
        reader = RootReader(folder)
        for rel in _names(folder, names, nested):
            try:
                st = os.lstat(os.path.join(folder, rel))
            except OSError:
                continue
            yield reader, rel, st.st_mtime, f"{kind}:{rel}:{st.st_size}:{st.st_mtime_ns}"


def _names(folder: str, names: re.Pattern[str], nested: bool) -> list[str]:
    """Record files in ``folder`` (and, ``nested``, one level of folders below it, never through
    a symlinked folder); a folder holding ``dmesg.txt`` (systemd-pstore's joined record) is
    read as that file alone."""
    out: list[str] = []
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return out
    for entry in entries:
        path = os.path.join(folder, entry)
        if names.fullmatch(entry):
            out.append(entry)
        elif nested and os.path.isdir(path) and not os.path.islink(path):
            try:
                inner = sorted(os.listdir(path))
            except OSError:
                continue
            if "dmesg.txt" in inner:
                out.append(f"{entry}/dmesg.txt")
                continue
            out += [f"{entry}/{name}" for name in inner if names.fullmatch(name)]
    return out


def _record_text(reader: RootReader, rel: str, limit: int) -> str:
    """A record's text: read without following a symlink, decompressed (``.enc.z``), never
    binary; ReadError otherwise."""
    target = reader.path(rel)
    if any(os.path.islink(p) for p in (target, target.parent)):
        raise ReadError(f"{target}: a symlink (not followed)")
    data = reader.data(rel, limit, nofollow=True)
    if rel.endswith(".enc.z"):
        data = _inflate(data, limit, str(target))
    data = data.rstrip(b"\0")  # ramoops pads its records
    if b"\0" in data:
        raise ReadError(f"{target}: binary (NUL bytes), not a kernel log")
    text = data.decode("utf-8", "replace")
    if text and text.count("\ufffd") * 10 > len(text):
        raise ReadError(f"{target}: binary (not UTF-8 text), not a kernel log")
    return text


def _inflate(data: bytes, limit: int, target: str) -> bytes:
    """A compressed pstore record (zlib, or raw deflate as newer kernels write), at most
    ``limit`` bytes of it; ReadError when it is neither or is cut."""
    for wbits in (zlib.MAX_WBITS | 32, -zlib.MAX_WBITS):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(data, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit:
            raise ReadError(f"{target}: more than {limit} bytes decompressed")
        if inflater.eof:
            return out
    raise ReadError(f"{target}: compressed record that cannot be decompressed (cut or corrupt)")


def _journal(
    options: Mapping[str, Any], ctx: SourceContext, seen: set[str], rules: RuleSet
) -> tuple[list[Finding], str]:
    """The crash findings of the previous boot's kernel journal and its key
    (``journal:<boot id>``; "" when it has no entry or was seen)."""
    lines = int(options.get("journal_lines", 20000))
    argv = [
        str(options.get("journalctl") or "journalctl"),
        "-k", "-b", "-1", "-o", "json", "--no-pager", "-n", str(lines),
    ]  # fmt: skip
    result = ctx.runner.run(argv, float(options.get("timeout", 30.0)))
    if result.rc is None and not result.timed_out:
        return [], ""  # no journalctl here: nothing to read
    if not result.ok:
        err = (result.stderr.strip() or result.error)[-200:]
        if "not available" in err or "No journal boot entry" in err or "not found" in err:
            return [], ""  # a first boot: the journal has no previous one
        why = f"timed out after {result.duration_s:.0f} s" if result.timed_out else err
        return [_unknown("journal (previous boot)", why or f"exit {result.rc}")], ""
    entries = result.stdout.splitlines()
    boot = _boot_of(entries)
    key = f"journal:{boot}" if boot else ""
    if not key or key in seen or boot == ctx.boot_id:
        return [], ""
    if result.truncated:
        entries = entries[:-1]  # the cut last line
    return crash_findings(rules, "journal (previous boot)", entries), key


def _boot_of(entries: list[str]) -> str:
    """The boot id of the first journal entry that names one ("" none)."""
    for line in entries[:10]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        boot = entry.get("_BOOT_ID") if isinstance(entry, dict) else None
        if isinstance(boot, str) and re.fullmatch(r"[0-9a-f]{32}", boot):
            return boot
    return ""
