"""One daemon per state folder: ``hma run`` holds ``state_dir``/hma.lock (flock) for its life."""

from __future__ import annotations

import fcntl
import logging
import os
from typing import Optional

log = logging.getLogger("hma")

LOCK_FILE = "hma.lock"
EX_RUNNING = 75  # EX_TEMPFAIL: another `hma run` holds the state folder


class AlreadyRunning(Exception):
    """Another daemon holds the lock of this state folder."""


def hold_lock(state_dir: str) -> Optional[int]:
    """Lock ``state_dir``/hma.lock (flock) for this process's life, writing the pid in it: one
    daemon per state folder. Raises ``AlreadyRunning``; None (logged) when the file cannot be
    opened at all (a failing disk must not stop the agent: the store falls back to memory)."""
    path = os.path.join(state_dir, LOCK_FILE)
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        log.warning(
            "cannot open the lock file %s (%s): not guarding against a second daemon", path, exc
        )
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise AlreadyRunning(
            f"another hma run (pid {holder or '?'}) uses the state folder {state_dir} "
            f"(it holds {path})"
        ) from None
    except OSError as exc:  # a file system without locks: run unguarded, as above
        os.close(fd)
        log.warning("cannot lock %s (%s): not guarding against a second daemon", path, exc)
        return None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:  # a full disk: the lock holds, only the pid in it is missing
        log.warning("cannot write the pid into %s (%s)", path, exc)
    return fd
