"""Requested health checks: a folder any user can drop a file into to ask the agent for a run of
every probe now (``hma check --request``; ``hma srun --auto-resume`` after a failed step).

The channel carries no data: the agent looks only at whether a file is there and at its mtime,
never at its name or content, and deletes the files a run answered. The folder is the agent's
(made at start, mode 1733: anyone may add a file, nobody else may list it), never reached
through a symlink. At most one requested run per ``min_interval``: a flood of files costs one
run. The run goes through the normal verdict and remediation path (docs/security.md).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from hma.contracts.model import ProbeRun
from hma.health.pipeline import Pipeline

log = logging.getLogger("hma")

TIMEOUT_S = 900.0  # a requested run that has not finished by then is given up (unknown)
FUTURE_S = 60.0  # a request file dated further ahead was dated by its maker (touch -d): deleted
MODE = 0o1733  # sticky, writable and searchable by all, listable by the owner only


class FolderError(Exception):
    """The request folder cannot be used safely (a symlink, not ours, not a folder)."""


def ensure(path: str) -> None:
    """Make the request folder (mode 1733, ours) or check the one there; raises ``FolderError``
    when it is a symlink, not a folder, or owned by someone else."""
    try:
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)  # the run folder, at start
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise FolderError(f"cannot make {path}: {exc.strerror or exc}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
        raise FolderError(f"{path} is not a folder of ours: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise FolderError(f"{path} is owned by uid {info.st_uid}, not by the agent")
        if stat.S_IMODE(info.st_mode) != MODE:
            os.fchmod(fd, MODE)
    finally:
        os.close(fd)


def configure(
    agent: Mapping[str, Any], current: Optional[CheckRequests], pipeline: Pipeline
) -> Optional[CheckRequests]:
    """The channel of ``[agent]`` (``check_requests``, else ``<run_dir>/check-requests``), its
    folder made or checked; ``current`` kept when the folder is the same; None (logged) when the
    folder cannot be used. ``pipeline``: its model's verdict is a requested run's answer."""
    path = agent["check_requests"] or os.path.join(agent["run_dir"], "check-requests")
    try:
        ensure(path)
    except FolderError as exc:
        log.warning("requested checks are off: %s", exc)
        return None
    checks = current if current is not None and current.path == path else None
    checks = checks or CheckRequests(path, float(agent["check_request_interval"]), pipeline)
    checks.min_interval = float(agent["check_request_interval"])
    return checks


@dataclass
class Requested:
    """The last requested run: when it started (it answers every request file older), when it
    finished, and the node's verdict then."""

    at: float
    done: Optional[float] = None
    verdict: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """The ``requested`` block of status.json."""
        return {"at": self.at, "done": self.done, "verdict": self.verdict}


class CheckRequests:
    """The agent's side: ``poll`` each loop tick says when to start a requested run, ``finish``
    records its verdict."""

    def __init__(self, path: str, min_interval: float, pipeline: Pipeline) -> None:
        self.path, self.min_interval, self.pipeline = path, min_interval, pipeline
        self.last: Optional[Requested] = None
        self.pending: set[str] = set()  # probes the running requested run still waits for
        self._seen_ns = -1  # the folder's mtime when it was last listed
        self._waiting = False  # request files seen, the run held back by the rate limit

    def poll(self, now: float) -> bool:
        """Whether a requested run starts now (then ``start`` was called for it): a request file
        newer than the last run is there, no run is in progress, ``min_interval`` has passed."""
        try:
            info = os.lstat(self.path)
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        if info.st_mtime_ns == self._seen_ns and not self._waiting:
            return False  # nothing added since the last look: one stat per tick
        if self.pending and self.last and now - self.last.at > TIMEOUT_S:
            log.warning(
                "requested check: no run of %s within %g s", sorted(self.pending), TIMEOUT_S
            )
            self.finish(now, "unknown")
        if self.pending or (self.last and now - self.last.at < self.min_interval):
            self._waiting = True
            return False
        self._waiting = False
        found = self._take(now)
        self._seen_ns = info.st_mtime_ns  # as before the listing: our deletions list it again
        if not found:
            return False
        self.last = Requested(now)
        return True

    def _take(self, now: float) -> bool:
        """Delete the request files made up to ``now``; whether there was one."""
        found = False
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            for name in os.listdir(fd):
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if info.st_mtime > now + FUTURE_S:  # its maker set it ahead: no request
                        os.unlink(name, dir_fd=fd)
                    elif info.st_mtime <= now:
                        os.unlink(name, dir_fd=fd)
                        found = True
                    else:
                        self._waiting = True  # made after the run starts: the next run's
                except OSError:
                    continue  # gone already
        finally:
            os.close(fd)
        return found

    def start(self, probes: Iterable[str], now: float) -> list[str]:
        """The requested run waits for a run of each of ``probes`` started from now (returned);
        with none it is done at once."""
        self.pending = set(probes)
        if not self.pending:
            self.finish(now)
        return sorted(self.pending)

    def ran(self, name: str, run: ProbeRun, now: float) -> bool:
        """A probe's run finished (its result applied); True when it was the requested run's
        last one (its verdict is recorded)."""
        if self.last is None or self.last.done is not None or run.started < self.last.at:
            return False
        self.pending.discard(name)
        if self.pending:
            return False
        self.finish(now)
        return True

    def finish(self, now: float, verdict: Optional[str] = None) -> None:
        """The requested run is complete: the node's verdict now (or ``verdict``)."""
        if self.last is not None:
            self.last.done = now
            self.last.verdict = verdict or str(self.pipeline.model.verdict(now).severity)
            self.pending.clear()
            log.info("requested check done: %s", self.last.verdict)

    def to_json(self) -> Optional[dict[str, Any]]:
        """status.json's ``requested`` block (None before the first request)."""
        return self.last.to_json() if self.last is not None else None
