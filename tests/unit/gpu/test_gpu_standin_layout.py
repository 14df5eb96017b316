"""The stand-in NVML library matches the pinned binding: struct layouts and exported symbols."""

from __future__ import annotations

import ctypes
import inspect
import re
from pathlib import Path

import pynvml
import pytest

import hma.probes.nvidia.events as events
import hma.probes.nvidia.gpu as gpu_probe

STRUCTS = {
    "nvmlPciInfo_t": pynvml.nvmlPciInfo_t,
    "nvmlFieldValue_t": pynvml.c_nvmlFieldValue_t,
    "nvmlValue_t": pynvml.c_nvmlValue_t,
    "nvmlEventData_t": pynvml.c_nvmlEventData_t,
    # the binding's c_nvmlGpuFabricInfo_t has an 80-byte clusterUuid where nvml.h has 16; the
    # probe passes its own struct to the deprecated v1 call (see hma.probes.nvidia.gpu.FabricInfoV1)
    "nvmlGpuFabricInfo_t": gpu_probe.FabricInfoV1,
    "nvmlGpuFabricInfo_v2_t": pynvml.c_nvmlGpuFabricInfo_v2_t,
    "nvmlGpuFabricInfo_v3_t": pynvml.c_nvmlGpuFabricInfo_v3_t,
}
OFFSETS = (
    [
        ("nvmlPciInfo_t", f)
        for f in ("domain", "bus", "device", "pciDeviceId", "pciSubSystemId", "busId")
    ]
    + [
        ("nvmlFieldValue_t", f)
        for f in ("scopeId", "timestamp", "latencyUsec", "valueType", "nvmlReturn", "value")
    ]
    + [
        ("nvmlEventData_t", f)
        for f in ("eventType", "eventData", "gpuInstanceId", "computeInstanceId")
    ]
    + [("nvmlGpuFabricInfo_t", f) for f in ("status", "cliqueId", "state")]
    + [("nvmlGpuFabricInfo_v2_t", f) for f in ("clusterUuid", "status", "state", "healthMask")]
    + [("nvmlGpuFabricInfo_v3_t", f) for f in ("healthMask", "healthSummary")]
)


@pytest.fixture(scope="module")
def layout(nvml_lib: Path) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    fn = ctypes.CDLL(str(nvml_lib)).hmastub_layout
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_char_p]
    return fn


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_sizes_match_the_binding(layout, name: str) -> None:
    assert layout(name.encode()) == ctypes.sizeof(STRUCTS[name])


@pytest.mark.parametrize("struct, field", OFFSETS)
def test_field_offsets_match_the_binding(layout, struct: str, field: str) -> None:
    assert layout(f"{struct}.{field}".encode()) == getattr(STRUCTS[struct], field).offset


def _symbols_called(module: object) -> set[str]:
    """NVML symbols the binding looks up for the pynvml functions a module calls."""
    called = set(re.findall(r"pynvml\.(nvml[A-Za-z0-9_]+)\b", inspect.getsource(module)))
    called = {c for c in called if callable(getattr(pynvml, c, None))}
    symbols = set()
    for name in called:
        fn = getattr(pynvml, name)
        src = inspect.getsource(fn)
        symbols |= set(re.findall(r'_nvmlGetFunctionPointer\("(nvml[A-Za-z0-9_]+)"\)', src))
        # wrappers that only forward (nvmlInit -> nvmlInitWithFlags, ..._v2 aliases)
        for inner in re.findall(r"return (nvml[A-Za-z0-9_]+)\(", src) + re.findall(
            r"^\s+(nvml[A-Za-z0-9_]+)\(", src, re.M
        ):
            symbols |= set(
                re.findall(
                    r'_nvmlGetFunctionPointer\("(nvml[A-Za-z0-9_]+)"\)',
                    inspect.getsource(getattr(pynvml, inner)),
                )
            )
    return symbols


@pytest.mark.parametrize("module", [gpu_probe, events], ids=["gpu", "nvml_events"])
def test_every_symbol_the_probe_needs_is_exported(nvml_lib: Path, module: object) -> None:
    lib = ctypes.CDLL(str(nvml_lib))
    symbols = _symbols_called(module)
    assert "nvmlDeviceGetCount_v2" in symbols or module is not gpu_probe
    missing = sorted(s for s in symbols if not hasattr(lib, s))
    assert missing == []
