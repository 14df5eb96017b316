"""Shared helpers for the benchmarks: machine description, robust statistics, and the CPU and
memory of a process tree (psutil)."""

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

import psutil


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


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    try:
        root = psutil.Process(pid)
        return [pid] + [child.pid for child in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu(pid: int) -> float:
    """CPU seconds of the tree: each live process's own time and that of children it reaped."""
    return sum(split_cpu(pid).values())


def split_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the tree: the root process (``agent``), its live descendants (``workers``),
    and the children they reaped (``reaped``)."""
    out = {"agent": 0.0, "workers": 0.0, "reaped": 0.0}
    for proc in tree(pid):
        try:
            times = psutil.Process(proc).cpu_times()
        except psutil.NoSuchProcess:
            continue
        out["agent" if proc == pid else "workers"] += times.user + times.system
        out["reaped"] += times.children_user + times.children_system
    return out


def pss_kib(pid: int) -> int:
    """Proportional set size of one process (KiB)."""
    return int(psutil.Process(pid).memory_full_info().pss) // 1024
