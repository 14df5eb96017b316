"""The agent's log lines on stderr, with a level journald understands.

Under systemd, stderr is a stream to journald (``JOURNAL_STREAM`` names its device and inode);
each line then starts with the sd-daemon level prefix (``<3>`` for an error, sd-daemon(3)), so
``journalctl -p err -u hma`` shows the agent's errors. Elsewhere (a terminal, a pipe) the lines
are plain. ``level`` is one of ``LEVELS`` (``[agent] log_level``, ``hma run --log-level``,
``hma check --debug``).

``logging`` is imported only by ``configure`` (and by the daemon): the one-shot commands that
never log (``hma check`` without ``--debug``) do not pay for it, and ``debug_logger`` tells the
adapters at no cost that debug lines are off.
"""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import logging

LEVELS = ("debug", "info", "warning", "error")
FORMAT = "hma: %(levelname)s %(message)s"
# syslog priorities of sd-daemon.h by logging level (DEBUG 10 ... CRITICAL 50)
_PRIORITY = {10: 7, 20: 6, 30: 4, 40: 3, 50: 2}
_HANDLER_MARK = "_hma_stderr"


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


def configure(level: str = "info", stream: Optional[IO[str]] = None) -> None:
    """Log to ``stream`` (stderr) at ``level``, level-prefixed when it is journald's stream; a
    second call replaces the handler of the first."""
    import logging

    class Prefixed(logging.Formatter):
        """Every line of a record prefixed with ``<priority>`` (journald splits at newlines)."""

        def format(self, record: logging.LogRecord) -> str:
            prefix = f"<{priority(record.levelno)}>"
            return "\n".join(prefix + line for line in super().format(record).split("\n"))

    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(Prefixed(FORMAT) if journal_stream(stream) else logging.Formatter(FORMAT))
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)


def set_level(level: str) -> None:
    """Change the level (a reload of ``[agent] log_level``)."""
    import logging

    logging.getLogger().setLevel(level.upper())


def debug_logger(name: str) -> Optional[logging.Logger]:
    """Logger ``name`` when it logs debug lines, else None (also when nothing imported
    ``logging``: then nobody can have turned debug on)."""
    mod = sys.modules.get("logging")
    if mod is None:
        return None
    log = mod.getLogger(name)
    return log if log.isEnabledFor(mod.DEBUG) else None
