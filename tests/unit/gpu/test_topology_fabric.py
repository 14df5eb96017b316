"""The node's NVLink domain from the GPUs' fabric info: NVML (the real binding over the stand-in
library, every struct version) and nvidia-smi (a real capture with the domain edited in)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nvmlstub import ERROR_FUNCTION_NOT_FOUND
from nvmlstub import SMI_FIXTURES as FIXTURES

from hma.contracts.model import Severity
from hma.probes.nvidia import common as rules
from hma.probes.nvidia.gpu import GpuProbe
from hma.probes.nvidia.smi import NvidiaSmiProbe
from tests.unit.gpu.test_gpu_probe_nvml import check, codes
from tests.unit.gpu.test_nvidia_smi import edited, run

UUID = "8c3e61a2-57d4-4c1e-9b0a-3f2e1d0c4b5a"
OTHER = "11111111-2222-3333-4444-555555555555"


def set_domain(scenario: Any, cluster: str, clique: int) -> None:
    for i in range(8):
        scenario.dev(i, fabric_domain=f"{cluster} {clique}")


@pytest.mark.parametrize("v1", [False, True], ids=["v3", "v1"])
def test_nvml_domain_when_every_gpu_agrees(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int, v1: bool
) -> None:
    set_domain(scenario, UUID, 7)
    if v1:  # an old driver without the versioned call: the deprecated v1 struct
        scenario.set("err.nvmlDeviceGetGpuFabricInfoV", ERROR_FUNCTION_NOT_FOUND)
    snap, findings = check(nvml_lib, tmp_path)
    assert findings == []
    assert snap["gpus"][0]["fabric"]["cluster_uuid"] == UUID
    assert snap["gpus"][0]["fabric"]["clique_id"] == 7
    assert GpuProbe().summary(snap) == {"domain": f"{UUID}.7"}


def test_nvml_gpus_in_two_domains_is_a_warning(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    set_domain(scenario, UUID, 7)
    scenario.dev(5, fabric_domain=f"{UUID} 8")
    snap, findings = check(nvml_lib, tmp_path)
    assert codes(findings) == [("GPU_FABRIC_DOMAIN_MISMATCH", "node")]
    assert findings[0].details["domains"] == {f"{UUID}.7": [0, 1, 2, 3, 4, 6, 7], f"{UUID}.8": [5]}
    assert GpuProbe().summary(snap) is None


def test_nvml_no_domain_on_hgx_or_before_registration(
    scenario, nvml_lib: Path, tmp_path: Path, fabricmanager: int
) -> None:
    snap, _findings = check(nvml_lib, tmp_path)  # HGX H100: all-zero cluster UUID
    assert snap["gpus"][0]["fabric"]["cluster_uuid"] == rules.ZERO_UUID
    assert GpuProbe().summary(snap) is None
    set_domain(scenario, UUID, 7)
    for i in range(8):  # registration in progress: not a domain yet (and a fabric finding)
        scenario.dev(i, fabric="2 0 0 0")
    snap, _findings = check(nvml_lib, tmp_path)
    assert GpuProbe().summary(snap) is None


def test_nvidia_smi_domain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = edited(
        tmp_path,
        FIXTURES / "h100-v13.xml",
        ("<cliqueId>0", "<cliqueId>3"),
        ("<clusterUuid>0{8}-0{4}-0{4}-0{4}-0{12}", f"<clusterUuid>{OTHER.upper()}"),
    )
    snap, findings = run(monkeypatch, doc)
    assert findings == []
    assert NvidiaSmiProbe().summary(snap) == {"domain": f"{OTHER}.3"}


def test_nvidia_smi_malformed_cluster_uuid_is_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = edited(
        tmp_path,
        FIXTURES / "h100-v13.xml",
        ("<clusterUuid>0{8}-0{4}", "<clusterUuid>zz000000-0000"),
    )
    snap, findings = run(monkeypatch, doc)
    assert [(f.code, f.severity) for f in findings] == [("GPU_READ_FAILED", Severity.UNKNOWN)]
    assert "clusterUuid" in findings[0].message
    assert NvidiaSmiProbe().summary(snap) is None
