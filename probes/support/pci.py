"""NVIDIA devices on the PCI bus under a sysfs root, read strictly and whole.

One reader for every family that needs to know whether NVIDIA GPUs are there without asking the
driver: the GPU probes (NVML's index order, "GPUs expected without a driver"), the InfiniBand
probe (the board's compute fabric from the GPUs' device id) and the kernel-log source (a GPU
node whose kernel log cannot be read).
"""

from __future__ import annotations

import re
from typing import Optional

from hma.adapters.files import ReadError, RootReader

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers
DEVICES = "bus/pci/devices"
# A PCI class attribute as the kernel writes it: class, subclass, programming interface.
PCI_CLASS = re.compile(r"0x[0-9a-f]{6}\Z", re.ASCII)


def nvidia_devices(
    sysfs: RootReader, classes: tuple[str, ...] = GPU_CLASSES
) -> Optional[list[str]]:
    """PCI addresses of NVIDIA devices whose class starts with one of ``classes`` (default: the
    GPUs), sorted; None when the bus or one of its devices cannot be read (it may be one: a
    shorter list would shift NVML's index order and could say "no GPUs" on a GPU node)."""
    found = []
    try:
        for dev in sysfs.listdir(DEVICES):
            vendor = sysfs.pci_id(f"{DEVICES}/{dev}/vendor")
            klass = sysfs.text(f"{DEVICES}/{dev}/class").lower()
            if not PCI_CLASS.match(klass):
                return None
            if vendor == NVIDIA_VENDOR and klass[:6] in classes:
                found.append(dev)
    except ReadError:
        return None
    return sorted(found)
