"""Simulated EFA adapters: one network namespace per adapter, joined by a bridge in a hub namespace.

Each adapter namespace ``<prefix>a<i>`` has ``eth0`` (a veth whose peer sits on bridge ``br0``
in ``<prefix>hub``) with address ``10.213.<subnet>.<i+1>/24``. Faults: ``cut_adapter`` takes an
adapter's link down (peers then hang: their packets go nowhere), ``cut_pair`` blackholes the
route between two adapters (both directions), ``hang_peer`` starts a listener that accepts and
never answers on the adapter's control ports (the mesh's own server cannot bind, and clients
that connect wait forever).

Names carry a per-run prefix (``hmamesh-<pid>-``); ``sweep`` removes namespaces of runs whose
process is gone, and ``Fabric.close`` removes this run's in ``finally``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Optional

from hma.reporters.statusfile import pid_alive

PREFIX = "hmamesh-"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip`` with a timeout."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def sweep() -> list[str]:
    """Delete namespaces left by earlier runs (prefix ``hmamesh-<pid>-`` with a dead pid)."""
    removed = []
    listing = ip("netns", "list", check=False).stdout.split()
    for name in listing:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue
        _delete(name)
        removed.append(name)
    return removed


def _delete(ns: str) -> None:
    for pid in ip("netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    ip("netns", "delete", ns, check=False)


class Fabric:
    """``n`` simulated adapters; use as a context manager (always torn down)."""

    _count = 0

    def __init__(self, n: int, subnet: int = 0) -> None:
        Fabric._count += 1
        self.n = n
        self.prefix = f"{PREFIX}{os.getpid()}-{Fabric._count}-"
        self.hub = f"{self.prefix}hub"
        self.subnet = subnet
        self.namespaces: list[str] = []
        self.listeners: list[subprocess.Popen] = []

    def ns(self, i: int) -> str:
        """Namespace of adapter ``i``."""
        return f"{self.prefix}a{i}"

    def address(self, i: int) -> str:
        """Address of adapter ``i``."""
        return f"10.213.{self.subnet}.{i + 1}"

    def adapters(self) -> dict[str, dict[str, str]]:
        """The ``[probes.efa_mesh] adapters`` table for this fabric."""
        return {
            f"a{i:02d}": {"address": self.address(i), "netns": self.ns(i)} for i in range(self.n)
        }

    def __enter__(self) -> Fabric:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        ip("netns", "add", self.hub)
        self.namespaces.append(self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "dev", "br0", "up")
        for i in range(self.n):
            ns = self.ns(i)
            ip("netns", "add", ns)
            self.namespaces.append(ns)
            ip(
                "-n",
                self.hub,
                "link",
                "add",
                f"v{i}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            ip("-n", self.hub, "link", "set", "dev", f"v{i}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "dev", "eth0", "up")
            ip("-n", ns, "link", "set", "dev", "lo", "up")

    def cut_adapter(self, i: int) -> None:
        """Take adapter ``i``'s link down."""
        ip("-n", self.ns(i), "link", "set", "dev", "eth0", "down")

    def cut_pair(self, i: int, j: int) -> None:
        """Blackhole the path between adapters ``i`` and ``j`` (both ways)."""
        ip("-n", self.ns(i), "route", "add", "blackhole", f"{self.address(j)}/32")
        ip("-n", self.ns(j), "route", "add", "blackhole", f"{self.address(i)}/32")

    def hang_peer(self, i: int, ports: range) -> subprocess.Popen:
        """A listener in adapter ``i``'s namespace that accepts on ``ports`` and never answers."""
        code = (
            "import socket, sys, time\n"
            "socks = []\n"
            "for p in range(int(sys.argv[2]), int(sys.argv[3])):\n"
            "    s = socket.socket(); s.bind((sys.argv[1], p)); s.listen(16); socks.append(s)\n"
            "print('ready', flush=True)\n"
            "time.sleep(3600)\n"
        )
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.ns(i),
                sys.executable,
                "-c",
                code,
                self.address(i),
                str(ports.start),
                str(ports.stop),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.listeners.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("hang listener did not start")
        return proc

    def pids(self, i: int) -> list[int]:
        """Processes running in adapter ``i``'s namespace."""
        out = ip("netns", "pids", self.ns(i), check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def close(self) -> None:
        """Kill our listeners and delete our namespaces."""
        for proc in self.listeners:
            proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout is not None:
                proc.stdout.close()
        for ns in reversed(self.namespaces):
            _delete(ns)
        self.namespaces = []


def usable() -> Optional[str]:
    """Why namespace tests cannot run here, or None."""
    import shutil

    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "fi_pingpong"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    return None
