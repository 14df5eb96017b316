"""The ``journald`` reporter: one structured journal entry per alert.

It speaks journald's native protocol itself (one AF_UNIX datagram per entry, see
systemd.journal-fields(7) and https://systemd.io/JOURNAL_NATIVE_PROTOCOL/), so it needs no
systemd-python and its socket path is configurable (tests point it at a journald namespace).
When the socket is missing, stale (nobody listening) or stuck, the entry goes to stderr instead;
``alert`` never raises. Fields, MESSAGE_IDs and the priority mapping: docs/alerting.md.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import uuid
from typing import IO, Any, ClassVar, Mapping, Optional, Sequence

from hma.contracts.alert import ALERT_KINDS, Alert
from hma.contracts.catalogue import FAMILIES
from hma.contracts.model import Severity
from hma.contracts.options import Option
from hma.contracts.reporter import Reporter

DEFAULT_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "hma"
OTHER_FAMILY = "OTHER"  # codes without a known prefix
ALL_FAMILIES = (*FAMILIES, OTHER_FAMILY)

# MESSAGE_ID = uuid5(_ID_NAMESPACE, "hma/<FAMILY>/<kind>"): fixed forever (tests pin values).
_ID_NAMESPACE = uuid.UUID("79848d90-a0dc-4981-86d5-bd966e83bb32")

MESSAGE_CAP = 4096  # characters of MESSAGE kept
DETAILS_CAP = 8192  # characters of HMA_DETAILS kept (larger details are summarised)
SEND_TIMEOUT_S = 0.5  # a stuck journald must not stall the daemon's loop

# syslog priorities (sd-daemon.h)
CRIT, WARNING, NOTICE, INFO = 2, 4, 5, 6
_BY_SEVERITY = {
    Severity.CRITICAL: CRIT,
    Severity.WARNING: WARNING,
    Severity.UNKNOWN: NOTICE,
    Severity.OK: INFO,
}
_BY_KIND = {
    "cleared": INFO,
    "acknowledged": NOTICE,
    "action_requested": NOTICE,
    "action_applied": NOTICE,
    "action_held": WARNING,
    "action_failed": WARNING,
}
_VERBS = {
    "raised": "raised",
    "escalated": "escalated",
    "cleared": "cleared",
    "action_requested": "action requested",
    "action_applied": "action applied",
    "action_held": "action held",
    "action_failed": "action failed",
    "acknowledged": "acknowledged",
    "agent": "",
}
assert set(_VERBS) == set(ALERT_KINDS)


def family(code: str) -> str:
    """Code family (the prefix before the first ``_``), ``OTHER`` when not a known one; alerts
    without a code are about the agent (``HMA``)."""
    if not code:
        return "HMA"
    prefix = code.split("_", 1)[0]
    return prefix if prefix in FAMILIES else OTHER_FAMILY


def message_id(fam: str, kind: str) -> str:
    """The fixed MESSAGE_ID (32 hex digits) of a code family and alert kind."""
    return uuid.uuid5(_ID_NAMESPACE, f"hma/{fam}/{kind}").hex


def all_message_ids() -> dict[str, tuple[str, str]]:
    """Every MESSAGE_ID the reporter can emit, mapped to its (family, kind)."""
    return {message_id(f, k): (f, k) for f in ALL_FAMILIES for k in ALERT_KINDS}


def priority(alert: Alert) -> int:
    """syslog PRIORITY: by kind for clears, acks and actions, else by severity."""
    if alert.kind in _BY_KIND:
        return _BY_KIND[alert.kind]
    return _BY_SEVERITY.get(alert.severity, NOTICE)


def message(alert: Alert) -> str:
    """The MESSAGE text: ``CODE verb (component): message``."""
    head = " ".join(p for p in (alert.code, _VERBS.get(alert.kind, alert.kind)) if p)
    if alert.component:
        head = f"{head} ({alert.component})" if head else alert.component
    text = f"{head}: {alert.message}" if head else alert.message
    return text if len(text) <= MESSAGE_CAP else text[: MESSAGE_CAP - 3] + "..."


def details_json(details: Mapping[str, Any]) -> str:
    """HMA_DETAILS: the details as compact JSON, summarised when over ``DETAILS_CAP``."""
    text = json.dumps(dict(details), sort_keys=True, default=str, separators=(",", ":"))
    if len(text) <= DETAILS_CAP:
        return text
    head = text[: DETAILS_CAP - 100]
    return json.dumps({"truncated": True, "size": len(text), "head": head}, separators=(",", ":"))


def fields(alert: Alert) -> list[tuple[str, str]]:
    """The journal fields of one alert, in a fixed order."""
    return [
        ("MESSAGE", message(alert)),
        ("MESSAGE_ID", message_id(family(alert.code), alert.kind)),
        ("PRIORITY", str(priority(alert))),
        ("SYSLOG_IDENTIFIER", IDENTIFIER),
        ("HMA_KIND", alert.kind),
        ("HMA_CODE", alert.code),
        ("HMA_COMPONENT", alert.component),
        ("HMA_SEVERITY", str(alert.severity)),
        ("HMA_ACTION", str(alert.action)),
        ("HMA_PROBE", alert.probe),
        ("HMA_DETAILS", details_json(alert.details)),
        *([("HMA_TS", f"{alert.ts:.6f}")] if alert.ts else []),
    ]


def encode(items: Sequence[tuple[str, str]]) -> bytes:
    """Native protocol datagram: ``KEY=value\\n``, or ``KEY\\n<le64 size><value>\\n`` for values
    containing a newline. Empty values are left out."""
    out = bytearray()
    for key, value in items:
        if value == "":
            continue
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode("ascii") + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode("ascii") + b"=" + data + b"\n"
    return bytes(out)


def decode(datagram: bytes) -> dict[str, str]:
    """Inverse of ``encode`` (used by tests and ``hma`` tooling that read a captured datagram)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(datagram):
        nl = datagram.index(b"\n", pos)
        line = datagram[pos:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            out[key.decode("ascii")] = value.decode("utf-8")
            pos = nl + 1
        else:
            (size,) = struct.unpack("<Q", datagram[nl + 1 : nl + 9])
            start = nl + 9
            out[line.decode("ascii")] = datagram[start : start + size].decode("utf-8")
            pos = start + size + 1
    return out


def stderr_line(items: Sequence[tuple[str, str]]) -> str:
    """The fallback form of an entry: one line, ``hma: MESSAGE [KEY=value ...]``."""
    data = dict(items)
    extra = " ".join(
        f"{k}={v}"
        for k, v in items
        if k.startswith("HMA_") and k not in ("HMA_DETAILS", "HMA_TS") and v
    )
    return f"hma: <{data['PRIORITY']}> {data['MESSAGE']} [{extra}] details={data['HMA_DETAILS']}"


class JournalReporter(Reporter):
    """Sends one journal entry per alert; falls back to stderr and never raises."""

    name = "journald"
    default_enabled = True
    options: ClassVar[Mapping[str, Option]] = {
        "socket": Option(
            "path",
            DEFAULT_SOCKET,
            "journald's native socket (a namespace: /run/systemd/journal.NS/socket).",
        ),
    }

    def __init__(self, options: Mapping[str, Any], stderr: Optional[IO[str]] = None) -> None:
        super().__init__(options)
        self.path = str(options.get("socket") or DEFAULT_SOCKET)
        self._stderr = stderr
        self._sock: Optional[socket.socket] = None
        self._failing: Optional[str] = None  # why the last send failed (None: journald works)
        self.sent = 0  # entries journald accepted
        self.fallbacks = 0  # entries written to stderr instead

    def alert(self, alert: Alert) -> None:
        """Send the alert's entry; on any socket problem write it to stderr instead."""
        items = fields(alert)
        problem = self._send(encode(items))
        if problem is None:
            if self._failing is not None:
                self._write(f"hma: journald reachable again at {self.path}")
            self._failing = None
            self.sent += 1
            return
        if self._failing is None:
            self._write(
                f"hma: cannot send to journald at {self.path} ({problem}); alerts go to stderr"
            )
        self._failing = problem
        self.fallbacks += 1
        self._write(stderr_line(items))

    def _send(self, datagram: bytes) -> Optional[str]:
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.settimeout(SEND_TIMEOUT_S)
            self._sock.sendto(datagram, self.path)
        except OSError as exc:  # missing, stale (ECONNREFUSED), denied, timeout, EMSGSIZE...
            self.close()
            return f"{type(exc).__name__}: {exc.strerror or exc}"
        return None

    def _write(self, line: str) -> None:
        stream = self._stderr if self._stderr is not None else sys.stderr
        try:
            print(line, file=stream, flush=True)
        except (OSError, ValueError):  # stderr closed: nothing left to tell
            pass

    def close(self) -> None:
        """Close the socket (a later alert opens a new one)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


# --- the journal message catalog ----------------------------------------------------------------

_FAMILY_TEXT = {
    "GPU": "an NVIDIA GPU (NVML, nvidia-smi, Xid kernel messages)",
    "NEURON": "an AWS Neuron device",
    "EFA": "an EFA network adapter or the fabric between nodes",
    "IB": "an InfiniBand or RoCE port (mlx5 and other non-EFA RDMA devices)",
    "SYS": "the host itself (memory, CPUs, filesystems, processes)",
    "KERNEL": "the kernel log (a message the agent recognises)",
    "HMA": "the agent itself (a probe that failed, timed out or hung; its state or config)",
    "SLURM": "the node's Slurm daemons or its state in the controller",
    "SITE": "a site probe (an executable in /etc/hma/probes.d)",
    "DEEP": "a deep health check (`hma deep-check`: stress, diagnostics, bandwidth)",
    "OTHER": "a code outside the known families (a third-party probe)",
}
_KIND_TEXT = {
    "raised": (
        "@HMA_CODE@ raised on @HMA_COMPONENT@",
        "The agent found a fault: it was observed often enough (or once, for fatal codes) to be\n"
        "active. Severity @HMA_SEVERITY@, recommended action @HMA_ACTION@, reported by probe\n"
        "@HMA_PROBE@. Critical hardware faults drain the node through remediation; follow-up\n"
        "entries say what was done. The evidence is in the HMA_DETAILS field (JSON).",
    ),
    "escalated": (
        "@HMA_CODE@ escalated on @HMA_COMPONENT@",
        "An active fault became worse: its severity or recommended action rose (now\n"
        "@HMA_SEVERITY@, action @HMA_ACTION@). The evidence is in the HMA_DETAILS field (JSON).",
    ),
    "cleared": (
        "@HMA_CODE@ cleared on @HMA_COMPONENT@",
        "An active fault went away: good observations, a reboot, an operator acknowledgement or\n"
        "its window expired, as the catalogue says for this code. Drains the agent owns are\n"
        "lifted once no draining fault is left.",
    ),
    "action_requested": (
        "Action requested for @HMA_CODE@ on @HMA_COMPONENT@",
        "Remediation decided an action (drain, reboot or replace request) and wrote it to the\n"
        "outbox before attempting it. It is done exactly once in effect, even across restarts.",
    ),
    "action_applied": (
        "Action applied for @HMA_CODE@ on @HMA_COMPONENT@",
        "The requested action took effect in Slurm or through the cluster hook.",
    ),
    "action_held": (
        "Action held back for @HMA_CODE@ on @HMA_COMPONENT@",
        "Remediation would act but holds back: the circuit breaker is open (too many nodes\n"
        "already drained by the agent), a rate limit applies, the policy is none, or dry run is\n"
        "on. HMA_DETAILS says which. An operator should look at the node.",
    ),
    "action_failed": (
        "Action failed for @HMA_CODE@ on @HMA_COMPONENT@",
        "An attempt to apply an action failed (for example slurmctld was unreachable). It is\n"
        "retried with backoff; the error is in HMA_DETAILS.",
    ),
    "acknowledged": (
        "@HMA_CODE@ acknowledged on @HMA_COMPONENT@",
        "An operator ran `hma ack` for this fault; who and when are in HMA_DETAILS.",
    ),
    "agent": (
        "hma: about the agent itself",
        "A message about the agent itself: it started or stopped, a configuration reload\n"
        "failed (the old configuration stays), or its state database was reset.",
    ),
}
assert set(_KIND_TEXT) == set(ALERT_KINDS) and set(_FAMILY_TEXT) == set(ALL_FAMILIES)


def catalog_text() -> str:
    """The journal message catalog (hma.catalog) for every MESSAGE_ID, systemd catalog format."""
    out = [
        "#  SPDX-License-Identifier: Apache-2.0",
        "#",
        "#  Message catalog for hma, the node health monitoring agent. Generated by",
        "#  hma.reporters.journal.catalog_text(); install to /usr/lib/systemd/catalog/ and run",
        "#  `journalctl --update-catalog`; `journalctl -x` then explains each entry.",
    ]
    for fam in ALL_FAMILIES:
        for kind in ALERT_KINDS:
            subject, body = _KIND_TEXT[kind]
            out += [
                "",
                f"-- {message_id(fam, kind)}",
                f"Subject: {subject}",
                f"Defined-By: {IDENTIFIER}",
                "Documentation: file:///usr/share/doc/hma/alerting.md",
                "",
                f"This is about {_FAMILY_TEXT[fam]}.",
                body,
                "",
                "`hma explain @HMA_CODE@` prints what the code means and what to do;",
                "`hma status` shows the node's current faults and actions.",
            ]
    return "\n".join(out) + "\n"
