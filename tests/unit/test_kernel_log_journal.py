"""The journald fallback of kernel_log, with a stand-in for systemd-python's ``journal`` module
(the outermost boundary: the real module needs a running journald)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.model import Finding
from hma.source import MemoryKV, SourceContext
from hma.sources import kernel_log
from hma.sources.kernel_log import JOURNAL_CURSOR_KEY, KernelLogSource

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
    """What kernel_log uses of ``systemd.journal``."""

    def __init__(self, entries: list[dict[str, Any]], stop: threading.Event) -> None:
        self.entries = entries
        self.stop = stop
        self.calls: list[tuple[str, Any]] = []
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

            def wait(self, timeout: float) -> int:
                outer.stop.set()  # everything was read: end the run
                return 0

            def close(self) -> None:
                outer.calls.append(("close", None))

        self.Reader = Reader


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


def test_applies_says_why_not_without_kmsg_or_journald(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernel_log, "_journal_module", lambda: None)
    options = {"path": str(tmp_path / "none"), "backend": "auto"}
    ctx = SourceContext(options, RootReader("/sys"), RootReader("/proc"), CommandRunner(), "b")
    reason: Optional[str] = KernelLogSource().applies(ctx)
    assert reason is not None and "not readable" in reason
