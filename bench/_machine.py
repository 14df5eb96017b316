"""Describe the machine a benchmark ran on (printed with every figure)."""

from __future__ import annotations

import os
import platform
import sys


def describe() -> str:
    """nproc, CPU model, Python version, load average."""
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"machine: nproc={os.cpu_count()} cpu={model!r} python={sys.version.split()[0]} "
        f"kernel={platform.release()} loadavg=[{load}]"
    )
