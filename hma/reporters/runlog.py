"""The health check's run log, ``<state_dir>/healthcheck.log`` (docs/slurm.md): what each
``hma healthcheck`` run printed, as one block per run, the newest last.

LBNL NHC appends every run to /var/log/nhc.log and leaves the size to logrotate; this log bounds
itself: the last ``MAX_RUNS`` runs within ``MAX_BYTES``, a run's block cut at ``MAX_RUN_BYTES``.
It lives in hma's own state folder (root's, 0700: no folder shared with other writers). Each
write replaces the file atomically (a temp file in the folder, then a rename), the folder opened
without following a symlink and locked (flock) against a run at the same time; a log file that
is a symlink or not a regular file is left as it is and not written. A log that cannot be
written costs one line on stderr, never the check.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import IO, Iterator, Optional

from hma.adapters.text import printable

FILENAME = "healthcheck.log"
MAX_RUNS = 100
MAX_BYTES = 1 << 20
MAX_RUN_BYTES = 64 << 10
HEAD = "=== "  # a block's first line; its other lines are indented, so none starts so
_LOCK_TRIES = 20  # of 50 ms: a concurrent run holds the lock only while it rewrites the file


class _Tee:
    """A text stream that also hands each complete line to its run log."""

    def __init__(self, stream: IO[str], log: RunLog) -> None:
        self.stream = stream
        self.log = log
        self.partial = ""

    def write(self, text: str) -> int:
        """Write ``text`` to the stream; its complete lines go to the log."""
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            self.log.add(line)
        return self.stream.write(text)

    def flush(self) -> None:
        """Flush the stream."""
        self.stream.flush()

    def fileno(self) -> int:
        """The stream's descriptor (journald's stream check reads it)."""
        return self.stream.fileno()

    def isatty(self) -> bool:
        """Whether the stream is a terminal."""
        return self.stream.isatty()


class RunLog:
    """One run's lines (``add``, and what it prints while in ``capture``), written as one block
    by ``close``; ``folder`` None: no log (``[healthcheck] log = false``)."""

    def __init__(self, folder: Optional[str], started: float) -> None:
        self.folder = folder
        self.started = started
        self.lines: list[str] = []
        self.size = 0
        self.cut = 0  # lines left out past MAX_RUN_BYTES
        self._tees: list[_Tee] = []
        self._lock = threading.Lock()
        self._closed = False

    def add(self, line: str) -> None:
        """One line of the run (escaped: it may hold text others wrote)."""
        text = "  " + printable(line)
        if self.cut or self.size + len(text) + 1 > MAX_RUN_BYTES:
            self.cut += 1
            return
        self.lines.append(text)
        self.size += len(text) + 1

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """stdout and stderr copied into the run's lines while in the ``with``."""
        out, err = sys.stdout, sys.stderr
        self._tees = [_Tee(out, self), _Tee(err, self)]
        sys.stdout, sys.stderr = self._tees
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err

    def close(self, code: int, now: Optional[float] = None) -> None:
        """Write the run's block, with its exit code, once: at the run's end or when it gives up
        at its timeout, whichever comes first (the other waits at most a few seconds)."""
        if not self._lock.acquire(timeout=3.0):
            return
        try:
            if self._closed or self.folder is None:
                return
            self._closed = True
            for tee in self._tees:
                if tee.partial:
                    self.add(tee.partial)
            problem = write(Path(self.folder), self.block(code, now))
        finally:
            self._lock.release()
        if problem:
            print(f"hma healthcheck: run log not written: {printable(problem)}", file=sys.stderr)

    def block(self, code: int, now: Optional[float] = None) -> str:
        """The run's block: a head line (when, pid, exit code, time taken), then its lines."""
        now = time.time() if now is None else now
        when = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started))
        head = f"{HEAD}{when} hma healthcheck pid {os.getpid()}: exit {code}, "
        head += f"{max(0.0, now - self.started):.1f} s"
        lines = [head, *self.lines]
        if self.cut:
            lines.append(
                f"  ... {self.cut} more lines not kept (a run keeps {MAX_RUN_BYTES} bytes)"
            )
        return "\n".join(lines) + "\n"


def blocks(text: str) -> list[str]:
    """The runs' blocks of a log's ``text``, oldest first (text before the first head line, as
    a cut read leaves, is dropped)."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith(HEAD):
            out.append(line)
        elif out:
            out[-1] += line
    return out


def kept(old: list[str], new: str, runs: int = MAX_RUNS, size: int = MAX_BYTES) -> str:
    """The log's new text: the newest of ``old`` that fit with ``new`` in ``runs`` runs and
    ``size`` bytes, then ``new``."""
    keep = [new]
    total = len(new.encode("utf-8"))
    for item in reversed(old):
        total += len(item.encode("utf-8"))
        if len(keep) >= runs or total > size:
            break
        keep.append(item)
    return "".join(reversed(keep))


def write(folder: Path, block: str) -> str:
    """Add ``block`` to ``folder``/healthcheck.log (the folder made, 0700, as the state store
    makes it); "" or why it was not written."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        dirfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        return f"{folder}: {_why(exc)}"
    try:
        if not _locked(dirfd):
            return f"{folder / FILENAME}: another health check is writing it"
        old, problem = _read(dirfd)
        if problem:
            return f"{folder / FILENAME}: {problem}"
        _replace(dirfd, kept(blocks(old), block))
    except OSError as exc:
        return f"{folder / FILENAME}: {_why(exc)}"
    finally:
        os.close(dirfd)  # releases the lock
    return ""


def _why(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "is a symlink or not a folder; not followed"
    return exc.strerror or str(exc)


def _locked(dirfd: int) -> bool:
    for _ in range(_LOCK_TRIES):
        try:
            fcntl.flock(dirfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.05)
    return False


def _read(dirfd: int) -> tuple[str, str]:
    """(the log's text, at most its last MAX_BYTES; "" when there is none) and a problem."""
    try:
        fd = os.open(FILENAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
    except FileNotFoundError:
        return "", ""
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "", "is a symlink; left as it is, not followed"
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "", "is not a regular file; left as it is"
        os.lseek(fd, max(0, info.st_size - MAX_BYTES), os.SEEK_SET)
        data = os.read(fd, MAX_BYTES)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace"), ""


def _replace(dirfd: int, text: str) -> None:
    tmp = f".{FILENAME}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):  # left by a run of the same pid, killed
        os.unlink(tmp, dir_fd=dirfd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(tmp, flags, 0o640, dir_fd=dirfd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(tmp, FILENAME, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dirfd)
        raise
