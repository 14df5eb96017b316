"""The agent's log lines on stderr, with a level journald understands.

Under systemd, stderr is a stream to journald (``JOURNAL_STREAM`` names its device and inode);
each line then starts with the sd-daemon level prefix (``<3>`` for an error, sd-daemon(3)), so
``journalctl -p err -u hma`` shows the agent's errors. Elsewhere (a terminal, a pipe) the lines
are plain. ``level`` is one of ``LEVELS`` (``[agent] log_level``, ``hma run --log-level``,
``hma check --debug``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import IO, Optional

LEVELS = ("debug", "info", "warning", "error")
FORMAT = "hma: %(levelname)s %(message)s"
# syslog priorities of sd-daemon.h by logging level
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def priority(levelno: int) -> int:
    """The syslog priority of a logging level (a custom level: the next standard one above)."""
    for level, prio in sorted(_PRIORITY.items()):
        if levelno <= level:
            return prio
    return 2


def journal_stream(stream: IO[str]) -> bool:
    """Whether ``stream`` is the journald stream systemd connected (``JOURNAL_STREAM``)."""
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


class _Prefixed(logging.Formatter):
    """Every line of a record prefixed with ``<priority>`` (journald splits at newlines)."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


class _Handler(logging.StreamHandler):
    """The handler ``configure`` installs (replaced, never stacked, by a second call)."""


def configure(level: str = "info", stream: Optional[IO[str]] = None) -> None:
    """Log to ``stream`` (stderr) at ``level``, level-prefixed when it is journald's stream."""
    stream = sys.stderr if stream is None else stream
    handler = _Handler(stream)
    handler.setFormatter(_Prefixed(FORMAT) if journal_stream(stream) else logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)


def set_level(level: str) -> None:
    """Change the level (a reload of ``[agent] log_level``)."""
    logging.getLogger().setLevel(level.upper())
