"""Kernel log line formats: /dev/kmsg records and the saved forms admins bring to ``hma logscan``.

Every reader reduces a line to the kernel message text the rules match (``NVRM: Xid ...``), plus
what it knows of the record (sequence number, facility, time as printed). A syslog line whose
identifier is not ``kernel`` (``host NVRM[4242]: Xid ...``, ``sshd[1]: Invalid user NVRM: ...``)
was written by a user-space program, which any user can do with ``logger``: it is no kernel
message and is never matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

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


_DMESG_TS = re.compile(r"^\[\s*\d+\.\d+\]\s?")
_CTIME = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d \d{4}\]\s?"
)
_ISO = re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+")
_SYSLOG_TIME = re.compile(r"^[A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d\s+")
# `host ident[pid]: message` after a syslog or ISO time stamp (a host name has no colon: that
# keeps `NVRM: GPU at ...` of `dmesg --time-format iso` a kernel message).
_HOST_IDENT = re.compile(
    r"^(?P<host>[^\s:]+) (?P<ident>[A-Za-z0-9_.@/-]+?)(?:\[\d+\])?: (?P<msg>.*)$"
)
# `sshd[1]: ...` without a time stamp: a user-space syslog tag (the kernel's `comm[pid]: segfault`
# lines look alike; no rule is about them).
_USER_TAG = re.compile(r"^[A-Za-z0-9_.@/-]+\[\d+\]: ")
_KMSG = re.compile(r"^(?P<pri>\d{1,4}),(?P<seq>\d{1,20}),(?P<ts>\d{1,20}),[^;]*;(?P<msg>.*)$")
# journald `-o short` without a host (seen in some exports): `kernel: message`.
_BARE_IDENT = re.compile(r"^(?P<ident>kernel|NVRM): (?P<msg>.*)$")


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


def from_identifier(ident: str, message: str) -> str:
    """The message as the kernel printed it, from the (syslog identifier, message) pair of a
    kernel record (journald files records written to /dev/kmsg by root under their own
    identifier, such as ``NVRM`` for ``hma inject``)."""
    if ident == "kernel" or not ident:
        return _DMESG_TS.sub("", message, count=1)
    return f"{ident}: {message}"


def saved_line(line: str) -> tuple[str, Optional[str]]:
    """(format, kernel message) of one line of a saved log; the message is None for a line that
    user space wrote (a syslog identifier other than ``kernel``).

    Formats: ``kmsg`` (/dev/kmsg records), ``dmesg`` (``[  170.053881] ``), ``ctime``
    (``dmesg --ctime``), ``iso`` (``dmesg --time-format iso``, ``journalctl -o short-iso``),
    ``syslog`` (``Dec  2 10:43:35 host kernel: ...``) and ``plain`` (anything else, matched as is;
    ``ident[pid]: ...`` is a user-space syslog tag).
    """
    line = line.rstrip("\r\n")
    m = _KMSG.match(line)
    if m:
        return "kmsg", m.group("msg")
    if _DMESG_TS.match(line):
        return "dmesg", _DMESG_TS.sub("", line, count=1)
    m2 = _CTIME.match(line)
    if m2:
        return "ctime", line[m2.end() :]
    for fmt, stamp in (("iso", _ISO), ("syslog", _SYSLOG_TIME)):
        m3 = stamp.match(line)
        if m3:
            rest = line[m3.end() :]
            ident = _HOST_IDENT.match(rest)
            if ident:
                if ident.group("ident") != "kernel":
                    return fmt, None
                return fmt, _DMESG_TS.sub("", ident.group("msg"), count=1)
            return fmt, _DMESG_TS.sub("", rest, count=1)
    if _USER_TAG.match(line):
        return "plain", None
    bare = _BARE_IDENT.match(line)
    if bare:
        return "plain", from_identifier(bare.group("ident"), bare.group("msg"))
    return "plain", line
