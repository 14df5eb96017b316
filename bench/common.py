"""Shared helpers for the benchmarks: machine description and robust statistics."""

from __future__ import annotations

import errno
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Sequence


def machine() -> str:
    """One line describing where the figures were measured."""
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.node()}: {os.cpu_count()} cores ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()} ({sys.executable}), "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def median_ms(samples: Sequence[float]) -> float:
    """Median of samples given in seconds, in milliseconds."""
    return statistics.median(samples) * 1000


def p99_ms(samples: Sequence[float]) -> float:
    """99th percentile (nearest rank) in milliseconds."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(0.99 * len(ordered) + 0.5)) - 1)] * 1000


def time_command(argv: Sequence[str], runs: int, env: dict[str, str] | None = None) -> list[float]:
    """Wall times of running ``argv`` ``runs`` times (killed after 120 s).

    The wait blocks in waitpid: ``subprocess.run(timeout=)`` polls with sleeps growing to 50 ms,
    which rounds every figure up to its next step (31.5, 63.5, 113.5 ms ...)."""
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        guard = threading.Timer(120, proc.kill)
        guard.start()
        try:
            proc.wait()
        finally:
            guard.cancel()
        out.append(time.perf_counter() - start)
    return out


def open_writer(fifo: str, deadline: float) -> int:
    """Open a FIFO for writing once its reader (the daemon) holds it open."""
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            return fd
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM a daemon we started and wait for it (SIGKILL after 20 s)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
