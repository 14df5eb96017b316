"""Device add/remove events from the kernel's uevent netlink socket (pyudev; no udevd needed).

Never start udevd or run ``udevadm trigger``: kernel-source monitoring needs neither.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from typing import Callable, Iterable

log = logging.getLogger(__name__)


class DeviceWatcher:
    """Calls ``on_event(subsystem, action, name)`` for add/remove events of the given subsystems."""

    def __init__(
        self, subsystems: Iterable[str], on_event: Callable[[str, str, str], None]
    ) -> None:
        self.subsystems = sorted(set(subsystems))
        self.on_event = on_event
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1  # stop() writes a byte: the reader never polls
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Open the monitor and start the reader thread; False when unavailable (logged)."""
        if not self.subsystems:
            return False
        try:
            import pyudev

            monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
            for subsystem in self.subsystems:
                monitor.filter_by(subsystem)
            monitor.start()
            self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        except Exception as exc:  # noqa: BLE001 - no netlink or libudev: degrade, don't die
            log.warning("device events unavailable: %s", exc)
            return False
        self._thread = threading.Thread(
            target=self._loop, args=(monitor,), name="udev", daemon=True
        )
        self._thread.start()
        return True

    def _loop(self, monitor: object) -> None:
        waiter = select.poll()
        waiter.register(monitor.fileno(), select.POLLIN)  # type: ignore[attr-defined]
        waiter.register(self._wake_r, select.POLLIN)
        try:
            while not self._stop.is_set():
                try:
                    waiter.poll()  # blocks until a uevent or stop()
                    device = monitor.poll(timeout=0)  # type: ignore[attr-defined]
                except Exception as exc:  # noqa: BLE001
                    log.warning("device monitor failed: %s", exc)
                    return
                if device is not None and device.action in ("add", "remove"):
                    self.on_event(device.subsystem or "", device.action, device.sys_name or "")
        finally:
            os.close(self._wake_r)

    def stop(self) -> None:
        """Stop the reader thread (woken at once)."""
        self._stop.set()
        if self._thread is None:
            return
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(2.0)
        os.close(self._wake_w)
        self._thread = None
