"""The status reporter: the daemon hands it a ``Snapshot`` of plain data after every change;
it builds the status.json document (``document``, docs/status.md), offers it to the file's
writer (hma.reporters.statusfile) and publishes what was written to the other reporters. The
daemon imports it, and ``hma healthcheck`` without a daemon (its run's document); the other
commands read the file through hma.reporters.statusfile alone.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from hma import __version__
from hma.contracts.model import ProbeRun
from hma.contracts.reporter import Reporter
from hma.reporters import statusfile

log = logging.getLogger("hma")


@dataclass(frozen=True)
class ProbeStatus:
    """One probe as the document shows it: its last run (None: none yet), the wall-clock time
    of its next run, the digest of its last snapshot."""

    name: str
    last: Optional[ProbeRun]
    next_run: float
    summary: Any

    def to_json(self) -> dict[str, Any]:
        """The probe's entry of ``probes`` (docs/status.md)."""
        last = self.last
        return {
            "name": self.name,
            "status": str(last.status) if last else "pending",
            "last_run": last.started if last else None,
            "duration_s": round(last.duration_s, 4) if last else None,
            "next_run": round(self.next_run, 1),
            "error": last.error if last else "",
            "findings": len(last.findings) if last else 0,
            "summary": self.summary,
        }


@dataclass(frozen=True)
class Snapshot:
    """What the daemon hands the status reporter: the node's state at ``generated``, as plain
    data (the faults as JSON, in the order shown; remediation's own status block)."""

    node: str
    boot_id: str
    started: float
    generated: float
    severity: str
    action: str
    active: int  # active faults
    instance_type: Optional[str]
    topology: Mapping[str, str]
    probes: tuple[ProbeStatus, ...]
    faults: tuple[Mapping[str, Any], ...]
    remediation: Mapping[str, Any]
    maintenance: Optional[Mapping[str, Any]] = None
    sources: tuple[Mapping[str, Any], ...] = ()  # the event sources' states, by name
    requested: Optional[Mapping[str, Any]] = None  # the last requested check (hma.daemon.checkreq)


def document(snapshot: Snapshot, heartbeat_s: float, writer: str = "") -> dict[str, Any]:
    """The status.json document of ``snapshot`` (docs/status.md), written by this process: the
    daemon, or ``writer`` (statusfile.HEALTHCHECK: a health check run without a daemon, which
    ``heartbeat_s`` after it expects the next run)."""
    return {
        "schema": statusfile.SCHEMA,
        **({"writer": writer} if writer else {}),
        "version": __version__,
        "node": snapshot.node,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "boot_id": snapshot.boot_id,
        "started": snapshot.started,
        "generated": snapshot.generated,
        "heartbeat_s": heartbeat_s,
        "severity": snapshot.severity,
        "action": snapshot.action,
        "instance_type": snapshot.instance_type,
        "topology": snapshot.topology,
        "probes": [p.to_json() for p in snapshot.probes],
        "sources": list(snapshot.sources),
        "faults": list(snapshot.faults),
        "remediation": snapshot.remediation,
        **({"maintenance": snapshot.maintenance} if snapshot.maintenance is not None else {}),
        **({"requested": snapshot.requested} if snapshot.requested is not None else {}),
    }


def status_line(severity: str, active: int, probes: int) -> str:
    """The one line the daemon shows systemd (``STATUS=``)."""
    return f"{severity}: {active} active fault(s), {probes} probes"


class StatusReporter:
    """The daemon's status.json: each snapshot's document is offered to a ``StatusWriter``
    (written when it changed, at most a few times a second, or the heartbeat is due) and what
    was written goes to the other reporters. ``error``: why the last write failed ("" none)."""

    def __init__(self, path: Union[str, Path], heartbeat_s: float) -> None:
        self.path = Path(path)
        self.writer = statusfile.StatusWriter(self.path, heartbeat_s)
        self.error = ""

    def publish(self, snapshot: Snapshot, reporters: Sequence[Reporter]) -> None:
        """Offer the document of ``snapshot``; the reporters publish it when it was written."""
        doc = document(snapshot, self.writer.heartbeat_s)
        try:
            if not self.writer.offer(doc, time.monotonic()):
                return
            self.error = ""
        except OSError as exc:  # reported once by the daemon, as HMA_STATE_WRITE_FAILED
            self.error = f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # a non-finite number (never JSON)
            log.error("cannot write %s: %s", self.path, exc)
        for reporter in reporters:
            try:
                reporter.publish(doc)
            except Exception as exc:  # noqa: BLE001 - a failing reporter never stops the loop
                log.error("reporter %s failed: %s", reporter.name, exc)
