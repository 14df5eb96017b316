"""``hma run``: the agent's daemon.

The loop, its messages and its wiring (loop); what follows a verdict: remediation, the
reporters, status.json (effects); the loop's timed duties (housekeeping); the operator requests
it applies (operator); the lock that keeps one daemon per state folder (lock). The probe
scheduler and the event sources' supervisor are hma.detection's (scheduler, sources); the status
document is built by the status reporter (hma.reporters.statusfile) from the loop's snapshot.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Optional

from hma import assembly
from hma.adapters import logs
from hma.adapters.notify import Notifier
from hma.config.schema import EX_CONFIG, ConfigError
from hma.daemon import lock
from hma.daemon.loop import Daemon
from hma.health.store import StateError
from hma.remediation import blind

log = logging.getLogger("hma")


def main(config_file: Optional[str], log_level: Optional[str] = None) -> int:
    """``hma run``: exit 78 on an invalid configuration (the unit prevents restarts on it), 75
    when another daemon holds the state folder. ``log_level`` (``--log-level``) overrides
    ``[agent] log_level``."""
    logs.configure(log_level or "info")
    try:
        daemon = Daemon(config_file, log_level=log_level or "")
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        refused(config_file, exc.errors)
        return EX_CONFIG
    except StateError as exc:
        log.error("state folder unusable: %s", exc)
        return 73  # EX_CANTCREAT
    except lock.AlreadyRunning as exc:
        log.error("%s", exc)
        return lock.EX_RUNNING
    return daemon.run()


def refused(config_file: Optional[str], errors: list[str]) -> None:
    """``hma run`` refuses an invalid configuration: say so in the unit's status (``STATUS=``),
    journald and the node's label field (hma.remediation.blind), from what can be read."""
    Notifier().send(STATUS=f"refused to start: invalid configuration: {errors[0]}"[:400])
    for line in blind.report(assembly.salvaged(config_file), errors, "hma run", time.time()):
        log.error("%s", line)
