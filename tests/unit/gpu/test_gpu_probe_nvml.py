"""gpu probe over the real nvidia-ml-py binding and the stand-in libnvidia-ml.so.1.

Most scenarios collect in this process (the binding loads the stand-in once); the hang scenarios
run the probe in its real worker process (hma.detection.runner.ProcessSlot), which is killed
afterwards.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from nvmlstub import (
    ARCH_ADA,
    ARCH_VOLTA,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_NOT_SUPPORTED,
    ERROR_UNKNOWN,
)

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import RunStatus, Severity
from hma.contracts.probe import ProbeContext
from hma.detection.runner import ProcessSlot, run_probe
from hma.probes.nvidia.gpu import GpuProbe
from tests.unit.trn_support import gen_sysfs


def ctx(lib: Path, tmp_path: Path, **opts: Any) -> ProbeContext:
    options = {k: o.default for k, o in GpuProbe.options.items()}
    options.update({"library": str(lib), "expected_gpus": 8})
    options.update(opts)
    return ProbeContext(
        options=options,
        sysfs=RootReader(str(tmp_path / "sys")),
        procfs=RootReader("/proc"),
        runner=CommandRunner(),
    )


def check(lib: Path, tmp_path: Path, **opts: Any) -> tuple[dict, list]:
    probe = GpuProbe()
    c = ctx(lib, tmp_path, **opts)
    assert probe.applies(c) is None
    snap = probe.collect(c)
    return snap, probe.evaluate(snap, c)


BUS_IDS = [f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]


def codes(findings: list) -> list[tuple[str, str]]:
    return sorted((f.code, f.component) for f in findings)


def test_healthy_h100_node(scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int) -> None:
    snap, findings = check(nvml_lib, tmp_path)
    assert findings == []
    assert snap["count"] == 8 and snap["driver"] == "590.48.01"
    gpu = snap["gpus"][3]
    assert gpu["bus_id"] == "00000000:5D:00.0" and gpu["arch"] == "hopper"
    assert len(gpu["nvlink"]["states"]) == 18 and gpu["fabric"]["state"] == 3
    assert snap["nvswitch"] is True and snap["fabric_manager"] is True


def test_fabric_manager_not_running(scenario, nvml_lib: Path, tmp_path: Path) -> None:
    _snap, findings = check(nvml_lib, tmp_path, fabricmanager_process="no-such-process")
    assert codes(findings) == [("GPU_FABRIC_MANAGER_DOWN", "node")]


@pytest.mark.parametrize(
    "readings, code",
    [
        ({"ecc.1.0": 4}, "GPU_ECC_UNCORRECTED"),
        ({"ecc.0.1": 10**7}, "GPU_ECC_AGGREGATE_HIGH"),
        ({"ecc_mode": "0 0"}, "GPU_ECC_DISABLED"),
        ({"remap": "0 2 1 0"}, "GPU_ROW_REMAP_PENDING"),
        ({"remap": "0 9 0 1"}, "GPU_ROW_REMAP_FAILURE"),
        ({"pcie": "8 16 5 5"}, "GPU_PCIE_WIDTH_NARROW"),
        ({"nvlink_state.7": 0}, "GPU_NVLINK_DOWN"),
        ({"clocks_event_reasons": "0x40"}, "GPU_CLOCKS_SLOWDOWN"),
        ({"temp": 88}, "GPU_TEMP_HIGH"),
        ({"fabric": "2 0 0 0"}, "GPU_FABRIC_NOT_READY"),
        ({"fabric": f"3 0 {0x1AA} 2"}, "GPU_FABRIC_UNHEALTHY"),
        ({"fabric": f"3 0 {0x1AA} 3"}, "GPU_FABRIC_DEGRADED"),
        ({"field.230": 4}, "GPU_RECOVERY_ACTION"),
    ],
)
def test_fault_scenarios(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int, readings: dict, code: str
) -> None:
    scenario.dev(5, **readings)
    gen_sysfs.pci_gpus(tmp_path / "sys", BUS_IDS)  # each GPU in an x16 slot
    _snap, findings = check(nvml_lib, tmp_path)
    assert codes(findings) == [(code, "gpu:0000:ab:00")]


def test_retired_pages_on_a_volta(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    scenario.drop(1, "remap")
    scenario.dev(
        1,
        arch=ARCH_VOLTA,
        name="Tesla V100-SXM2-32GB",
        retired_pending=1,
        **{"retired.0": 50, "retired.1": 20},
    )
    snap, findings = check(nvml_lib, tmp_path)
    assert snap["gpus"][1]["retired"] == {"sbe": 50, "dbe": 20, "pending": True}
    assert codes(findings) == [
        ("GPU_RETIRED_PAGES_LIMIT", "gpu:0000:2a:00"),
        ("GPU_RETIRED_PAGES_PENDING", "gpu:0000:2a:00"),
    ]


def test_row_remap_not_trusted_on_consumer_ada(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    scenario.dev(0, arch=ARCH_ADA, name="NVIDIA GeForce RTX 4090", remap="0 0 1 1")
    _snap, findings = check(nvml_lib, tmp_path)
    assert findings == []


def test_lost_gpu(scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int) -> None:
    scenario.set("err.nvmlDeviceGetRemappedRows.6", ERROR_GPU_IS_LOST)
    snap, findings = check(nvml_lib, tmp_path)
    assert codes(findings) == [("GPU_LOST", "gpu:0000:ba:00")]
    assert snap["gpus"][6]["error"]["call"] == "nvmlDeviceGetRemappedRows"


def test_handle_fails_with_unknown_error(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    scenario.set("err.nvmlDeviceGetHandleByIndex_v2.2", ERROR_UNKNOWN)
    _snap, findings = check(nvml_lib, tmp_path)
    # no bus id from NVML and no sysfs here: the node carries it
    assert codes(findings) == [("GPU_UNKNOWN_ERROR", "node")]


def test_fewer_gpus_than_expected(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    scenario.count = 7
    scenario.write()
    _snap, findings = check(nvml_lib, tmp_path)
    assert codes(findings) == [("GPU_COUNT_MISMATCH", "node")]


def test_driver_not_loaded(scenario, nvml_lib: Path, tmp_path: Path) -> None:
    scenario.set("err.nvmlInitWithFlags", 9)
    _snap, findings = check(nvml_lib, tmp_path)
    assert codes(findings) == [("GPU_DRIVER_NOT_LOADED", "node")]


@pytest.mark.parametrize("error", [ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND])
def test_not_supported_and_missing_functions_are_ignored(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int, error: int
) -> None:
    for sym in (
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        scenario.set(f"err.{sym}", error)
    scenario.dev(0, **{"ecc.1.0": 5}, remap="0 1 1 1")  # would be faults if they were read
    snap, findings = check(nvml_lib, tmp_path)
    assert findings == []
    assert snap["gpus"][0].get("remap") is None and snap["gpus"][0]["nvlink"] is None


def test_other_errors_are_unknown(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    scenario.set("err.nvmlDeviceGetTemperature.4", 4)  # NO_PERMISSION
    _snap, findings = check(nvml_lib, tmp_path)
    assert [(f.code, f.severity, f.component) for f in findings] == [
        ("GPU_READ_FAILED", Severity.UNKNOWN, "gpu:0000:9a:00")
    ]


def test_nvlink_error_rate_between_runs(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    probe = GpuProbe()
    c = ctx(nvml_lib, tmp_path)
    first = probe.collect(c)
    scenario.dev(2, **{"nvlink_err.3.0": 300, "nvlink_err.3.2": 200})
    c.previous, c.previous_ts = first, time.time() - 60.0
    findings = probe.evaluate(probe.collect(c), c)
    assert codes(findings) == [("GPU_NVLINK_ERRORS", "gpu:0000:3a:00")]


def test_pcie_drop_from_baseline_through_the_worker(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    """The worker gets the previous snapshot, so the baseline (x16 when first seen) is carried:
    a later x8 of that GPU is a drop (critical); a run that measured nothing keeps it."""
    slot = ProcessSlot(GpuProbe())
    try:
        c = ctx(nvml_lib, tmp_path)
        first = run_probe(slot, c, 20.0, time.time())
        assert first.findings == () and first.snapshot is not None
        assert set(first.snapshot["pcie_baseline"].values()) == {16}
        scenario.dev(5, pcie="8 16 5 5")
        c.previous = first.snapshot
        second = run_probe(slot, c, 20.0, time.time())
    finally:
        slot.close()
    (f,) = second.findings
    assert (f.code, f.component) == ("GPU_PCIE_WIDTH_DEGRADED", "gpu:0000:ab:00")
    assert f.details["expected"] == 16 and "baseline" in f.details["expected_from"]
    assert second.snapshot is not None
    assert second.snapshot["pcie_baseline"] == first.snapshot["pcie_baseline"]


def test_library_option_missing_file_without_expected_gpus(tmp_path: Path, nvml_lib: Path) -> None:
    # the binding is already loaded in this process; a fresh worker process shows applies()
    slot = ProcessSlot(GpuProbe())
    try:
        c = ctx(tmp_path / "nope.so", tmp_path, expected_gpus=None)
        run = run_probe(slot, c, 20.0, time.time())
    finally:
        slot.close()
    assert run.status is RunStatus.UNSUPPORTED, run.error


@pytest.mark.timeout(60)
def test_hung_call_reports_then_escalates(scenario, nvml_lib: Path, tmp_path: Path) -> None:
    """A call that never returns: the worker answers at the NVML deadline with the hung call
    (unknown), the next run sees the same thread still stuck -> GPU_DRIVER_HANG."""
    scenario.set("hang.nvmlDeviceGetRemappedRows.3", 1)
    slot = ProcessSlot(GpuProbe())
    try:
        c = ctx(nvml_lib, tmp_path, nvml_deadline_s=1.0)
        first = run_probe(slot, c, 20.0, time.time())
        second = run_probe(slot, c, 20.0, time.time())
    finally:
        slot.close()
    assert first.status is RunStatus.RAN and second.status is RunStatus.RAN
    (f1,) = first.findings
    assert (f1.code, f1.severity) == ("GPU_NVML_TIMEOUT", Severity.UNKNOWN)
    assert f1.details["call"] == "nvmlDeviceGetRemappedRows" and f1.details["device"] == 3
    (f2,) = second.findings
    assert f2.code == "GPU_DRIVER_HANG" and f2.details["streak"] == 2


@pytest.mark.timeout(60)
def test_hma_check_end_to_end(scenario, nvml_lib: Path, hma_env, fabricmanager: int) -> None:
    """`hma check gpu nvidia_smi --json` with both stand-ins: one fault seen by both readers."""
    from nvmlstub import NVIDIA_SMI, SMI_FIXTURES

    scenario.dev(0, remap="0 1 1 0")
    hma_env.write(
        f'[probes.gpu]\nlibrary = "{nvml_lib}"\nexpected_gpus = 8\n'
        f'[probes.nvidia_smi]\ncommand = ["{NVIDIA_SMI}", "-q", "-x"]\nexpected_gpus = 1\n'
    )
    env = hma_env.env()
    env["HMA_SMI_DOCUMENT"] = str(SMI_FIXTURES / "h100-v13.xml")
    env["HMA_NVML_SCENARIO"] = str(scenario.path)
    proc = hma_env.hma("check", "gpu", "nvidia_smi", "--json", env=env)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2, proc.stderr
    by_name = {p["name"]: p for p in doc["probes"]}
    assert by_name["nvidia_smi"]["findings"] == []
    assert [(f["code"], f["component"], f["action"]) for f in by_name["gpu"]["findings"]] == [
        ("GPU_ROW_REMAP_PENDING", "gpu:0000:18:00", "reboot")
    ]


def _pci(root: Path, addr: str, klass: str) -> None:
    dev = root / "bus/pci/devices" / addr
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text(klass + "\n")


def test_nvswitch_bridges_and_lost_gpu_address_from_sysfs(
    scenario, nvml_lib: Path, tmp_path: Path
) -> None:
    """HGX A100: no fabric state through NVML, but NVSwitch bridges on the bus need the fabric
    manager; a GPU whose handle fails is named by its sysfs address (NVML's PCI order)."""
    root = tmp_path / "sys"
    for i in range(8):
        _pci(root, f"0000:{0x10 + i:02x}:00.0", "0x030200")
    for i in range(6):
        _pci(root, f"0000:{0xc0 + i:02x}:00.0", "0x068000")
    for i in range(8):
        scenario.drop(i, "fabric")
    scenario.set("err.nvmlDeviceGetHandleByIndex_v2.4", ERROR_GPU_IS_LOST)
    snap, findings = check(nvml_lib, tmp_path, fabricmanager_process="no-such-process")
    assert snap["nvswitch"] is True
    assert codes(findings) == [
        ("GPU_FABRIC_MANAGER_DOWN", "node"),
        ("GPU_LOST", "gpu:0000:14:00"),
    ]
