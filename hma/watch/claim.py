"""Exactly one acting watcher per cluster.

A watcher acts only where both hold: ``scontrol ping`` says the slurmctld in service (the first
controller it reports UP: the primary, or the backup while the primary is down) runs on this host
(``[watch] controller_names``), and this watcher holds the claim: a small file (``[watch]
claim_file``) naming its holder id and a lease end, taken under ``flock`` and kept for the pass.
A second watcher that finds the claim held, unexpired, by another holder, or the lock taken,
stays passive. The lease lasts three intervals (at least 90 s): a watcher that died is replaced
once its lease ends; a restarted one keeps its holder id and takes its own claim back at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional, Sequence

from hma.adapters.command import CommandRunner
from hma.reporters.statusfile import write_text

_PING = re.compile(r"Slurmctld\((primary|backup\d*)\) at (\S+) is (UP|DOWN)")
MIN_LEASE_S = 90.0


def in_service(text: str) -> Optional[str]:
    """The host of the slurmctld in service in ``scontrol ping``'s output: the first one UP
    (None when none is)."""
    for _role, host, status in _PING.findall(text):
        if status == "UP":
            return host
    return None


def own_names() -> tuple[str, ...]:
    """This host's names: the host name, its short form and the FQDN."""
    name = socket.gethostname()
    names = [name, name.split(".")[0]]
    try:
        names.append(socket.getfqdn())
    except OSError:
        pass
    return tuple(dict.fromkeys(names))


def primary_here(
    scontrol: Sequence[str], env: dict[str, str], timeout: float, names: Sequence[str]
) -> tuple[bool, str]:
    """(whether this host's slurmctld is the one in service, why not)."""
    result = CommandRunner().run([*scontrol, "ping"], timeout, env=env)
    host = in_service(result.stdout)
    if host is None:
        return False, "scontrol ping reports no slurmctld UP"
    if host not in (names or own_names()):
        return False, f"slurmctld in service runs on {host}"
    return True, ""


@dataclass
class Claim:
    """The claim file of the acting watcher (see the module doc)."""

    path: Path
    holder: str
    lease: float
    _lock: Optional[IO[str]] = None

    def take(self, now: float) -> str:
        """Take or renew the claim; "" when this watcher holds it, else why not. The lock is
        held until ``release``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{self.path}.lock", "a+", encoding="utf-8")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            return "another watcher holds the claim's lock"
        other = self._other(now)
        if other:
            lock.close()
            return other
        doc = {"holder": self.holder, "host": own_names()[0], "pid": os.getpid()}
        doc["until"] = now + max(self.lease, MIN_LEASE_S)
        write_text(self.path, json.dumps(doc) + "\n")
        self._lock = lock
        return ""

    def _other(self, now: float) -> str:
        """Why another watcher's claim stands ("" when none does)."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            holder, until = str(doc["holder"]), float(doc["until"])
            host = str(doc.get("host", "?"))
        except (OSError, ValueError, KeyError, TypeError):
            return ""  # no claim, or one that does not read: taken over
        if holder != self.holder and until > now:
            return f"claim held by watcher {holder[:8]} on {host} until {until:.0f}"
        return ""

    def release(self) -> None:
        """Let go of the lock (the lease stays until it ends)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None
