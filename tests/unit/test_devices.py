"""The uevent reader blocks until an event or ``stop()``: no wake-ups while idle."""

from __future__ import annotations

import pytest

from hma.detection.devices import DeviceWatcher

pytestmark = pytest.mark.timeout(30)


def test_stop_wakes_the_blocked_reader() -> None:
    watcher = DeviceWatcher(["pci"], lambda *_event: None)
    if not watcher.start():
        pytest.skip("no uevent netlink socket here")
    thread = watcher._thread
    assert thread is not None and thread.is_alive()
    watcher.stop()  # the reader waits without a timeout: only the wake-up pipe ends it
    assert not thread.is_alive()
    watcher.stop()  # a second stop is harmless


def test_no_subsystems_no_reader() -> None:
    watcher = DeviceWatcher([], lambda *_event: None)
    assert watcher.start() is False
    watcher.stop()
