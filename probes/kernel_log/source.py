"""``kernel_log`` event source: kernel messages through the rules of probes/kernel_log/rules, as
they arrive.

Reads /dev/kmsg in a poll that blocks on the device and the stop's descriptor (no idle wake-ups):
a line is matched the moment the kernel prints it. Each record carries a sequence number; the last
one handled is kept in the state store with the boot id, so after a restart in the same boot the
ring buffer is read again but records up to the stored one are skipped (nothing missed, nothing
repeated), and after a reboot everything in the buffer is new. Where /dev/kmsg cannot be read,
journald (systemd-python's ``journal.Reader``, optional) serves the kernel messages instead, with
its own cursor, blocking the same way on the journal's inotify descriptor. The path is
configurable: tests feed a FIFO of kmsg records. On a path that is no character device (a FIFO,
a file) a line in the form /dev/kmsg takes (``<N>text``, what ``hma inject xid --kmsg PATH``
writes) becomes the record the kernel would make of it, numbered after the last one handled.

Only kernel records are trusted: every /dev/kmsg record (only root may write the device, as
``hma inject`` does), and journald entries with ``_TRANSPORT=kernel`` (journald sets that field
itself; syslog and native entries, which any user can send, are never read).

Bad input is survived: lines longer than ``max_line`` are cut, bytes that are not UTF-8 replaced,
records that do not parse counted and skipped, and EPIPE (the kernel overwrote records before we
read them) is counted and reading goes on.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from typing import Any, Callable, ClassVar, Mapping, Optional

from hma.adapters.files import ReadError, RootReader
from hma.contracts.catalogue import Entry
from hma.contracts.model import Finding, Severity, named_component
from hma.contracts.options import Option, positive
from hma.contracts.source import EventSource, SourceContext
from hma.probes.kernel_log.dedup import Dedup
from hma.probes.kernel_log.lines import Record, from_identifier, parse_record, written_record
from hma.probes.kernel_log.rules import RuleSet, load_site
from hma.probes.support import mounts, pci

CURSOR_KEY = "kernel_log.cursor"
JOURNAL_CURSOR_KEY = "kernel_log.journal_cursor"
POLL_S = 1.0  # idle wake-ups when ctx.stop has no fileno
CURSOR_EVERY_S = 5.0  # a line that raised a finding saves the cursor at once
READ_SIZE = 65536
NO_KERNEL_RECORDS = (
    "the journal holds no kernel record of this boot (journald reads no kernel log here)"
)
NEURON_DEVICES = "devices/virtual/neuron_device"  # as the neuron probe reads them


class KernelLogSource(EventSource):
    """Kernel messages (/dev/kmsg, else journald) through the kernel-log rules."""

    name = "kernel_log"
    description = (
        "Kernel messages through the kernel-log rules (Xid, SXid, AER, NIC, disk, fs, lockups)"
    )
    options: ClassVar[Mapping[str, Option]] = {
        "path": Option("path", "/dev/kmsg", "Kernel message device (tests: a FIFO of records)."),
        "backend": Option(
            "choice",
            "auto",
            "auto: /dev/kmsg, journald when it cannot be read; or force kmsg or journal.",
            choices=("auto", "kmsg", "journal"),
        ),
        "rules_dir": Option(
            "path", "/etc/hma/rules.d", "Site rule files (*.toml) with their SITE_ codes."
        ),
        "dedupe_s": Option(
            "float",
            10.0,
            "Repeats of one fault within this many seconds are one event with a count.",
            check=positive,
        ),
        "max_line": Option(
            "int", 16384, "Bytes of one kernel record kept (longer: cut).", minimum=256
        ),
    }

    def __init__(self) -> None:
        self.stats: dict[str, int] = {
            "records": 0,
            "skipped": 0,
            "malformed": 0,
            "overruns": 0,
            "truncated": 0,
            "findings": 0,
        }
        self.backend_used = ""

    @classmethod
    def declared_codes(cls, options: Mapping[str, Any]) -> list[Entry]:
        """The SITE_ codes of the site rule files."""
        _rules, entries = load_site(options.get("rules_dir"))
        return entries

    def applies(self, ctx: SourceContext) -> Optional[str]:
        """Runs where the backend chosen can be read: /dev/kmsg (``kmsg``), journald through
        systemd-python (``journal``), either (``auto``); else why not, in the backend's words."""
        backend = ctx.options.get("backend", "auto")
        path = str(ctx.options.get("path", "/dev/kmsg"))
        kmsg = _unreadable(path) if backend != "journal" else ""
        if backend != "journal" and not kmsg:
            return None
        journal = _journal_missing() if backend != "kmsg" else ""
        if backend == "kmsg":
            return f"backend = kmsg, but {path} cannot be read: {kmsg}"
        if not journal:
            return None
        if backend == "journal":
            return f"backend = journal, but {journal}"
        return f"{path} cannot be read ({kmsg}) and {journal}"

    def blind_finding(self, ctx: SourceContext, reason: str) -> Optional[Finding]:
        """On a node with accelerators (NVIDIA GPUs, Neuron devices in sysfs), a kernel log
        that cannot be read hides their kernel-reported faults (Xid, SXid, Neuron errors):
        ``HMA_KERNEL_LOG_BLIND``; None elsewhere."""
        devices = accelerators(ctx.sysfs)
        if not devices:
            return None
        return Finding(
            "HMA_KERNEL_LOG_BLIND",
            f"source:{self.name}",
            f"kernel records cannot be read on a node with {', '.join(devices)}: {reason}",
            {"reason": reason, "devices": devices},
        )

    def run(self, ctx: SourceContext, emit: Callable[[Finding], None]) -> None:
        """Read until ``ctx.stop`` is set."""
        rules = RuleSet.load(ctx.options.get("rules_dir"))
        rules.prepare()  # now, not on the first matching line (the path to the drain)
        backend = ctx.options.get("backend", "auto")
        path = str(ctx.options.get("path", "/dev/kmsg"))
        if backend == "journal":
            self._run_journal(ctx, emit, rules, "backend = journal")
            return
        try:
            fd = _open(path)
        except OSError as exc:
            if backend == "kmsg" or _journal_module() is None:
                raise
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENODEV):
                raise
            self._run_journal(ctx, emit, rules, f"{path} cannot be read: {exc.strerror}")
            return
        ctx.started("kmsg")
        try:
            self._run_kmsg(fd, ctx, emit, rules)
        finally:
            os.close(fd)

    # --- /dev/kmsg ------------------------------------------------------------------------------

    def _run_kmsg(
        self, fd: int, ctx: SourceContext, emit: Callable[[Finding], None], rules: RuleSet
    ) -> None:
        self.backend_used = "kmsg"
        max_line = int(ctx.options.get("max_line", 16384))
        dedup = Dedup(float(ctx.options.get("dedupe_s", 10.0)), rules.tell_apart())
        matcher = rules.matcher(self.name)
        stored = ctx.kv.get(CURSOR_KEY) or {}
        last_seq = -1
        if isinstance(stored, dict) and stored.get("boot_id") == ctx.boot_id:
            last_seq = int(stored.get("seq", -1))
        cursor = _Cursor(ctx, CURSOR_KEY, "seq", last_seq)
        poller, stoppable = _poller(ctx, fd, select.POLLIN)
        buf = b""
        cut: Optional[bytes] = None  # head of an over-long line whose end is still to come
        kernel = stat.S_ISCHR(os.fstat(fd).st_mode)  # else a FIFO or file: no kernel numbers

        def handle(raw: bytes) -> None:
            if raw.startswith(b" ") or not raw:  # continuation (KEY=value dictionary) lines
                return
            record = _record(raw, kernel, cursor.value)
            if record is None:
                self.stats["malformed"] += 1
                return
            if record.seq <= cursor.value:
                self.stats["skipped"] += 1
                return
            self.stats["records"] += 1
            evidence = {"seq": record.seq, "kernel_ts_us": record.ts_usec}
            if record.facility != 0:
                evidence["facility"] = record.facility
            finding = matcher.feed(record.message, time.time(), evidence, record.ts_usec / 1e6)
            if finding is not None:
                admitted = _admit(dedup, on_mount(finding, ctx))
                if admitted is not None:
                    self.stats["findings"] += 1
                    emit(admitted)
                    cursor.value = record.seq
                    cursor.save()  # after emitting: a crash in between repeats, never misses
                    return
            cursor.value = record.seq

        try:
            while not ctx.stop.is_set():
                cursor.save_when_due()
                ready = poller.poll(_idle_wait_ms(stoppable, cursor.pending))
                if not any(ready_fd == fd for ready_fd, _ in ready):
                    continue
                try:
                    chunk = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    continue
                except InterruptedError:
                    continue
                except BrokenPipeError:  # EPIPE: records overwritten before we read them
                    self.stats["overruns"] += 1
                    continue
                if not chunk:  # end of a regular file, or a FIFO without writers
                    ctx.stop.wait(POLL_S)
                    continue
                buf += chunk
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    line, buf = buf[:nl], buf[nl + 1 :]
                    if cut is not None:
                        line, cut = cut, None
                    elif len(line) > max_line:
                        line = line[:max_line]
                        self.stats["truncated"] += 1
                    handle(line)
                if len(buf) > max_line:  # no newline in sight: keep the head, drop the rest
                    if cut is None:
                        cut = buf[:max_line]
                        self.stats["truncated"] += 1
                    buf = b""
        finally:
            cursor.save()

    # --- journald -------------------------------------------------------------------------------

    def _run_journal(
        self, ctx: SourceContext, emit: Callable[[Finding], None], rules: RuleSet, why: str
    ) -> None:
        """Read journald's kernel records (``why``: why journald, for ``ctx.started``); until
        the first one arrives, a journal without any of this boot is told blind."""
        journal = _journal_module()
        if journal is None:
            raise RuntimeError(f"journald support: {_journal_missing()}")
        self.backend_used = "journal"
        dedup = Dedup(float(ctx.options.get("dedupe_s", 10.0)), rules.tell_apart())
        matcher = rules.matcher(self.name)
        reader = journal.Reader()
        cursor = _Cursor(ctx, JOURNAL_CURSOR_KEY, "cursor", None)
        try:
            reader.this_boot()
            reader.add_match(_TRANSPORT="kernel")  # not syslog: any user can write that
            stored = ctx.kv.get(JOURNAL_CURSOR_KEY) or {}
            seen = isinstance(stored, dict) and stored.get("boot_id") == ctx.boot_id
            if seen:  # kernel records of this boot were read before
                reader.seek_cursor(stored["cursor"])
                reader.get_next()  # the stored entry itself was handled
                ctx.started("journal", why)
            else:
                reader.seek_head()
            poller, stoppable = _poller(ctx, reader.fileno(), reader.get_events())
            told_blind = False
            while not ctx.stop.is_set():
                entry = reader.get_next()
                if not entry:
                    if not seen and not told_blind:
                        ctx.started("journal", f"{why}; {NO_KERNEL_RECORDS}", True)
                        told_blind = True
                    cursor.save_when_due()
                    # block on the journal's inotify descriptor (and the stop), not a timer
                    poller.poll(_idle_wait_ms(stoppable, cursor.pending, reader.get_timeout_ms()))
                    reader.process()  # consume the wake-up: the descriptor turns quiet again
                    continue
                cursor.value = entry.get("__CURSOR", cursor.value)
                if entry.get("_TRANSPORT") != "kernel":  # the match does this; never trust less
                    self.stats["skipped"] += 1
                    continue
                self.stats["records"] += 1
                if not seen:
                    seen = True
                    ctx.started("journal", why)
                message = entry.get("MESSAGE", "")
                if isinstance(message, bytes):
                    message = message.decode("utf-8", "replace")
                text = from_identifier(str(entry.get("SYSLOG_IDENTIFIER", "kernel")), str(message))
                finding = matcher.feed(
                    text, time.time(), {"journal_cursor": cursor.value}, _monotonic_s(entry)
                )
                if finding is None:
                    continue
                admitted = _admit(dedup, on_mount(finding, ctx))
                if admitted is not None:
                    self.stats["findings"] += 1
                    emit(admitted)
                    cursor.save()  # after emitting: a crash in between repeats, never misses
        finally:
            cursor.save()
            reader.close()


def on_mount(finding: Finding, ctx: SourceContext) -> Finding:
    """A finding on a block device the kernel named (``dev:<name>``: the file-system rules) is
    on the mount of its file system, ``fs:<mount>``, where the mount table under the source's
    roots knows it (hma.probes.support.mounts); else it stays ``dev:<name>``. Both names are
    kept within the component grammar (``named_component``)."""
    kind, _, name = finding.component.partition(":")
    if kind != "dev":
        return finding
    point = mounts.mount_of_device(ctx.sysfs, ctx.procfs, name)
    if point is None:
        return finding.with_(component=named_component("dev", name))
    details = {**finding.details, "device": name, "mount": point}
    return finding.with_(component=named_component("fs", point), details=details)


def _record(raw: bytes, kernel: bool, last_seq: int) -> Optional[Record]:
    """The record of one line read (None: not one). Off a kernel device (a FIFO, a file), a
    line in the form /dev/kmsg takes (``hma inject xid --kmsg PATH`` written straight to the
    path) is the record the kernel would make of it, numbered after the last one handled."""
    record = parse_record(raw)
    if record is None and not kernel and raw.startswith(b"<"):
        return written_record(raw, last_seq + 1, int(time.monotonic() * 1e6))
    return record


def _admit(dedup: Dedup, finding: Finding) -> Optional[Finding]:
    """The finding to emit (repeats within the window held back); a clearing one (severity
    ``ok``) always goes through and reopens the window of what it clears."""
    if finding.severity is Severity.OK:
        dedup.forget(finding.component, finding.code)
        return finding
    return dedup.admit(finding, time.monotonic())


def _monotonic_s(entry: Mapping[str, Any]) -> Optional[float]:
    """The kernel's own time of a journal entry, in seconds (for storm rules), if it has one."""
    stamp = entry.get("_SOURCE_MONOTONIC_TIMESTAMP") or entry.get("__MONOTONIC_TIMESTAMP")
    seconds = getattr(stamp, "total_seconds", None)  # journal.Reader gives timedelta objects
    if seconds is not None:
        return float(seconds())
    monotonic = getattr(stamp, "timestamp", None)  # (timedelta, boot id) for __MONOTONIC
    return float(monotonic.total_seconds()) if monotonic is not None else None


class _Cursor:
    """The last record handled, kept in the state store (``key``: the boot id and ``field``)
    when it moved: at once after a finding, else at most every CURSOR_EVERY_S."""

    def __init__(self, ctx: SourceContext, key: str, field: str, value: Any) -> None:
        self._ctx, self._key, self._field = ctx, key, field
        self.value = self._saved = value
        self._saved_at = time.monotonic()

    @property
    def pending(self) -> bool:
        """Whether the cursor moved since it was last saved."""
        return bool(self.value != self._saved)

    def save(self) -> None:
        """Store the cursor if it moved."""
        if self.pending:
            self._ctx.kv.set(self._key, {"boot_id": self._ctx.boot_id, self._field: self.value})
            self._saved = self.value
        self._saved_at = time.monotonic()

    def save_when_due(self) -> None:
        """``save`` once CURSOR_EVERY_S have passed since the last one."""
        if time.monotonic() - self._saved_at >= CURSOR_EVERY_S:
            self.save()


def _poller(ctx: SourceContext, fd: int, events: int) -> tuple[select.poll, bool]:
    """A poll object on ``fd`` and, where ``ctx.stop`` has one (the daemon's StopEvent), the
    stop's descriptor; and whether it has (else the caller must wake to look at the stop)."""
    poller = select.poll()
    poller.register(fd, events)
    stop_fd = getattr(ctx.stop, "fileno", None)
    if stop_fd is not None:
        poller.register(stop_fd(), select.POLLIN)
    return poller, stop_fd is not None


def _idle_wait_ms(stoppable: bool, cursor_pending: bool, limit_ms: int = -1) -> int:
    """poll() timeout of an idle reader: block (-1) until input or the stop, except to look at
    a stop without a descriptor (every POLL_S), to save a pending cursor (after CURSOR_EVERY_S),
    or within ``limit_ms`` (a journal that cannot be watched reliably says when to look again)."""
    waits = [limit_ms] if limit_ms >= 0 else []
    if not stoppable:
        waits.append(int(POLL_S * 1000))
    if cursor_pending:
        waits.append(int(CURSOR_EVERY_S * 1000))
    return min(waits, default=-1)


def _open(path: str) -> int:
    """A non-blocking descriptor on the kmsg device, a FIFO (opened read-write, so that it never
    reports end-of-file between writers) or a regular file."""
    st = os.stat(path)
    flags = os.O_RDWR if stat.S_ISFIFO(st.st_mode) else os.O_RDONLY
    return os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)


def _journal_module() -> Any:
    """systemd-python's ``journal`` module; None when it cannot be imported
    (``_journal_missing`` says why)."""
    try:
        from systemd import journal
    except ImportError:
        return None
    return journal


def _journal_missing() -> str:
    """Why journald cannot be read ("" when it can): the import's own error, so that a
    systemd-python that is installed but does not load is not called missing."""
    if _journal_module() is not None:
        return ""
    try:
        from systemd import journal  # noqa: F401
    except ImportError as exc:
        if getattr(exc, "name", None) not in ("systemd", "systemd.journal"):
            return f"journald support (systemd-python) cannot be loaded: {exc}"
    return "journald support (systemd-python) is not installed"


def _unreadable(path: str) -> str:
    """Why ``path`` cannot be opened for reading ("" when it can)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return ""


def accelerators(sysfs: RootReader) -> list[str]:
    """The accelerators sysfs shows whose faults the kernel log reports: ``N NVIDIA GPU(s)``
    (hma.probes.support.pci), ``N Neuron device(s)``; [] for none or when sysfs cannot be
    read."""
    out = []
    gpus = len(pci.nvidia_devices(sysfs) or ())
    if gpus:
        out.append(f"{gpus} NVIDIA GPU(s)")
    try:
        neurons = len(sysfs.listdir(NEURON_DEVICES))
    except ReadError:
        neurons = 0
    if neurons:
        out.append(f"{neurons} Neuron device(s)")
    return out
