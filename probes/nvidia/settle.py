"""What the machine itself says to expect of its GPUs, read at collect time by both probes.

- Settling: NVML can report no GPUs (or the driver as not loaded) for a while after a boot or a
  driver upgrade, and NVSwitch fabric registration takes time. For ``settle_s`` seconds after the
  boot (``btime`` of ``<procfs>/stat``) or after the loaded module's version
  (``<sysfs>/module/nvidia/version``) changed since the previous run, those readings are
  ``unknown`` ("settling: judged from HH:MM"), never a fault.
- The slot: the PCIe link width the other end can do, ``max_link_width`` of the GPU's upstream
  port in sysfs, so an x16 GPU in an x8 slot is not judged narrow.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any, Mapping, Optional

from hma.adapters.files import ReadError, RootReader, boot_time
from hma.contracts.probe import ProbeContext
from hma.probes.nvidia.reading import Settle, Snapshot

MODULE_VERSION = "module/nvidia/version"
# A PCI function's sysfs name, as the kernel writes it (lower-case hex).
PCI_NAME = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z", re.ASCII)
DRIVER_VERSION = re.compile(r"[0-9][0-9A-Za-z.\-]{0,39}\Z", re.ASCII)


def pci_name(bus_id: str) -> Optional[str]:
    """The sysfs name of an NVML / nvidia-smi bus id (``00000000:3B:00.0`` -> ``0000:3b:00.0``)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    name = f"{parts[0][-4:]}:{parts[1]}:{parts[2]}"
    return name if PCI_NAME.match(name) else None


def slot_width(sysfs: RootReader, bus_id: Optional[str]) -> Optional[int]:
    """``max_link_width`` of the port above the GPU (its parent in the sysfs device tree);
    None when the GPU sits on a root bus (no port above it, as in most virtual machines) or
    the value cannot be read."""
    name = pci_name(bus_id) if bus_id else None
    if name is None:
        return None
    device = os.path.realpath(sysfs.path(f"bus/pci/devices/{name}"))
    parent = os.path.dirname(device)
    if not PCI_NAME.match(os.path.basename(parent)):
        return None
    rel = os.path.relpath(parent, os.path.realpath(sysfs.root))
    if rel.startswith(".."):
        return None
    try:
        width = sysfs.integer(f"{rel}/max_link_width", hex_ok=False, limit=32)
    except ReadError:
        return None
    return width or None


def module_version(sysfs: RootReader) -> Optional[str]:
    """The loaded nvidia kernel module's version; None when not loaded or not readable."""
    try:
        text = sysfs.text_or_none(MODULE_VERSION)
    except ReadError:
        return None
    return text if text is not None and DRIVER_VERSION.match(text) else None


def settle(
    now: float, booted: float, version: Optional[str], previous: Any, settle_s: float
) -> Optional[Settle]:
    """The settling window ``now`` lies in, if any: after a module version change seen against
    ``previous`` (this probe's previous snapshot; such a window is carried until it ends, and
    never lasts past ``settle_s`` from now), else after the boot at ``booted`` (0: unknown, no
    window)."""
    prev = previous if isinstance(previous, Mapping) else {}
    old = prev.get("module_version")
    if isinstance(old, str) and version is not None and old != version:
        return Settle(now, now + settle_s, f"driver upgrade ({old} -> {version})")
    carried = prev.get("settle")
    if isinstance(carried, Mapping) and str(carried.get("why", "boot")) != "boot":
        since, until = _seconds(carried.get("since")), _seconds(carried.get("until"))
        if since is not None and until is not None and now < until <= now + settle_s:
            return Settle(since, until, str(carried["why"]))
    if 0 < booted <= now < booted + settle_s:
        return Settle(booted, booted + settle_s, "boot")
    return None


def _seconds(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def observe(snap: Snapshot, ctx: ProbeContext) -> Snapshot:
    """``snap`` with the machine's own expectations: each GPU's slot width, the loaded
    module's version (the last one known) and the settling window (``settle_s``)."""
    sysfs = ctx.sysfs
    for gpu in snap.gpus:
        if gpu.pcie is not None:
            gpu.pcie = dataclasses.replace(gpu.pcie, slot_max_width=slot_width(sysfs, gpu.bus_id))
    prev = ctx.previous if isinstance(ctx.previous, Mapping) else {}
    version = module_version(sysfs)
    known = prev.get("module_version")
    snap.module_version = version or (known if isinstance(known, str) else None)
    settle_s = float(ctx.options.get("settle_s") or 0.0)
    if settle_s > 0:
        snap.settle = settle(ctx.clock(), boot_time(str(ctx.procfs.root)), version, prev, settle_s)
    return snap


def judged_from(window: Mapping[str, Any]) -> str:
    """``settling after boot: judged from HH:MM`` (local time) for a stored window."""
    until = _seconds(window.get("until"))
    when = time.strftime("%H:%M", time.localtime(until)) if until is not None else "?"
    return f"settling after {window.get('why') or 'boot'}: judged from {when}"
