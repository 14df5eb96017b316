"""Table tests of the shared GPU rules (probes/nvidia/common.py) on normalized snapshots."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Action, Severity
from hma.probes.nvidia import common as rules

OPTS = {k: o.default for k, o in rules.RULE_OPTIONS.items()}


def h100(index: int = 0) -> dict[str, Any]:
    """A healthy H100 record as both readers produce it."""
    return {
        "index": index,
        "bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "name": "NVIDIA H100 80GB HBM3",
        "arch": "hopper",
        "ecc_mode": {"current": True, "pending": True},
        "ecc": {
            "volatile_uncorrected": 0,
            "volatile_corrected": 0,
            "aggregate_uncorrected": 0,
            "aggregate_corrected": 0,
        },
        "remap": {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False},
        "pcie": {"width": 16, "max_width": 16, "gen": 5, "max_gen": 5},
        "nvlink": {"states": {str(i): True for i in range(18)}, "errors": {"0": 0, "1": 0}},
        "clocks": {
            "gpu_idle": True,
            "hw_slowdown": False,
            "hw_thermal_slowdown": False,
            "hw_power_brake_slowdown": False,
        },
        "temp": 33,
        "temp_slowdown": 87,
        "fabric": {"state": 3, "status": 0, "summary": 1, "health_mask": 0x1AA},
        "recovery_action": 0,
    }


def snap(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "reader": "nvml",
        "driver": "590.48.01",
        "count": 8,
        "gpus": [h100(i) for i in range(8)],
        "nvswitch": True,
        "fabric_manager": True,
    }
    base.update(changes)
    return base


SLOT16 = {"slot_max_width": 16}  # the GPU sits in an x16 port


def with_gpu(index: int, **changes: Any) -> dict[str, Any]:
    s = snap()
    s["gpus"][index].update(changes)
    return s


def codes(findings: list) -> list[str]:
    return sorted(f.code for f in findings)


def test_healthy_node_has_no_findings() -> None:
    assert rules.evaluate(snap(), {**OPTS, "expected_gpus": 8}) == []


@pytest.mark.parametrize(
    "s, code",
    [
        (with_gpu(2, ecc={"volatile_uncorrected": 1}), "GPU_ECC_UNCORRECTED"),
        (with_gpu(2, ecc={"aggregate_uncorrected": 3}), "GPU_ECC_AGGREGATE_HIGH"),
        (with_gpu(2, ecc={"aggregate_corrected": 10**6}), "GPU_ECC_AGGREGATE_HIGH"),
        (with_gpu(2, ecc_mode={"current": False, "pending": False}), "GPU_ECC_DISABLED"),
        (with_gpu(2, remap={"pending": True, "failure": False}), "GPU_ROW_REMAP_PENDING"),
        (with_gpu(2, remap={"pending": False, "failure": True}), "GPU_ROW_REMAP_FAILURE"),
        (
            with_gpu(2, pcie={"width": 8, "max_width": 16, "gen": 5, "max_gen": 5, **SLOT16}),
            "GPU_PCIE_WIDTH_NARROW",
        ),
        (with_gpu(2, nvlink={"states": {"0": True, "1": False}}), "GPU_NVLINK_DOWN"),
        (with_gpu(2, clocks={"hw_slowdown": True}), "GPU_CLOCKS_SLOWDOWN"),
        (with_gpu(2, clocks={"hw_power_brake_slowdown": True}), "GPU_CLOCKS_SLOWDOWN"),
        (with_gpu(2, temp=87), "GPU_TEMP_HIGH"),
        (with_gpu(2, fabric={"state": 2, "status": 0}), "GPU_FABRIC_NOT_READY"),
        (with_gpu(2, fabric={"state": 1, "status": 0}), "GPU_FABRIC_NOT_READY"),
        (with_gpu(2, fabric={"state": 3, "status": 999}), "GPU_FABRIC_UNHEALTHY"),
        (with_gpu(2, fabric={"state": 3, "status": 0, "summary": 2}), "GPU_FABRIC_UNHEALTHY"),
        (
            with_gpu(2, fabric={"state": 3, "status": 0, "summary": None, "health_mask": 0x2AA}),
            "GPU_FABRIC_UNHEALTHY",
        ),
        (with_gpu(2, fabric={"state": 3, "status": 0, "summary": 3}), "GPU_FABRIC_DEGRADED"),
        (with_gpu(2, recovery_action=2), "GPU_RECOVERY_ACTION"),
        (with_gpu(2, error={"call": "x", "code": 15, "text": "GPU is lost"}), "GPU_LOST"),
        (
            with_gpu(2, error={"call": "x", "code": 999, "text": "Unknown Error"}),
            "GPU_UNKNOWN_ERROR",
        ),
        (with_gpu(2, error={"call": "x", "code": 16, "text": "reset"}), "GPU_RESET_REQUIRED"),
        (with_gpu(2, error={"call": "x", "code": 14, "text": "inforom"}), "GPU_INFOROM_CORRUPTED"),
        (snap(count=7), "GPU_COUNT_MISMATCH"),
        (snap(fabric_manager=False), "GPU_FABRIC_MANAGER_DOWN"),
        (
            snap(init_error={"call": "nvmlInit", "code": 9, "text": "Driver Not Loaded"}),
            "GPU_DRIVER_NOT_LOADED",
        ),
        (
            snap(init_error={"call": "nvmlInit", "code": 18, "text": "mismatch"}),
            "GPU_DRIVER_NOT_LOADED",
        ),
    ],
)
def test_each_fault_gives_its_finding(s: dict[str, Any], code: str) -> None:
    found = rules.evaluate(s, {**OPTS, "expected_gpus": 8})
    assert codes(found) == [code]
    assert found[0].component in ("node", "gpu:0000:1a:00")


def test_gpu_findings_are_keyed_by_pci_address() -> None:
    (finding,) = rules.evaluate(with_gpu(2, remap={"pending": True}), OPTS)
    assert finding.component == "gpu:0000:1a:00"
    assert finding.details["bus_id"] == "00000000:1A:00.0"


def test_lost_gpu_without_bus_id_takes_the_sysfs_address() -> None:
    s = snap(pci_gpus=[f"0000:{0x40 + i:02x}:00.0" for i in range(8)])
    s["gpus"][3] = {"index": 3, "error": {"call": "h", "code": 15, "text": "GPU is lost"}}
    (finding,) = rules.evaluate(s, OPTS)
    assert (finding.code, finding.component) == ("GPU_LOST", "gpu:0000:43:00")


def test_read_errors_are_unknown_not_faults() -> None:
    s = with_gpu(1, call_errors={"nvmlDeviceGetTemperature": "Insufficient Permissions"})
    (finding,) = rules.evaluate(s, OPTS)
    assert (finding.code, finding.severity) == ("GPU_READ_FAILED", Severity.UNKNOWN)


def test_not_supported_readings_are_no_findings() -> None:
    s = snap()
    for gpu in s["gpus"]:
        for key in ("ecc_mode", "ecc", "remap", "pcie", "nvlink", "clocks", "fabric", "temp"):
            gpu[key] = None
        gpu["recovery_action"] = None
    assert rules.evaluate(s, OPTS) == []


def test_row_remap_gated_by_architecture() -> None:
    """RTX 4090 (Ada) answers GetRemappedRows without NOT_SUPPORTED; pre-Ampere has none."""
    for arch, name in (("ada", "NVIDIA GeForce RTX 4090"), ("volta", "Tesla V100")):
        s = with_gpu(0, arch=arch, name=name, remap={"pending": True, "failure": True})
        assert rules.evaluate(s, OPTS) == []
    s = with_gpu(0, arch="ampere", name="NVIDIA GeForce RTX 3090", remap={"pending": True})
    assert rules.evaluate(s, OPTS) == []
    s = with_gpu(0, arch="ampere", name="NVIDIA A10G", remap={"pending": True})
    assert codes(rules.evaluate(s, OPTS)) == ["GPU_ROW_REMAP_PENDING"]


def test_retired_pages_only_before_ampere() -> None:
    v100 = {"arch": "volta", "name": "Tesla V100-SXM2-16GB", "remap": None}
    s = with_gpu(0, retired={"sbe": 1, "dbe": 0, "pending": True}, **v100)
    assert codes(rules.evaluate(s, OPTS)) == ["GPU_RETIRED_PAGES_PENDING"]
    s = with_gpu(0, retired={"sbe": 40, "dbe": 21, "pending": False}, **v100)
    assert codes(rules.evaluate(s, OPTS)) == ["GPU_RETIRED_PAGES_LIMIT"]
    s = with_gpu(0, retired={"sbe": 40, "dbe": 21, "pending": True})  # hopper: ignored
    assert rules.evaluate(s, OPTS) == []


def test_pcie_width_ignored_while_idle_link_saves_power() -> None:
    """The real A10G capture: idle, gen 1 of 4, x8 of x16. Not a fault."""
    idle = with_gpu(0, pcie={"width": 8, "max_width": 16, "gen": 1, "max_gen": 4, **SLOT16})
    assert rules.evaluate(idle, OPTS) == []
    busy = copy.deepcopy(idle)
    busy["gpus"][0]["clocks"]["gpu_idle"] = False
    assert codes(rules.evaluate(busy, OPTS)) == ["GPU_PCIE_WIDTH_NARROW"]
    assert rules.evaluate(busy, {**OPTS, "expected_pcie_width": 8}) == []


def test_narrow_link_is_judged_against_both_ends_of_the_link() -> None:
    """A T4/A10G in a cloud x8 slot (x8 of x16 at full generation, busy): nothing when the slot
    is unknown (a VM's root bus) or x8; a warning only when the slot can do x16."""
    s = with_gpu(0, pcie={"width": 8, "max_width": 16, "gen": 3, "max_gen": 3})
    s["gpus"][0]["clocks"]["gpu_idle"] = False
    assert rules.evaluate(s, OPTS) == []
    s["gpus"][0]["pcie"]["slot_max_width"] = 8
    assert rules.evaluate(s, OPTS) == []
    s["gpus"][0]["pcie"]["slot_max_width"] = 16
    (found,) = rules.evaluate(s, OPTS)
    f = load_builtin().resolve(found)
    assert (f.code, f.severity, f.action, f.details["expected"]) == (
        "GPU_PCIE_WIDTH_NARROW",
        Severity.WARNING,
        Action.NONE,
        16,
    )
    s = rules.with_baseline(s, None)  # first seen at x8: the baseline is x8, still a warning
    assert codes(rules.evaluate(s, OPTS, previous=s)) == ["GPU_PCIE_WIDTH_NARROW"]
    (f,) = rules.evaluate(s, {**OPTS, "expected_pcie_width": 16})
    assert (f.code, f.details["expected_from"]) == (
        "GPU_PCIE_WIDTH_DEGRADED",
        "expected_pcie_width",
    )


def test_pcie_baseline_is_carried_and_a_drop_is_critical() -> None:
    first = rules.with_baseline(snap(), None)
    key = rules.pcie_key(first["gpus"][3])
    assert key is not None and first["pcie_baseline"][key] == 16
    hung = rules.with_baseline({"reader": "nvml", "hang": {"call": "x"}, "gpus": []}, first)
    assert hung["pcie_baseline"] == first["pcie_baseline"]  # nothing measured: kept
    dropped = with_gpu(3, pcie={"width": 8, "max_width": 16, "gen": 5, "max_gen": 5})
    (f,) = rules.evaluate(rules.with_baseline(dropped, hung), OPTS, previous=hung)
    assert (f.code, f.details["expected"], f.details["width"]) == ("GPU_PCIE_WIDTH_DEGRADED", 16, 8)
    assert rules.with_baseline(dropped, hung)["pcie_baseline"][key] == 16  # never lowered
    replaced = copy.deepcopy(dropped)
    replaced["gpus"][3]["uuid"] = "GPU-new"  # another GPU in that slot: its own baseline
    assert codes(rules.evaluate(replaced, OPTS, previous=hung)) == []  # slot unknown


def test_nvlink_error_rate_needs_a_previous_run() -> None:
    prev = snap()
    now = with_gpu(4, nvlink={"states": {"0": True, "1": True}, "errors": {"0": 500, "1": 0}})
    assert rules.evaluate(now, OPTS) == []  # no previous: no rate
    found = rules.evaluate(now, OPTS, previous=prev, elapsed_s=60.0)
    assert codes(found) == ["GPU_NVLINK_ERRORS"]
    assert found[0].details["rate_per_minute"] == 500.0
    assert rules.evaluate(now, OPTS, previous=prev, elapsed_s=3600.0) == []  # 8.3/min


def test_expected_count_from_instance_table() -> None:
    s = snap(count=7)
    assert codes(rules.evaluate(s, OPTS, instance_type="p5.48xlarge")) == ["GPU_COUNT_MISMATCH"]
    assert codes(rules.evaluate(s, OPTS, instance_type="ml.p4d.24xlarge")) == ["GPU_COUNT_MISMATCH"]
    assert rules.evaluate(s, OPTS, instance_type="m5.large") == []  # unknown type: no check
    assert rules.evaluate(snap(count=1), OPTS, instance_type="g5.xlarge") == []


def test_driver_version_expectation() -> None:
    assert rules.evaluate(snap(), {**OPTS, "expected_driver": "590.48.01"}) == []
    found = rules.evaluate(snap(), {**OPTS, "expected_driver": "570.86.15"})
    assert codes(found) == ["GPU_DRIVER_VERSION"]


def test_hang_is_unknown_once_then_driver_hang_on_consecutive_runs() -> None:
    hung = {
        "reader": "nvml",
        "gpus": [],
        "hang": {"call": "nvmlDeviceGetRemappedRows", "device": 3, "after_s": 5.0, "streak": 1},
    }
    (first,) = rules.evaluate(hung, OPTS)
    assert (first.code, first.severity) == ("GPU_NVML_TIMEOUT", Severity.UNKNOWN)
    assert "nvmlDeviceGetRemappedRows on GPU 3" in first.message
    (second,) = rules.evaluate(hung, OPTS, previous=hung)  # previous run hung too
    assert second.code == "GPU_DRIVER_HANG" and second.details["streak"] == 2
    (third,) = rules.evaluate(hung, {**OPTS, "hang_runs": 3}, previous=hung)
    assert third.code == "GPU_NVML_TIMEOUT"
    worker_streak = copy.deepcopy(hung)
    worker_streak["hang"]["streak"] = 3  # the worker counted it while its thread stayed stuck
    assert rules.evaluate(worker_streak, {**OPTS, "hang_runs": 3})[0].code == "GPU_DRIVER_HANG"
    assert rules.evaluate(hung, OPTS, previous=snap())[0].code == "GPU_NVML_TIMEOUT"


def test_read_errors_are_one_finding_per_component() -> None:
    s = with_gpu(1, call_errors={"nvmlDeviceGetTemperature": "Timeout", "nvmlDeviceGetName": "x"})
    s["call_errors"] = {"nvmlSystemGetDriverVersion": "Insufficient Permissions"}
    found = rules.evaluate(s, OPTS)
    assert sorted((f.code, f.component, f.severity) for f in found) == [
        ("GPU_READ_FAILED", "gpu:0000:19:00", Severity.UNKNOWN),
        ("GPU_READ_FAILED", "node", Severity.UNKNOWN),
    ]
    gpu = next(f for f in found if f.component != "node")
    assert len(gpu.details["call_errors"]) == 2 and "(and 1 more)" in gpu.message


def test_recovery_action_imex_does_not_drain() -> None:
    (f,) = rules.evaluate(with_gpu(0, recovery_action=5), OPTS)
    assert (f.code, f.severity, f.action) == ("GPU_RECOVERY_ACTION", Severity.WARNING, Action.NONE)
    assert "recover IMEX domain" in f.message
    (f,) = rules.evaluate(with_gpu(0, recovery_action=1), OPTS)
    assert (f.severity, f.action) == (None, None)  # catalogue: critical, reboot


def test_model_expectation_warns_on_another_product() -> None:
    """``expected_model`` (what `hma genconf` records): a GPU of another model is a warning."""
    opts = {**OPTS, "expected_model": "NVIDIA H100 80GB HBM3"}
    assert rules.evaluate(snap(), opts) == []
    found = rules.evaluate(with_gpu(2, name="NVIDIA H100 PCIe"), opts)
    assert codes(found) == ["GPU_MODEL_MISMATCH"] and found[0].component == "gpu:0000:1a:00"
    entry = load_builtin().entry("GPU_MODEL_MISMATCH")
    assert (entry.severity, entry.action) == (Severity.WARNING, Action.NONE)


def test_expectations_record_only_what_every_gpu_agrees_on() -> None:
    assert rules.expectations(snap()) == {
        "expected_gpus": 8,
        "expected_model": "NVIDIA H100 80GB HBM3",
        "expected_pcie_width": 16,
        "expected_pcie_gen": 5,
    }
    mixed = with_gpu(1, name="NVIDIA H100 PCIe", pcie={"width": 8, "max_width": 16, "gen": 5})
    assert rules.expectations(mixed) == {"expected_gpus": 8, "expected_pcie_gen": 5}
    # a link in power saving (idle, below its generation) is not a width to hold the GPU to
    saving = with_gpu(1, pcie={"width": 8, "max_width": 16, "gen": 1, "max_gen": 5})
    assert rules.expectations(saving)["expected_pcie_width"] == 16
    assert rules.expectations(saving)["expected_pcie_gen"] == 5
    no_driver = snap(init_error={"call": "nvmlInit", "code": 12, "text": "no library"})
    assert rules.expectations(no_driver) == {}


def test_pcie_generation_is_judged_only_while_the_gpu_is_busy() -> None:
    opts = {**OPTS, "expected_pcie_gen": 5}
    busy = {"gpu_idle": False, "hw_slowdown": False}
    low = {"width": 16, "max_width": 16, "gen": 4, "max_gen": 5}
    found = rules.evaluate(with_gpu(0, pcie=low, clocks=busy), opts)
    assert codes(found) == ["GPU_PCIE_GEN_DEGRADED"]
    assert load_builtin().entry("GPU_PCIE_GEN_DEGRADED").severity is Severity.WARNING
    assert rules.evaluate(with_gpu(0, pcie=low), opts) == []  # idle: power saving
    assert rules.evaluate(with_gpu(0, pcie=low, clocks=None), opts) == []  # not known
    assert rules.evaluate(with_gpu(0, clocks=busy), opts) == []
