"""``nvml_events`` event source: NVML Xid critical-error events, raised as findings at once.

Registers every GPU for ``nvmlEventTypeXidCriticalError`` and blocks in ``nvmlEventSetWait``
(``wait_ms`` at a time: NVML has no way to interrupt the wait, so a stop request is seen within
that; a reload waits up to 5 s for it, a shutdown does not wait). An event ends the wait at once,
whatever ``wait_ms``: a longer wait only costs stop latency, and saves the wake-ups of an idle
node. Each event becomes the finding that
``hma.probes.nvidia.xid.xid_finding`` builds from (Xid, PCI bus id): the kernel-log source builds
the very same
(component, code) from the NVRM line, so one Xid seen both ways is one fault in the health model.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Callable, ClassVar, Mapping, Optional

import pynvml

from hma.contracts.model import Finding
from hma.contracts.options import Option
from hma.contracts.source import EventSource, SourceContext
from hma.probes.nvidia import nvml
from hma.probes.nvidia.xid import Dedup, xid_finding

XID_EVENT = pynvml.nvmlEventTypeXidCriticalError
SOURCE = "nvml"


class NvmlEventSource(EventSource):
    """Blocks on NVML Xid events and emits one finding per (deduplicated) event."""

    name = "nvml_events"
    description = "NVML Xid critical-error events (nvmlEventSetWait)"
    options: ClassVar[Mapping[str, Option]] = {
        "library": Option(
            "path", None, "libnvidia-ml file to load; unset: libnvidia-ml.so.1 from the loader."
        ),
        "wait_ms": Option(
            "int",
            5000,
            "Milliseconds per nvmlEventSetWait call (bounds stop latency; events end it at once).",
            minimum=1,
        ),
        "dedup_window_s": Option(
            "float", 10.0, "Repeats of one Xid on one GPU within this are counted, not re-sent."
        ),
    }

    def applies(self, ctx: SourceContext) -> Optional[str]:
        if nvml.library_missing(ctx.options.get("library")):
            return nvml.MISSING
        return None

    def run(self, ctx: SourceContext, emit: Callable[[Finding], None]) -> None:
        nvml.load_library(ctx.options.get("library"))
        pynvml.nvmlInit()
        event_set = None
        try:
            event_set = pynvml.nvmlEventSetCreate()
            buses = register_all(event_set)
            if buses:
                ctx.started("nvml", f"{len(buses)} GPU(s) registered for Xid events")
            else:
                ctx.started("nvml", "no GPU supports Xid events (none registered)", True)
            dedup = Dedup(float(ctx.options["dedup_window_s"]))
            wait_ms = int(ctx.options["wait_ms"])
            while not ctx.stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait(event_set, wait_ms)
                except pynvml.NVMLError_Timeout:
                    continue
                finding = event_finding(data, buses, time.time())
                if finding is not None:
                    admitted = dedup.admit(finding, time.monotonic())
                    if admitted is not None:
                        emit(admitted)
        finally:
            if event_set is not None:
                try:
                    pynvml.nvmlEventSetFree(event_set)
                except pynvml.NVMLError:
                    pass
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _bus_id(handle: Any) -> str:
    bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
    return bus.decode() if isinstance(bus, bytes) else str(bus)


def register_all(event_set: Any) -> dict[int, str]:
    """Register every GPU that supports Xid events; returns handle address -> PCI bus id."""
    buses: dict[int, str] = {}
    for index in range(pynvml.nvmlDeviceGetCount()):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            if not supported & XID_EVENT:
                continue
            pynvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, event_set)
            buses[_address(handle)] = _bus_id(handle)
        except pynvml.NVMLError:
            continue  # a lost GPU: the gpu probe reports it; watch the others
    return buses


def event_finding(data: Any, buses: Mapping[int, str], ts: float) -> Optional[Finding]:
    """The Xid finding for one ``c_nvmlEventData_t`` (None for other event types)."""
    if not data.eventType & XID_EVENT:
        return None
    bus = buses.get(_address(data.device))
    if bus is None:
        try:
            bus = _bus_id(data.device)
        except pynvml.NVMLError:
            bus = "unknown"
    evidence = {
        "event_type": int(data.eventType),
        "gpu_instance_id": int(data.gpuInstanceId),
        "compute_instance_id": int(data.computeInstanceId),
        "bus_id": bus,
    }
    return xid_finding(int(data.eventData), bus, evidence, source=SOURCE, ts=ts)
