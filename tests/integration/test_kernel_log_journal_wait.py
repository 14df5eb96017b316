"""kernel_log's journald backend waits on a real journal's descriptor: no timer, woken by a write
(a private systemd-journald namespace, fixture in tests/conftest.py)."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest
from conftest import journald_usable

from hma.contracts.source import StopEvent
from hma.probes.kernel_log import source as kernel_log

journal = pytest.importorskip("systemd.journal")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not journald_usable(), reason="needs root, systemd-journald, journalctl"),
]


def test_an_idle_reader_blocks_until_journald_writes(journald) -> None:  # type: ignore[no-untyped-def]
    ns, sock = journald
    reader = journal.Reader(namespace=ns)
    stop = StopEvent()
    try:
        reader.seek_tail()
        while reader.get_next():  # everything so far is read: the reader is idle
            pass
        poller, stoppable = kernel_log._poller(
            SimpleNamespace(stop=stop), reader.fileno(), reader.get_events()
        )
        assert stoppable and reader.reliable_fd()
        assert kernel_log._idle_wait_ms(stoppable, False, reader.get_timeout_ms()) == -1

        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
            client.sendto(b"MESSAGE=hma wait test\nSYSLOG_IDENTIFIER=hma-test\n", sock)
        seen = []
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            ready = poller.poll(30_000)  # what the source does, bounded here against a hang
            assert [fd for fd, _ in ready] == [reader.fileno()]  # journald's write, not a timer
            reader.process()
            seen = [e for e in iter(reader.get_next, {}) if e.get("MESSAGE") == "hma wait test"]
        assert seen

        stop.set()  # a stop wakes the same poll
        assert stop.fileno() in [fd for fd, _ in poller.poll(30_000)]
    finally:
        reader.close()
