"""kernel_log on the real /dev/kmsg (root): a line written from user space is matched at once, and
a restart with the stored cursor does not see it again. The line is a harmless marker raising a
site code, never an Xid (other agents on this machine read the same kernel log). The only test
that may read the real device (tests/hermetic/sitecustomize.py refuses it to every other one); it
looks at its own marker's findings only, whatever else the ring buffer holds."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import Finding
from hma.contracts.source import MemoryKV, SourceContext
from hma.probes.kernel_log.source import CURSOR_KEY, KernelLogSource

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.access("/dev/kmsg", os.R_OK | os.W_OK),
        reason="needs root and a readable, writable /dev/kmsg",
    ),
]


@pytest.fixture(autouse=True)
def _real_kmsg(monkeypatch: pytest.MonkeyPatch) -> None:
    """This file's tests may open the real /dev/kmsg (tests/hermetic/sitecustomize.py)."""
    monkeypatch.setenv("HMA_TEST_REAL_KMSG", "1")


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def start(tmp_path: Path, kv: MemoryKV) -> tuple[threading.Thread, SourceContext, list[Finding]]:
    options = {k: o.default for k, o in KernelLogSource.options.items()}
    options.update(backend="kmsg", rules_dir=str(tmp_path / "rules.d"))
    ctx = SourceContext(
        options, RootReader("/sys"), RootReader("/proc"), CommandRunner(), boot_id()
    )
    ctx.kv = kv
    found: list[Finding] = []
    thread = threading.Thread(target=KernelLogSource().run, args=(ctx, found.append), daemon=True)
    thread.start()
    return thread, ctx, found


def write_and_wait(line: str, found: list[Finding]) -> None:
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + 20
    while not any(line.split(": ")[1].strip() == f.details.get("n") for f in found):
        assert time.monotonic() < deadline, f"{line!r} not seen"
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_real_kmsg_line_is_matched_and_not_repeated_after_restart(tmp_path: Path) -> None:
    marker = f"hma-itest-{uuid.uuid4().hex[:12]}"
    (tmp_path / "rules.d").mkdir()
    (tmp_path / "rules.d" / "marker.toml").write_text(
        f'[[rules]]\nname = "marker"\nneedles = ["{marker}"]\npattern = "{marker}: (?P<n>\\\\d+)"\n'
        'code = "SITE_ITEST_MARKER"\n\n[codes.SITE_ITEST_MARKER]\nsummary = "test marker"\n'
        'remedy = "none"\nseverity = "warning"\naction = "none"\nclears = "operator"\n'
    )
    kv = MemoryKV()
    thread, ctx, found = start(tmp_path, kv)
    try:
        write_and_wait(f"<4>{marker}: 1\n", found)
    finally:
        ctx.stop.set()
        thread.join(5)
    assert not thread.is_alive()
    mine = [f for f in found if f.code == "SITE_ITEST_MARKER"]  # the buffer holds others too
    assert [f.details["n"] for f in mine] == ["1"]
    assert mine[0].details["facility"] == 1  # user space writes carry the user facility
    cursor = kv.get(CURSOR_KEY)
    assert cursor["boot_id"] == boot_id() and cursor["seq"] >= mine[0].details["seq"]
    # Restart: the ring buffer is read from its start again; marker 1 is skipped, 2 is new.
    thread, ctx, again = start(tmp_path, kv)
    try:
        write_and_wait(f"<4>{marker}: 2\n", again)
    finally:
        ctx.stop.set()
        thread.join(5)
    assert [f.details["n"] for f in again if f.code == "SITE_ITEST_MARKER"] == ["2"]
