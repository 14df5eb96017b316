"""Build and script the stand-in ``libnvidia-ml.so.1`` (tests/standin/nvml/libnvidia-ml.c).

``build(folder)`` compiles the C file with ``cc -shared -fPIC`` into ``folder`` (a temporary build
folder: the library is never committed). ``Scenario`` writes the scenario file the library reads
at every ``nvmlInit`` (format documented at the top of the C file) from Python values.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

SOURCE = Path(__file__).resolve().parent / "nvml" / "libnvidia-ml.c"
NVIDIA_SMI = Path(__file__).resolve().parent / "nvidia-smi"  # the stand-in command
SMI_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
LIBNAME = "libnvidia-ml.so.1"
ENV = "HMA_NVML_SCENARIO"

# NVML constants used by scenarios (values from pynvml).
ARCH_VOLTA, ARCH_AMPERE, ARCH_ADA, ARCH_HOPPER = 5, 7, 8, 9
ERROR_NOT_SUPPORTED, ERROR_TIMEOUT, ERROR_FUNCTION_NOT_FOUND = 3, 10, 13
ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED, ERROR_UNKNOWN = 15, 16, 999
XID_EVENT = 0x8


def compiler() -> Optional[str]:
    """Path of ``cc`` (or ``gcc``), None when absent."""
    return shutil.which("cc") or shutil.which("gcc")


def build(folder: Path) -> Path:
    """Compile the stand-in into ``folder``; returns the library path."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / LIBNAME
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Werror",
            f"-Wl,-soname,{LIBNAME}",
            "-o",
            str(out),
            str(SOURCE),
        ],
        check=True,
        timeout=120,
    )
    return out


def h100_device(index: int) -> dict[str, Any]:
    """Readings of one healthy H100 SXM (HGX board, NVSwitch fabric), as NVML reports them."""
    bus = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB][index % 8]
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-6f0c3e1a-1b2c-4d5e-8f90-{index:012x}",
        "bus_id": f"00000000:{bus:02X}:00.0",
        "pci_device_id": "0x233010DE",
        "arch": ARCH_HOPPER,
        "ecc_mode": "1 1",
        "ecc.0.0": 0,
        "ecc.1.0": 0,
        "ecc.0.1": 0,
        "ecc.1.1": 0,
        "remap": "0 0 0 0",
        "pcie": "16 16 5 5",
        "nvlinks": 18,
        "clocks_event_reasons": "0x1",
        "temp": 33,
        "temp_threshold.0": 92,
        "temp_threshold.1": 87,
        "fabric": f"3 0 {0x1AA} 1",
        "field.230": 0,
        "field.91": 18,
    }


class Scenario:
    """A scenario file: ``devices`` maps index -> readings; ``extra`` holds err./hang. keys."""

    def __init__(self, path: Path, ngpus: int = 8, driver: str = "590.48.01") -> None:
        self.path = path
        self.driver = driver
        self.devices: dict[int, dict[str, Any]] = {i: h100_device(i) for i in range(ngpus)}
        self.count: Optional[int] = None  # None: len(devices)
        self.extra: dict[str, Any] = {}
        self.events: Path = path.with_suffix(".events")
        self.events.touch()
        self.write()

    def set(self, key: str, value: Any) -> Scenario:
        """Set a top-level key (``err.SYM``, ``hang.SYM.I`` ...) and rewrite the file."""
        self.extra[key] = value
        return self.write()

    def dev(self, index: int, **readings: Any) -> Scenario:
        """Change readings of one device (keys with dots: pass a dict via ``**{...}``)."""
        self.devices[index].update(readings)
        return self.write()

    def drop(self, index: int, *keys: str) -> Scenario:
        """Remove readings of one device (the call then answers NOT_SUPPORTED)."""
        for key in keys:
            self.devices[index].pop(key, None)
        return self.write()

    def write(self) -> Scenario:
        """Write the file (atomically, since a worker may be reading it)."""
        lines = [f"driver = {self.driver}", f"events = {self.events}"]
        lines.append(f"devices = {len(self.devices) if self.count is None else self.count}")
        for idx, readings in sorted(self.devices.items()):
            lines += [f"dev.{idx}.{k} = {v}" for k, v in readings.items()]
        lines += [f"{k} = {v}" for k, v in self.extra.items()]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.path)
        return self

    def hold(self, index: int, *pids: int) -> Scenario:
        """Processes hold GPU ``index`` (none: it is idle): the stand-in nvidia-smi refuses its
        reset while any does."""
        if pids:
            self.devices[index]["processes"] = " ".join(str(p) for p in pids)
            return self.write()
        return self.drop(index, "processes")

    def reset_fails(self, index: int, fails: bool = True) -> Scenario:
        """The stand-in nvidia-smi's reset of GPU ``index`` fails (or succeeds again)."""
        if fails:
            return self.dev(index, reset="fail")
        return self.drop(index, "reset")

    def push_xid(self, index: int, xid: int) -> None:
        """Append one Xid critical-error event for device ``index`` to the event queue."""
        with self.events.open("a") as f:
            f.write(f"{index} {xid} {XID_EVENT}\n")
