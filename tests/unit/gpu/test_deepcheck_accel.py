"""The accelerators stage of `hma deep-check` over the real NVML binding and the stand-in
library: a narrow PCIe link and a down NVLink are wiring faults, a healthy board passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def deep_check(
    hma_env: Any, scenario: Any, nvml_lib: Path, extra: str = ""
) -> tuple[int, dict[str, Any]]:
    hma_env.write(f'[probes.gpu]\nlibrary = "{nvml_lib}"\nexpected_gpus = 8\n{extra}')
    env = hma_env.env()
    env["HMA_NVML_SCENARIO"] = str(scenario.path)
    proc = hma_env.hma("deep-check", "--stages", "accelerators", "--json", "--no-record", env=env)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.timeout(60)
def test_healthy_board_passes(scenario: Any, nvml_lib: Path, hma_env: Any) -> None:
    scenario.write()
    rc, doc = deep_check(hma_env, scenario, nvml_lib)
    (stage,) = doc["stages"]
    assert (rc, stage["verdict"], stage["findings"]) == (0, "pass", [])
    assert stage["details"]["probes"]["gpu"] == "ran"


@pytest.mark.timeout(60)
def test_narrow_link_and_down_nvlink_are_wiring_faults(
    scenario: Any, nvml_lib: Path, hma_env: Any
) -> None:
    scenario.dev(2, pcie="8 16 5 5")
    scenario.dev(5, **{"nvlink_state.3": 0})
    scenario.write()  # the host's sysfs has no slot for the stand-in's GPUs: the width is set
    rc, doc = deep_check(hma_env, scenario, nvml_lib, "expected_pcie_width = 16\n")
    (stage,) = doc["stages"]
    found = {(f["details"]["code"], f["component"]) for f in stage["findings"]}
    assert {f["code"] for f in stage["findings"]} == {"DEEP_ACCEL_WIRING"}
    assert ("GPU_NVLINK_DOWN", "gpu:0000:ab:00") in found
    assert any(
        code.startswith("GPU_PCIE_WIDTH") and comp == "gpu:0000:3a:00" for code, comp in found
    )
    assert rc == 2 and stage["verdict"] == "fail"


def test_settling_gpus_are_unknown_not_miswired() -> None:
    """Right after boot the gpu probe reports a missing GPU as unknown (settling): the stage is
    unknown, not a wiring failure; once judged, it is one."""
    from types import SimpleNamespace

    from hma.contracts.model import Finding, RunStatus, Severity
    from hma.contracts.probe import unknown
    from hma.deepcheck.stages import judge_accelerators

    settling = unknown("GPU_COUNT_MISMATCH", "node", "settling after boot: judged from 10:02")
    run = SimpleNamespace(probe="gpu", status=RunStatus.RAN, error="", findings=[settling])
    result = judge_accelerators([run])
    assert result.verdict == "unknown"
    assert [f.code for f in result.findings] == ["DEEP_STAGE_UNKNOWN"]
    assert "settling after boot: judged from 10:02" in result.message
    judged = Finding("GPU_COUNT_MISMATCH", "node", "7 GPU(s) visible, 8 expected", {})
    run.findings = [judged.with_(severity=Severity.CRITICAL)]
    assert [f.code for f in judge_accelerators([run]).findings] == ["DEEP_ACCEL_WIRING"]
