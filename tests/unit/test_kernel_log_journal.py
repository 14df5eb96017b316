"""The journald fallback of kernel_log, with a stand-in for systemd-python's ``journal`` module
(the outermost boundary: the real module needs a running journald)."""

from __future__ import annotations

import contextlib
import os
import select
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import Finding
from hma.contracts.source import MemoryKV, SourceContext
from hma.probes.kernel_log import source as kernel_log
from hma.probes.kernel_log.source import (
    CURSOR_EVERY_S,
    JOURNAL_CURSOR_KEY,
    POLL_S,
    KernelLogSource,
    _idle_wait_ms,
)

KERNEL = {"_TRANSPORT": "kernel"}
ENTRIES = [
    {**KERNEL, "__CURSOR": "c1", "SYSLOG_IDENTIFIER": "kernel", "MESSAGE": "eth0: link up"},
    {
        **KERNEL,
        "__CURSOR": "c2",
        "SYSLOG_IDENTIFIER": "kernel",
        "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, DBE",
    },
    # `logger -t NVRM ...` by any user: syslog transport, never a kernel message.
    {
        "_TRANSPORT": "syslog",
        "__CURSOR": "c3",
        "SYSLOG_IDENTIFIER": "NVRM",
        "MESSAGE": "Xid (PCI:0000:01:00): 79, pid=1",
    },
    # A line written to /dev/kmsg by root (hma inject): journald files it under identifier NVRM
    # and strips the identifier from MESSAGE.
    {
        **KERNEL,
        "__CURSOR": "c4",
        "SYSLOG_IDENTIFIER": "NVRM",
        "MESSAGE": b"Xid (PCI:0000:5d:00): 79, x\xff",
    },
]


class FakeJournal:
    """What kernel_log uses of ``systemd.journal``. Its descriptor is a pipe: ``append`` adds an
    entry and makes it readable, as journald's inotify descriptor turns readable on a write. With
    ``stop_when_read`` the run ends once everything was read, else it blocks until the stop."""

    def __init__(
        self, entries: list[dict[str, Any]], stop: threading.Event, stop_when_read: bool = True
    ) -> None:
        self.entries = entries
        self.stop = stop
        self.stop_when_read = stop_when_read
        self.calls: list[tuple[str, Any]] = []
        self.idle = threading.Event()  # set each time the reader is about to wait
        self._read, self._write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        outer = self

        class Reader:
            def __init__(self) -> None:
                self.pos = 0

            def this_boot(self) -> None:
                outer.calls.append(("this_boot", None))

            def add_match(self, **kw: str) -> None:
                outer.calls.append(("add_match", kw))

            def add_disjunction(self) -> None:
                outer.calls.append(("add_disjunction", None))

            def seek_head(self) -> None:
                self.pos = 0

            def seek_cursor(self, cursor: str) -> None:
                outer.calls.append(("seek_cursor", cursor))
                self.pos = [e["__CURSOR"] for e in outer.entries].index(cursor)

            def get_next(self) -> dict[str, Any]:
                if self.pos >= len(outer.entries):
                    return {}
                self.pos += 1
                return outer.entries[self.pos - 1]

            def fileno(self) -> int:
                return outer._read

            def get_events(self) -> int:
                return select.POLLIN

            def get_timeout_ms(self) -> int:
                if outer.stop_when_read:
                    outer.stop.set()  # everything was read: end the run
                outer.idle.set()
                return -1  # a reliable descriptor: no timeout needed

            def process(self) -> int:
                outer.calls.append(("process", None))
                with contextlib.suppress(BlockingIOError):
                    os.read(outer._read, 4096)
                return 0

            def close(self) -> None:
                outer.calls.append(("close", None))
                os.close(outer._read)
                os.close(outer._write)

        self.Reader = Reader

    def append(self, entry: dict[str, Any]) -> None:
        """journald wrote ``entry``."""
        self.idle.clear()
        self.entries.append(entry)
        os.write(self._write, b"x")


def run(tmp_path: Path, kv: MemoryKV, entries: list[dict[str, Any]]) -> tuple[list[Finding], Any]:
    options = {k: o.default for k, o in KernelLogSource.options.items()}
    options.update(path=str(tmp_path / "no-kmsg"), rules_dir=str(tmp_path / "none"))
    ctx = SourceContext(options, RootReader("/sys"), RootReader("/proc"), CommandRunner(), "b1", kv)
    fake = FakeJournal(entries, ctx.stop)
    found: list[Finding] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel_log, "_journal_module", lambda: fake)
        source = KernelLogSource()
        assert source.applies(ctx) is None
        source.run(ctx, found.append)
    assert source.backend_used == "journal"
    return found, fake


@pytest.mark.timeout(20)
def test_journal_fallback_matches_kernel_transport_entries_only(tmp_path: Path) -> None:
    kv = MemoryKV()
    found, fake = run(tmp_path, kv, ENTRIES)
    assert [(f.code, f.component) for f in found] == [
        ("GPU_XID_48", "gpu:0000:3b:00"),
        ("GPU_XID_79", "gpu:0000:5d:00"),
    ]
    assert [c for c in fake.calls if c[0] in ("add_match", "add_disjunction")] == [
        ("add_match", {"_TRANSPORT": "kernel"})
    ]
    assert kv.get(JOURNAL_CURSOR_KEY) == {"boot_id": "b1", "cursor": "c4"}


@pytest.mark.timeout(20)
def test_journal_cursor_resumes_after_the_stored_entry(tmp_path: Path) -> None:
    kv = MemoryKV()
    kv.set(JOURNAL_CURSOR_KEY, {"boot_id": "b1", "cursor": "c2"})
    found, fake = run(tmp_path, kv, ENTRIES)
    assert ("seek_cursor", "c2") in fake.calls
    assert [f.code for f in found] == ["GPU_XID_79"]  # c2 was handled before the restart


@pytest.mark.timeout(20)
def test_journal_cursor_is_saved_at_stop_without_a_finding(tmp_path: Path) -> None:
    kv = MemoryKV()
    found, _fake = run(tmp_path, kv, ENTRIES[:1])  # "eth0: link up": no finding
    assert found == []
    assert kv.get(JOURNAL_CURSOR_KEY) == {"boot_id": "b1", "cursor": "c1"}  # not read again


@pytest.mark.timeout(20)
def test_journal_reader_blocks_until_journald_writes(tmp_path: Path) -> None:
    """Idle, the source waits on the journal's descriptor; a new entry wakes it at once."""
    options = {k: o.default for k, o in KernelLogSource.options.items()}
    options.update(backend="journal", rules_dir=str(tmp_path / "none"))
    ctx = SourceContext(options, RootReader("/sys"), RootReader("/proc"), CommandRunner(), "b1")
    fake = FakeJournal(ENTRIES[:1], ctx.stop, stop_when_read=False)
    found: list[Finding] = []
    arrived = threading.Event()

    def emit(finding: Finding) -> None:
        found.append(finding)
        arrived.set()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel_log, "_journal_module", lambda: fake)
        runner = threading.Thread(target=KernelLogSource().run, args=(ctx, emit))
        runner.start()
        try:
            assert fake.idle.wait(10)  # read the history, now waiting
            fake.append(ENTRIES[1])
            assert arrived.wait(10)
            assert fake.idle.wait(10)
        finally:
            ctx.stop.set()
            runner.join(10)
    assert not runner.is_alive()
    assert [f.code for f in found] == ["GPU_XID_48"]
    assert ("process", None) in fake.calls  # the wake-up was consumed, so the next wait blocks
    assert ctx.kv.get(JOURNAL_CURSOR_KEY) == {"boot_id": "b1", "cursor": "c2"}


def test_idle_wait_blocks_unless_something_is_due() -> None:
    assert _idle_wait_ms(stoppable=True, cursor_pending=False) == -1
    assert _idle_wait_ms(True, True) == CURSOR_EVERY_S * 1000
    assert _idle_wait_ms(False, False) == POLL_S * 1000  # a stop without a descriptor
    assert _idle_wait_ms(True, False, limit_ms=250) == 250  # the journal asks to look again
    assert _idle_wait_ms(True, True, limit_ms=60_000) == CURSOR_EVERY_S * 1000


def test_applies_says_why_not_without_kmsg_or_journald(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernel_log, "_journal_module", lambda: None)
    options = {"path": str(tmp_path / "none"), "backend": "auto"}
    ctx = SourceContext(options, RootReader("/sys"), RootReader("/proc"), CommandRunner(), "b")
    reason: Optional[str] = KernelLogSource().applies(ctx)
    assert reason is not None and "cannot be read" in reason
