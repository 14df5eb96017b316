"""sd_notify over the AF_UNIX datagram socket named by ``NOTIFY_SOCKET`` (no libsystemd)."""

from __future__ import annotations

import os
import socket
from typing import Mapping, Optional


class Notifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING/RELOADING messages; silent when not under systemd."""

    def __init__(self, environ: Optional[Mapping[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + path[1:] if path.startswith("@") else path
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        wanted = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        self.watchdog_s: Optional[float] = int(usec) / 1e6 if wanted else None

    def send(self, **fields: str) -> bool:
        """Send ``KEY=value`` lines; False when there is no socket or sending failed."""
        if not self.address:
            return False
        message = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message, self.address)
        except OSError:
            return False
        return True
