"""``gpu`` probe: NVIDIA GPU health through NVML (the pinned ``nvidia-ml-py`` binding).

Collects one reading record per GPU (probes/nvidia/reading.py) and evaluates it with the
rules shared with the ``nvidia_smi`` probe. Runs in a worker process (``isolation = "process"``)
because it calls into C. Inside the worker the NVML calls run in a thread with a deadline
(``nvml_deadline_s``, below the probe timeout): when a call does not return the probe still answers,
with a snapshot that names the hung call, so the hang is evidence (``GPU_NVML_TIMEOUT``, then
``GPU_DRIVER_HANG`` on consecutive runs) rather than a generic probe timeout. While that thread is
stuck, later runs in the same worker answer at once with the hang and a growing streak.
"""

from __future__ import annotations

import ctypes
import threading
import uuid
from typing import Any, Callable, ClassVar, Mapping, Optional, Union

import pynvml

from hma.adapters.files import ReadError, RootReader, running_processes
from hma.contracts.model import Finding
from hma.contracts.options import Option, positive
from hma.contracts.probe import Probe, ProbeContext
from hma.probes.nvidia import common, nvml, settle
from hma.probes.nvidia.reading import (
    CallError,
    Clocks,
    EccCounts,
    EccMode,
    Fabric,
    GpuReading,
    Hang,
    NvLink,
    Pcie,
    Remap,
    Retired,
    Snapshot,
)
from hma.probes.support import pci

NVSWITCH_FM = "nv-fabricmanager"
NVLINK_COUNTERS = (0, 1, 2, 3)  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
FIELD_NVLINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
ARGUMENT_VERSION_MISMATCH = 25
REASON_BITS = {
    "gpu_idle": 0x1,
    "hw_slowdown": 0x8,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}

# Per worker process: a reading thread stuck in the driver, and how many runs it has been stuck.
_STATE: dict[str, Any] = {"stuck": None, "streak": 0, "progress": {}}


class GpuProbe(Probe):
    """NVML readings of every GPU against the shared rules."""

    name = "gpu"
    description = "NVIDIA GPUs through NVML: count, lost GPUs, ECC, row remap, PCIe, NVLink, ..."
    default_interval = 60.0
    default_timeout = 30.0
    isolation = "process"
    previous_keys = ("pcie_baseline", "module_version", "settle")  # what collect reads of it
    subsystems = ("pci",)
    unsupported_stands = True  # no devices (or no driver) until a device event
    options: ClassVar[Mapping[str, Option]] = {
        "library": Option(
            "path", None, "libnvidia-ml file to load; unset: libnvidia-ml.so.1 from the loader."
        ),
        "nvml_deadline_s": Option(
            "float",
            10.0,
            "Seconds the NVML reads may take before the run reports a hung call.",
            check=positive,
            below="timeout",
        ),
        "fabricmanager_process": Option(
            "str", NVSWITCH_FM, "Process name of the fabric manager on NVSwitch systems."
        ),
        **common.RULE_OPTIONS,
    }

    def applies(self, ctx: ProbeContext) -> Optional[str]:
        if common.gpus_may_be_there(ctx.options, ctx.instance_type, ctx.sysfs):
            return None  # GPUs expected or present: a missing library is a finding
        if nvml.library_missing(ctx.options.get("library")):
            return f"{nvml.MISSING}, no GPUs expected or on the PCI bus"
        return None

    def collect(self, ctx: ProbeContext) -> Any:
        return common.with_baseline(settle.observe(self._read(ctx), ctx).to_json(), ctx.previous)

    def _read(self, ctx: ProbeContext) -> Snapshot:
        stuck = _STATE["stuck"]
        deadline = float(ctx.options["nvml_deadline_s"])
        if ctx.options.get("timeout"):  # answer before the runner gives up on the worker
            deadline = min(deadline, 0.8 * float(ctx.options["timeout"]))
        if stuck is not None and stuck.is_alive():
            _STATE["streak"] += 1
            return _hang_snapshot(deadline, still_stuck=True)
        _STATE["stuck"] = None
        box: dict[str, Any] = {}
        progress: dict[str, Any] = {}
        _STATE["progress"] = progress

        def work() -> None:
            try:
                box["snap"] = read_all(ctx, progress)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                box["exc"] = exc

        thread = threading.Thread(target=work, name="nvml-read", daemon=True)
        thread.start()
        thread.join(deadline)
        if thread.is_alive():
            _STATE["stuck"] = thread
            _STATE["streak"] += 1
            return _hang_snapshot(deadline, still_stuck=False)
        _STATE["streak"] = 0
        if "exc" in box:
            raise box["exc"]
        snap: Snapshot = box["snap"]
        return snap

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        elapsed = ctx.clock() - ctx.previous_ts if ctx.previous_ts else 0.0
        return common.evaluate(snapshot, ctx.options, ctx.instance_type, ctx.previous, elapsed)

    def summary(self, snapshot: Any) -> Optional[dict]:
        return common.summary(snapshot)

    def expectations(self, snapshot: Any) -> dict[str, Any]:
        return common.expectations(snapshot)


def _hang_snapshot(deadline: float, still_stuck: bool) -> Snapshot:
    progress = _STATE["progress"]
    hang = Hang(
        progress.get("call", "?"), progress.get("device"), deadline, _STATE["streak"], still_stuck
    )
    return Snapshot("nvml", hang=hang)


class _Fatal(Exception):
    """A per-device error that makes the GPU unusable (lost, unknown error, reset required)."""

    def __init__(self, call: str, err: pynvml.NVMLError) -> None:
        super().__init__(call)
        self.record = _err(call, err)


def _err(call: str, err: pynvml.NVMLError) -> CallError:
    return CallError(call, int(err.value), str(err))


class _Reader:
    """Calls NVML for one GPU, sorting each error: not applicable, fatal, or a read failure."""

    def __init__(
        self, progress: dict[str, Any], index: Optional[int], record: Union[Snapshot, GpuReading]
    ) -> None:
        self.progress = progress
        self.index = index
        self.record = record

    def __call__(self, call: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.progress["call"], self.progress["device"] = call, self.index
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if exc.value in common.NOT_APPLICABLE:
                return None
            if exc.value in common.FATAL_ERRORS:
                raise _Fatal(call, exc) from None
            self.record.call_errors[call] = str(exc)
            return None


def read_all(ctx: ProbeContext, progress: dict[str, Any]) -> Snapshot:
    """The NVML snapshot of the node."""
    snap = Snapshot("nvml", pci_gpus=pci.nvidia_devices(ctx.sysfs) or [])
    progress["call"], progress["device"] = "nvmlInit", None
    try:
        nvml.load_library(ctx.options.get("library"))
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        snap.init_error = _err("nvmlInit", exc)
        return snap
    try:
        node = _Reader(progress, None, snap)
        try:
            driver = node("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
            snap.driver = _text(driver)
            count = node("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        except _Fatal as fatal:
            snap.init_error = fatal.record
            return snap
        snap.count = count
        for index in range(count or 0):
            snap.gpus.append(read_gpu(index, progress))
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    # NVSwitch system: a GPU takes part in a fabric (Hopper+), or NVSwitch bridges are on the PCI
    # bus (HGX A100 reports no fabric state through NVML).
    snap.nvswitch = bool(pci.nvidia_devices(ctx.sysfs, ("0x0680",))) or any(
        g.fabric is not None and g.fabric.state != 0 for g in snap.gpus
    )
    if snap.nvswitch:
        snap.fabric_manager = process_running(ctx.procfs, ctx.options["fabricmanager_process"])
    return snap


def read_gpu(index: int, progress: dict[str, Any]) -> GpuReading:
    """The reading record of GPU ``index``; a fatal error leaves ``error`` and what was read."""
    gpu = GpuReading(index)
    call = _Reader(progress, index, gpu)
    try:
        handle = call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            gpu.error = CallError("nvmlDeviceGetHandleByIndex", 3, "no handle")
            return gpu
        pci = call("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle)
        if pci is not None:
            gpu.bus_id = _text(pci.busId)
        _read_readings(call, handle, gpu)
    except _Fatal as fatal:
        gpu.error = fatal.record
    return gpu


def _ecc_counts(call: _Reader, h: Any) -> EccCounts:
    """ECC counts: corrected and uncorrected, volatile then aggregate."""

    def total(etype: int, ctype: int) -> Optional[int]:
        return call(
            "nvmlDeviceGetTotalEccErrors", pynvml.nvmlDeviceGetTotalEccErrors, h, etype, ctype
        )

    return EccCounts(total(0, 0), total(1, 0), total(0, 1), total(1, 1))  # the calls' order


def _read_readings(call: _Reader, h: Any, gpu: GpuReading) -> None:
    gpu.name = _text(call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, h))
    gpu.uuid = _text(call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h))
    arch = call("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture, h)
    gpu.arch = common.ARCH_NAMES.get(arch) if arch is not None else None
    mode = call("nvmlDeviceGetEccMode", pynvml.nvmlDeviceGetEccMode, h)
    if mode is not None:
        gpu.ecc_mode = EccMode(mode[0] == 1, mode[1] == 1)
        if mode[0] == 1:
            gpu.ecc = _ecc_counts(call, h)
    arch_name = gpu.arch
    if arch_name is None or arch_name in common.PRE_AMPERE:
        pending = call(
            "nvmlDeviceGetRetiredPagesPendingStatus",
            pynvml.nvmlDeviceGetRetiredPagesPendingStatus,
            h,
        )
        if pending is not None:
            sbe = call("nvmlDeviceGetRetiredPages", pynvml.nvmlDeviceGetRetiredPages, h, 0)
            dbe = call("nvmlDeviceGetRetiredPages", pynvml.nvmlDeviceGetRetiredPages, h, 1)
            gpu.retired = Retired(
                len(sbe) if sbe is not None else None,
                len(dbe) if dbe is not None else None,
                pending == 1,
            )
    if arch_name is None or arch_name not in common.PRE_AMPERE:
        rows = call("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            gpu.remap = Remap(rows[0], rows[1], bool(rows[2]), bool(rows[3]))
    gpu.pcie = Pcie(
        call("nvmlDeviceGetCurrPcieLinkWidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        call("nvmlDeviceGetMaxPcieLinkWidth", pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        call("nvmlDeviceGetCurrPcieLinkGeneration", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        call("nvmlDeviceGetMaxPcieLinkGeneration", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
    )
    fields = _fields(call, h, (FIELD_RECOVERY_ACTION, FIELD_NVLINK_COUNT))
    gpu.recovery_action = fields.get(FIELD_RECOVERY_ACTION)
    gpu.nvlink = _nvlink(call, h, fields.get(FIELD_NVLINK_COUNT))
    reasons = call("nvmlDeviceGetCurrentClocksEventReasons", _clock_reasons, h)
    if reasons is not None:
        gpu.clocks = Clocks(**{name: bool(reasons & bit) for name, bit in REASON_BITS.items()})
    gpu.temp = call("nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature, h, 0)
    gpu.temp_slowdown = call(
        "nvmlDeviceGetTemperatureThreshold", pynvml.nvmlDeviceGetTemperatureThreshold, h, 1
    )
    gpu.fabric = call("nvmlDeviceGetGpuFabricInfoV", _fabric, h)


def _clock_reasons(h: Any) -> int:
    try:
        return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
    except pynvml.NVMLError_FunctionNotFound:  # drivers before 535 only have the old name
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def _fields(call: _Reader, h: Any, ids: tuple[int, ...]) -> dict[int, int]:
    values = call("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, h, list(ids))
    out: dict[int, int] = {}
    for value in values or []:
        if value.nvmlReturn != 0:
            continue
        kind = value.valueType
        raw = value.value
        if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
            out[int(value.fieldId)] = int(raw.uiVal)
        elif kind in (
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG,
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        ):
            out[int(value.fieldId)] = int(raw.ullVal)
        elif kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
            out[int(value.fieldId)] = int(raw.siVal)
        elif kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
            out[int(value.fieldId)] = int(raw.sllVal)
    return out


def _nvlink(call: _Reader, h: Any, count: Optional[int]) -> Optional[NvLink]:
    """Link states and summed error counters; None on GPUs without NVLink."""
    states: dict[str, bool] = {}
    errors: dict[str, int] = {}
    limit = count if count is not None else pynvml.NVML_NVLINK_MAX_LINKS
    for link in range(limit):
        try:
            call.progress["call"], call.progress["device"] = "nvmlDeviceGetNvLinkState", call.index
            state = pynvml.nvmlDeviceGetNvLinkState(h, link)
        except pynvml.NVMLError as exc:
            if exc.value in common.FATAL_ERRORS:
                raise _Fatal("nvmlDeviceGetNvLinkState", exc) from None
            if count is None:  # past the last link (INVALID_ARGUMENT) or no NVLink at all
                break
            if exc.value not in common.NOT_APPLICABLE:
                call.record.call_errors["nvmlDeviceGetNvLinkState"] = str(exc)
            continue
        states[str(link)] = state == 1
        total = 0
        for counter in NVLINK_COUNTERS:
            value = call(
                "nvmlDeviceGetNvLinkErrorCounter",
                pynvml.nvmlDeviceGetNvLinkErrorCounter,
                h,
                link,
                counter,
            )
            total += int(value or 0)
        errors[str(link)] = total
    return NvLink(states, errors) if states else None


class FabricInfoV1(ctypes.Structure):
    """``nvmlGpuFabricInfo_t`` as nvml.h declares it: the binding's own class sizes clusterUuid
    as 80 bytes (NVML_DEVICE_UUID_BUFFER_SIZE) instead of NVML_GPU_FABRIC_UUID_LEN (16), which
    would read status and state from the wrong offsets."""

    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * pynvml.NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


def _fabric(h: Any) -> Fabric:
    """Fabric state via the newest struct the driver takes (v3, v2, then the deprecated v1)."""
    info: Any
    try:
        info = pynvml.c_nvmlGpuFabricInfo_v3_t()
        try:
            pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
        except pynvml.NVMLError as exc:
            if exc.value != ARGUMENT_VERSION_MISMATCH:
                raise
            info = pynvml.c_nvmlGpuFabricInfo_v2_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    except pynvml.NVMLError_FunctionNotFound:
        info = FabricInfoV1()
        pynvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
    return Fabric(
        state=int(info.state),
        status=int(info.status),
        summary=int(info.healthSummary) if hasattr(info, "healthSummary") else None,
        health_mask=int(getattr(info, "healthMask", 0)) if hasattr(info, "healthMask") else None,
        cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))),
        clique_id=int(info.cliqueId),
    )


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def process_running(procfs: RootReader, name: str) -> Optional[bool]:
    """Whether a process ``name`` runs (comm, or argv[0] past comm's 15 characters:
    ``running_processes``); None if procfs cannot be read."""
    try:
        return name in running_processes(procfs, [name])
    except ReadError:
        return None
