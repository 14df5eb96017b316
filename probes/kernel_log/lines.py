"""Kernel log line formats: /dev/kmsg records and the saved forms admins bring to ``hma logscan``.

Every reader reduces a line to the kernel message text the rules match (``NVRM: Xid ...``), plus
what it knows of the record (sequence number, facility, time as printed). A syslog line whose
identifier is not ``kernel`` (``host NVRM[4242]: Xid ...``, ``sshd[1]: Invalid user NVRM: ...``)
was written by a user-space program, which any user can do with ``logger``: it is no kernel
message and is never matched.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from typing import Any, Optional

KERN_FACILITY = 0
USER_FACILITY = 1


@dataclass(frozen=True)
class Record:
    """One /dev/kmsg record (``pri,seq,ts_usec,flags[,...];message``)."""

    seq: int
    ts_usec: int
    facility: int
    level: int
    message: str


# `[  170.053881] ` (`--show-delta`: `[ ts <delta>]`), with `dmesg -r`'s `<pri>` before it and
# CONFIG_PRINTK_CALLER's `[  T292]` after it: joined as the console prints it, or after a blank as
# util-linux dmesg (2.39+) prints the record's caller id (`[88690.479882] [ T593001] EDAC ...`)
_DMESG_TS = re.compile(r"^(?:<\d{1,3}>)?\[\s*\d+\.\d+(?: <\s*\d+\.\d+>)?\](?: ?\[\s*[TC]\d+\])?\s?")
_CTIME = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d \d{4}\]\s?"
)
# `dmesg -H` / `dmesg -e` (util-linux's reltime): `[Jul14 10:10] ` when the minute changes, the
# seconds since the line before in between (`[  +0.005106] `)
_RELTIME = re.compile(r"^\[(?:\s*\+\d+\.\d{6}|[A-Z][a-z]{2} ?\d{1,2} \d\d:\d\d)\]\s?")
# `dmesg --time-format iso`: comma, microseconds, `+hh:mm` (journalctl and rsyslog print a dot)
_ISO_DMESG = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d ")
_PRI = r"(?:<\d{1,3}>)?"
_PRI_ONLY = re.compile(r"^<\d{1,3}>")
# Shapes with an identifier field after the time stamp (and the host): journalctl's short,
# short-precise, short-iso(-precise), short-full, short-unix, syslog files (RFC 3164, with or
# without `<pri>`), rsyslog's RFC 3339 time stamps.
_STAMPED = (
    (
        "iso",
        re.compile(_PRI + r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"),
    ),
    ("syslog", re.compile(_PRI + r"[A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d(?:\.\d+)?\s+")),
    (
        "full",
        re.compile(
            r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [^\s\d]\S* "
        ),
    ),
    ("unix", re.compile(r"\d{9,}\.\d{6} ")),
)
# RFC 5424: `<pri>1 TIMESTAMP HOST APP-NAME PROCID MSGID STRUCTURED-DATA MSG`
_RFC5424 = re.compile(
    _PRI + r"1 (?:-|\d{4}-\d\d-\d\dT\S+) \S+ (?P<app>\S+) \S+ \S+ "
    r"(?:-|(?:\[(?:[^\]\\]|\\.)*\])+)(?: (?:\ufeff)?(?P<msg>.*))?$"
)
# the identifier field, exactly `kernel`, after an optional host (journalctl --no-hostname)
_KERNEL_IDENT = re.compile(r"(?:\S+ )?kernel: ")
# `[ts] host ident[pid]: ...` (journalctl -o short-monotonic/short-delta): a host name and a
# user-space identifier, which journalctl prints with the writer's pid (journald records _PID for
# every user-space entry; only kernel entries come without one). `[ts] host ident: ` without a pid
# cannot be told from a dmesg line such as `nvme nvme0: ` or `mlx5_core 0000:5e:00.0: `, which it
# is read as; the kernel's own `kernel: ` identifier is recognised before.
_HOST_THEN_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]* \S+?\[\d+\]: ")
# `sshd[1]: ...`: a user-space syslog tag (the kernel's `comm[pid]: segfault` lines look alike;
# no rule is about them).
_USER_TAG = re.compile(r"^[A-Za-z0-9_.@/-]+\[\d+\]: ")
# after `[ts] `: the kernel's identifier (journalctl short-monotonic), or a user-space one (with a
# host, or a bare tag); one match for the three (dmesg lines match none, and hold neither
# `kernel: ` nor `]: `, which every match does: a cheap test before the expression)
_IDENT_AFTER_TS = re.compile(
    r"(?P<kernel>(?:\S+ )?kernel: )|(?P<user>"
    + _HOST_THEN_IDENT.pattern
    + "|"
    + _USER_TAG.pattern[1:]
    + ")"
)
_KMSG = re.compile(r"^(?P<pri>\d{1,4}),(?P<seq>\d{1,20}),(?P<ts>\d{1,20}),[^;]*;(?P<msg>.*)$")
# journald `-o short` without a host (seen in some exports): `kernel: message`.
_BARE_IDENT = re.compile(r"^(?P<ident>kernel|NVRM): (?P<msg>.*)$")
# `dmesg --decode` (-x): `kern  :warn  : ` before the time (facility and level of the record)
_DECODED = re.compile(
    r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|res[0-3]|local[0-7])"
    r" *:(?:emerg|alert|crit|err|warn|notice|info|debug) *: "
)
# journalctl -o export: one `FIELD=value` per line, an entry's fields spread over many lines
_EXPORT = re.compile(r"^(?:MESSAGE|_TRANSPORT|SYSLOG_IDENTIFIER|__CURSOR)=")
# the time a saved line carries (storm rules count by it): kmsg usec, dmesg seconds, ISO, syslog
_TIME_KMSG = re.compile(r"^\d{1,4},\d{1,20},(\d{1,20}),")
_TIME_UNIX = re.compile(r"^(\d{9,}\.\d{6}) ")
_TIME_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?")
_TIME_SYSLOG = re.compile(r"([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_TIME_DMESG = re.compile(r"(?:<\d{1,3}>)?\[\s*(\d+\.\d+)")
_MONTHS = "JanFebMarAprMayJunJulAugSepOctNovDec"


def parse_record(raw: bytes) -> Optional[Record]:
    """A /dev/kmsg record from its first line (bytes, no newline); None when it is not one."""
    head, sep, body = raw.partition(b";")
    if not sep:
        return None
    fields = head.split(b",")
    if len(fields) < 4:
        return None
    try:
        pri, seq, ts = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    message = body.decode("utf-8", "replace")
    return Record(seq, ts, pri >> 3, pri & 7, message)


_WRITE_PRI = re.compile(rb"^<(\d{1,3})>")
DEFAULT_LEVEL = 4  # the kernel's default_message_loglevel


def written_record(raw: bytes, seq: int, ts_usec: int) -> Record:
    """The record the kernel makes of ``raw`` written to /dev/kmsg (``<N>text``, one write one
    record), numbered ``seq``: the level from the ``<N>`` prefix (else the default), and the
    user facility unless the prefix names another (user space cannot write kernel records)."""
    level, facility, text = DEFAULT_LEVEL, USER_FACILITY, raw
    m = _WRITE_PRI.match(raw)
    if m:
        pri = int(m.group(1))
        level, facility, text = pri & 7, (pri >> 3) or USER_FACILITY, raw[m.end() :]
    return Record(seq, ts_usec, facility, level, text.decode("utf-8", "replace"))


def from_identifier(ident: str, message: str) -> str:
    """The message as the kernel printed it, from the (syslog identifier, message) pair of a
    kernel record (journald files records written to /dev/kmsg by root under their own
    identifier, such as ``NVRM`` for ``hma inject``)."""
    if ident == "kernel" or not ident:
        return _DMESG_TS.sub("", message, count=1)
    return f"{ident}: {message}"


def saved_line(line: str) -> tuple[str, Optional[str]]:
    """(format, kernel message) of one line of a saved log; the message is None for a line that
    user space may have written (its identifier field is not exactly ``kernel``).

    Kernel-only formats: ``kmsg`` (/dev/kmsg records), ``dmesg`` (``[  170.053881] ``, also
    ``--show-delta``), ``ctime`` (``dmesg --ctime``), ``reltime`` (``dmesg -H``/``-e``:
    ``[Jul14 10:10] ``, ``[  +0.005106] ``), ``iso`` (``dmesg --time-format iso``);
    each also with ``dmesg --decode``'s ``kern  :warn  : `` in front. ``json`` (journalctl
    ``-o json``/``json-seq``): a kernel message only when ``_TRANSPORT`` is ``kernel``.
    ``export`` (``-o export``): a field line, which says nothing of its entry: never a message.
    Formats with an identifier field (a kernel message only when it is ``kernel``): ``iso``
    (``journalctl -o short-iso[-precise]``, rsyslog), ``syslog`` (``-o short[-precise]``,
    /var/log/messages, ``<pri>`` or not), ``full`` (``-o short-full``), ``unix``
    (``-o short-unix``), ``monotonic`` (``-o short-monotonic``/``short-delta``: ``[ts] host
    ident: ``, which dmesg never prints), ``rfc5424``. ``plain``: anything else, matched as is,
    except a user-space tag (``ident[pid]: ...``) and a continuation line (leading blank).
    """
    line = line.rstrip("\r\n")
    if line[:1] != "[":  # dmesg lines skip these: the common case
        m = _KMSG.match(line)
        if m:
            return "kmsg", m.group("msg")
        if line.startswith(('{"', '\x1e{"')):
            return "json", _journal_json(line.lstrip("\x1e"))
        if _EXPORT.match(line):
            return "export", None
        m = _DECODED.match(line)
        if m:
            line = line[m.end() :]
            if not (_DMESG_TS.match(line) or _ISO_DMESG.match(line) or _RELTIME.match(line)):
                return "dmesg", line  # `dmesg -x -t`
    m = _DMESG_TS.match(line)
    if m:
        rest = line[m.end() :]
        ident = None
        if "kernel: " in rest or "]: " in rest:
            ident = _IDENT_AFTER_TS.match(rest)
        if ident is None:
            return "dmesg", rest
        if ident.lastgroup == "kernel":
            return "monotonic", _DMESG_TS.sub("", rest[ident.end() :], count=1)
        return "monotonic", None
    m = _CTIME.match(line) or _ISO_DMESG.match(line)
    if m:
        return ("ctime" if line[0] == "[" else "iso"), line[m.end() :]
    m = _RELTIME.match(line)
    if m:
        return "reltime", line[m.end() :]
    for fmt, stamp in _STAMPED:
        m = stamp.match(line)
        if m:
            return fmt, _identified(line[m.end() :])
    m = _RFC5424.match(line)
    if m:
        if m.group("app") != "kernel":
            return "rfc5424", None
        return "rfc5424", _DMESG_TS.sub("", m.group("msg") or "", count=1)
    line = _PRI_ONLY.sub("", line, count=1)  # `dmesg -r -t`, a record as written to /dev/kmsg
    if line[:1].isspace() or _USER_TAG.match(line):
        return "plain", None
    bare = _BARE_IDENT.match(line)
    if bare:
        return "plain", from_identifier(bare.group("ident"), bare.group("msg"))
    return "plain", line


def _journal_json(line: str) -> Optional[str]:
    """The kernel message of one ``journalctl -o json`` entry, None for any other transport
    (or a line that is no JSON object)."""
    try:
        entry: Any = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict) or entry.get("_TRANSPORT") != "kernel":
        return None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journalctl writes a message that is not UTF-8 as bytes
        try:
            message = bytes(message).decode("utf-8", "replace")
        except (TypeError, ValueError):
            return None
    if not isinstance(message, str):
        return None
    ident = entry.get("SYSLOG_IDENTIFIER", "kernel")
    return from_identifier(ident if isinstance(ident, str) else "kernel", message)


def line_time(line: str) -> Optional[float]:
    """Seconds the saved line's own time stamp stands for, on a scale that only orders lines
    of one log (kmsg and dmesg: since boot; calendar stamps: a year-less epoch); None when it
    carries none. Storm rules count matches within a window of these."""
    line = _DECODED.sub("", line, count=1)
    m = _TIME_KMSG.match(line)
    if m:
        return int(m.group(1)) / 1e6
    m = _TIME_UNIX.match(line)
    if m:
        return float(m.group(1))
    if line.startswith('{"'):
        try:
            entry = json.loads(line)
            return int(entry.get("__MONOTONIC_TIMESTAMP") or "") / 1e6
        except (ValueError, TypeError, AttributeError):
            return None
    head = line[:48]
    m = _TIME_ISO.search(head)
    if m:
        y, mo, d, h, mi, sec = (int(g) for g in m.groups()[:6])
        try:
            day = datetime.date(2000, mo, d).timetuple().tm_yday  # leap year: Feb 29 fits
        except ValueError:
            return None
        return (y * 366 + day) * 86400.0 + h * 3600 + mi * 60 + sec + _fraction(m.group(7))
    m = _TIME_SYSLOG.search(head)
    if m and m.group(1) in _MONTHS:
        try:
            date = datetime.date(2000, _MONTHS.index(m.group(1)) // 3 + 1, int(m.group(2)))
        except ValueError:
            return None
        h, mi, sec = int(m.group(3)), int(m.group(4)), int(m.group(5))
        return date.timetuple().tm_yday * 86400.0 + h * 3600 + mi * 60 + sec + _fraction(m.group(6))
    m = _TIME_DMESG.match(line)
    return float(m.group(1)) if m else None


def _fraction(digits: Optional[str]) -> float:
    return int(digits) / 10 ** len(digits) if digits else 0.0


def _identified(rest: str) -> Optional[str]:
    """The message after ``[host ]kernel: ``, None for any other identifier field."""
    m = _KERNEL_IDENT.match(rest)
    return _DMESG_TS.sub("", rest[m.end() :], count=1) if m else None
