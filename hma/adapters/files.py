"""Reads of sysfs/procfs under an injectable root (as node_exporter's --path.sysfs)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, Optional

from hma.adapters.strict import ParseError, parse_uint


class ReadError(Exception):
    """A file under the root is missing, unreadable or malformed; the message names the path."""


class _Absent(ReadError):
    """The path positively does not exist (not even as a dangling symlink)."""


def _read_error(target: str, exc: OSError) -> ReadError:
    """The ReadError for a failed open or listing: ``_Absent`` when nothing is there at all."""
    if isinstance(exc, FileNotFoundError):
        if os.path.lexists(target):
            return ReadError(f"{target}: dangling symlink")
        return _Absent(f"{target}: {exc.strerror or exc}")
    return ReadError(f"{target}: {exc.strerror or exc}")


class RootReader:
    """Read small text files below ``root``; paths are given relative to it (``class/net``)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self._base = str(self.root)

    def path(self, rel: str) -> Path:
        """Absolute path of ``rel`` under the root."""
        return self.root / rel.lstrip("/")

    def text(self, rel: str, limit: int = 65536) -> str:
        """File content stripped of surrounding whitespace (a missing newline is fine).

        Content that is not UTF-8 text, or holds NUL bytes, is a ReadError: a value hma cannot
        read is unknown, never a reading.
        """
        target = os.path.join(self._base, rel.lstrip("/"))
        data = self.data(rel, limit)
        if b"\0" in data:
            raise ReadError(f"{target}: NUL bytes in a text attribute")
        try:
            return data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ReadError(f"{target}: not UTF-8 text") from None

    def data(self, rel: str, limit: int = 65536) -> bytes:
        """Up to ``limit`` bytes of a regular file (``/proc/PID/cmdline``: NUL-separated)."""
        target = os.path.join(self._base, rel.lstrip("/"))
        try:  # non-blocking open: a FIFO in place of an attribute must not hang the probe
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise _read_error(target, exc) from None
        try:  # fstat, read, close and nothing more: probes read hundreds of attributes a run
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ReadError(f"{target}: not a regular file")
            data = os.read(fd, limit)
            while data and len(data) < limit:  # procfs seq_files answer a page per read
                more = os.read(fd, limit - len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise ReadError(f"{target}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        return data

    def text_or_none(self, rel: str) -> Optional[str]:
        """Like ``text`` but None when the file positively does not exist (a dangling symlink
        or a symlink loop in its place still raises: what is there cannot be read)."""
        try:
            return self.text(rel)
        except _Absent:
            return None

    def integer(self, rel: str) -> int:
        """File content as an unsigned 64-bit int (ASCII decimal or 0x hex; hma.adapters.strict)."""
        try:
            return parse_uint(self.text(rel))
        except ParseError as exc:
            raise ReadError(f"{self.path(rel)}: {exc}") from None

    def listdir(self, rel: str) -> list[str]:
        """Sorted entries of a folder; empty when it positively does not exist (a dangling
        symlink in its place is a ReadError: what is there cannot be read)."""
        target = self.path(rel)
        try:
            return sorted(os.listdir(target))
        except OSError as exc:
            error = _read_error(str(target), exc)
        if isinstance(error, _Absent):
            return []
        raise error

    def realname(self, rel: str) -> str:
        """Last component of the resolved symlink target (e.g. the PCI address of a device link)."""
        return os.path.basename(os.path.realpath(self.path(rel)))


COMM_LEN = 15  # TASK_COMM_LEN - 1: the characters of a command name the kernel keeps in comm


def running_processes(procfs: RootReader, names: Iterable[str]) -> set[str]:
    """Which of ``names`` run, read under ``procfs``; ReadError when it cannot be listed.

    ``PID/comm`` keeps 15 characters: a longer name matches a comm equal to its first 15 when
    the basename of ``PID/cmdline``'s argv[0] is the name, or when there is no argv[0] to tell.
    """
    wanted = set(names)
    long: dict[str, set[str]] = {}
    for name in wanted:
        if len(name) > COMM_LEN:
            long.setdefault(name[:COMM_LEN], set()).add(name)
    found: set[str] = set()
    for pid in procfs.listdir(""):
        if not pid.isdigit():
            continue
        try:
            comm = procfs.text(f"{pid}/comm")
            found |= {comm} & wanted
            if comm in long:
                found |= _long_names(procfs, pid, long[comm])
        except ReadError:
            continue  # exited while we looked
    return found


def _long_names(procfs: RootReader, pid: str, names: set[str]) -> set[str]:
    """Those of ``names`` that are the basename of ``pid``'s argv[0]; all of them when there is
    no argv[0] (no cmdline file in a fixture tree, an empty one for a zombie)."""
    try:
        argv0 = procfs.data(f"{pid}/cmdline", 4096).split(b"\0")[0]
    except _Absent:
        return names
    if not argv0:
        return names
    return names & {os.path.basename(argv0).decode("utf-8", "replace")}
