"""``ctx.stop`` wakes a source blocked in poll: an idle source needs no periodic wake-up."""

from __future__ import annotations

import select

from hma.contracts.source import StopEvent


def test_stop_event_turns_readable_when_set() -> None:
    stop = StopEvent()
    poller = select.poll()
    poller.register(stop.fileno(), select.POLLIN)
    assert poller.poll(0) == [] and not stop.is_set()
    stop.set()
    assert poller.poll(0) == [(stop.fileno(), select.POLLIN)] and stop.is_set()
    stop.set()  # twice is harmless
    assert stop.wait(0)
