"""Reads of sysfs/procfs under an injectable root (as node_exporter's --path.sysfs)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Iterable, Optional

from hma.adapters.logs import debug_logger
from hma.adapters.strict import (
    ASCII_SPACE,
    U64_MAX,
    ParseError,
    parse_counter,
    parse_uint,
)
from hma.adapters.text import printable

LOG = "hma.read"  # debug: every file a probe read (`hma check --debug`)


class ReadError(Exception):
    """A file under the root is missing, unreadable or malformed; the message names the path."""


def reason(exc: Exception) -> str:
    """A read error's message without the path in front ("<path>: <why>" -> "<why>"), for a
    record that names the path apart."""
    text = str(exc)
    return text.rsplit(": ", 1)[-1] if ": " in text else text


class _Absent(ReadError):
    """The path positively does not exist (not even as a dangling symlink)."""


def _preview(data: bytes, cap: int = 120) -> str:
    """What a debug line shows of a file's content: escaped, one line, capped."""
    text = "'" + printable(data[:cap].decode("utf-8", "replace").strip()) + "'"
    return text + (f" ... ({len(data)} bytes)" if len(data) > cap else "")


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

    def failure(self, rel: str, exc: Exception, **where: Any) -> dict[str, Any]:
        """A read error of ``rel`` as a probe records it in its snapshot: the path, the
        ``reason`` and ``where`` it belongs (``port=``, ``adapter=``, ``device=``)."""
        return {"path": str(self.path(rel)), "error": reason(exc), **where}

    def text(self, rel: str, limit: int = 65536) -> str:
        """File content stripped of surrounding ASCII whitespace (a missing newline is fine).

        Content that is not UTF-8 text, holds NUL bytes or is longer than ``limit`` bytes is a
        ReadError: a value hma cannot read is unknown, never a reading. Unicode spaces are kept,
        so the strict parsers refuse them.
        """
        target = os.path.join(self._base, rel.lstrip("/"))
        data = self.data(rel, limit)
        if b"\0" in data:
            raise ReadError(f"{target}: NUL bytes in a text attribute")
        try:
            return data.decode("utf-8").strip(ASCII_SPACE)
        except UnicodeDecodeError:
            raise ReadError(f"{target}: not UTF-8 text") from None

    def data(
        self, rel: str, limit: int = 65536, *, prefix: bool = False, nofollow: bool = False
    ) -> bytes:
        """A regular file's bytes (``/proc/PID/cmdline``: NUL-separated); a ReadError when it
        holds more than ``limit``: a cut read is never parsed. ``prefix``: the first ``limit``
        bytes are all the caller needs (argv[0]), and a longer file is cut silently.
        ``nofollow``: a symlink in the file's place is a ReadError (files others may plant)."""
        target = os.path.join(self._base, rel.lstrip("/"))
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
        try:  # non-blocking open: a FIFO in place of an attribute must not hang the probe
            fd = os.open(target, flags)
        except OSError as exc:
            log = debug_logger(LOG)
            if log is not None:
                log.debug("read %s: %s", printable(target), exc.strerror or exc)
            raise _read_error(target, exc) from None
        try:  # fstat, read, close and nothing more: probes read hundreds of attributes a run
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ReadError(f"{target}: not a regular file")
            want = limit if prefix else limit + 1  # one byte more tells a cut read
            data = os.read(fd, want)
            while data and len(data) < want:  # procfs seq_files answer a page per read
                more = os.read(fd, want - len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise ReadError(f"{target}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        if len(data) > limit:
            raise ReadError(f"{target}: longer than {limit} bytes (read cut)")
        log = debug_logger(LOG)
        if log is not None:
            log.debug("read %s: %s", printable(target), _preview(data))
        return data

    def text_or_none(self, rel: str) -> Optional[str]:
        """Like ``text`` but None when the file positively does not exist (a dangling symlink
        or a symlink loop in its place still raises: what is there cannot be read)."""
        try:
            return self.text(rel)
        except _Absent:
            return None

    def integer(self, rel: str, *, hex_ok: bool = True, limit: int = U64_MAX) -> int:
        """File content as an unsigned int up to ``limit`` (ASCII decimal, or 0x hex when
        ``hex_ok``; hma.adapters.strict); a file the kernel writes in decimal: ``hex_ok=False``."""
        try:
            return parse_uint(self.text(rel), hex_ok=hex_ok, limit=limit)
        except ParseError as exc:
            raise ReadError(f"{self.path(rel)}: {exc}") from None

    def counter(self, rel: str) -> int:
        """A decimal event counter (``parse_counter``): hex, or -1 written unsigned ("not
        available"), is a ReadError, so it is unknown, never growth."""
        try:
            return parse_counter(self.text(rel))
        except ParseError as exc:
            raise ReadError(f"{self.path(rel)}: {exc}") from None

    def pci_id(self, rel: str) -> int:
        """A PCI id attribute as the kernel writes it ("0x1d0f"), strictly; ReadError otherwise."""
        raw = self.text(rel)
        try:
            if not raw.startswith("0x"):
                raise ParseError(f"not a 0x-prefixed PCI id: {raw[:40]!r}")
            return parse_uint(raw, limit=0xFFFF, hex_ok=True)
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


def boot_time(procfs: str) -> float:
    """When this boot started: ``btime`` of ``<procfs>/stat`` (unix seconds); 0.0 unknown."""
    try:
        lines = RootReader(procfs).text("stat", limit=1 << 20).splitlines()
    except ReadError:
        return 0.0
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "btime" and value.strip().isascii() and value.strip().isdigit():
            return float(value)
    return 0.0


COMM_LEN = 15  # TASK_COMM_LEN - 1: the characters of a command name the kernel keeps in comm


def running_processes(procfs: RootReader, names: Iterable[str]) -> set[str]:
    """Which of ``names`` run, read under ``procfs``; ReadError when it cannot be listed.

    A name matches a process whose ``PID/comm`` is exactly the name (``_comm``). ``PID/comm``
    keeps 15 characters: a longer name matches a comm equal to its first 15 when
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
            comm = _comm(procfs, pid)
            found |= {comm} & wanted
            if comm in long:
                found |= _long_names(procfs, pid, long[comm])
        except ReadError:
            continue  # exited while we looked
    return found


def _comm(procfs: RootReader, pid: str) -> str:
    """``PID/comm`` exactly as the kernel keeps it: the file is the name and one newline, and
    only that newline goes (a task may name itself " slurmd ": that is not slurmd)."""
    data = procfs.data(f"{pid}/comm", 64)
    return (data[:-1] if data.endswith(b"\n") else data).decode("utf-8", "replace")


def _long_names(procfs: RootReader, pid: str, names: set[str]) -> set[str]:
    """Those of ``names`` that are the basename of ``pid``'s argv[0]; all of them when there is
    no argv[0] (no cmdline file in a fixture tree, an empty one for a zombie)."""
    try:
        argv0 = procfs.data(f"{pid}/cmdline", 4096, prefix=True).split(b"\0")[0]
    except _Absent:
        return names
    if not argv0:
        return names
    return names & {os.path.basename(argv0).decode("utf-8", "replace")}
