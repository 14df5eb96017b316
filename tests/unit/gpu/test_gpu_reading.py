"""The NVIDIA reading records and their JSON form (the probes' snapshots)."""

from __future__ import annotations

from typing import Any

import pytest

from hma.probes.nvidia.reading import (
    CallError,
    Clocks,
    EccMode,
    Fabric,
    GpuReading,
    Hang,
    NvLink,
    Pcie,
    Remap,
    Snapshot,
)

LOST = CallError("nvmlDeviceGetPciInfo", 15, "GPU is lost")


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (LOST, {"call": "nvmlDeviceGetPciInfo", "code": 15, "text": "GPU is lost"}),
        # a hang's still_stuck only where the reader knows it (NVML); False is known
        (
            Hang("nvidia-smi -q -x", None, 30.0, 1),
            {"call": "nvidia-smi -q -x", "device": None, "after_s": 30.0, "streak": 1},
        ),
        (
            Hang("nvmlInit", 2, 10.0, 3, False),
            {"call": "nvmlInit", "device": 2, "after_s": 10.0, "streak": 3, "still_stuck": False},
        ),
        (Pcie(16, 16, None, 5), {"width": 16, "max_width": 16, "gen": None, "max_gen": 5}),
        (
            Fabric(3, "Not Ready", None, None, None, 7),
            {
                "state": 3,
                "status": "Not Ready",
                "summary": None,
                "health_mask": None,
                "cluster_uuid": None,
                "clique_id": 7,
            },
        ),
    ],
)
def test_records_as_json(record: Any, expected: dict[str, Any]) -> None:
    assert record.to_json() == expected


def test_an_unread_gpu_leaves_out_the_optional_readings_and_writes_the_others_as_none() -> None:
    assert GpuReading(index=3, error=LOST).to_json() == {
        "index": 3,
        "bus_id": None,
        "name": None,
        "uuid": None,
        "arch": None,
        "error": LOST.to_json(),
        "pcie": None,
        "nvlink": None,
        "clocks": None,
        "temp": None,
        "temp_slowdown": None,
        "fabric": None,
        "recovery_action": None,
    }


def test_nested_records_and_lists_become_json() -> None:
    gpu = GpuReading(
        index=0,
        ecc_mode=EccMode(True, None),
        remap=Remap(0, 1, False, True),
        nvlink=NvLink({"0": True}, {"0": 4}),
        clocks=Clocks(True, False, False, False),
        call_errors={"nvmlDeviceGetTemperature": "Timeout"},
        temp_scale="tlimit",
    )
    snap = Snapshot("nvml", driver="590.48.01", count=1, gpus=[gpu], pci_gpus=["0000:18:00.0"])
    out = snap.to_json()
    assert "call_errors" not in out and "hang" in out and out["hang"] is None
    (record,) = out["gpus"]
    assert record["ecc_mode"] == {"current": True, "pending": None}
    assert record["remap"] == {"corrected": 0, "uncorrected": 1, "pending": False, "failure": True}
    assert record["nvlink"] == {"states": {"0": True}, "errors": {"0": 4}}
    assert record["clocks"]["gpu_idle"] is True and record["temp_scale"] == "tlimit"
    assert record["call_errors"] == {"nvmlDeviceGetTemperature": "Timeout"}
    assert "ecc" not in record and "retired" not in record and "error" not in record
    record["call_errors"]["x"] = "y"  # the JSON form is a copy
    assert gpu.call_errors == {"nvmlDeviceGetTemperature": "Timeout"}
