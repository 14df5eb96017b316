"""A GPU node without its driver (issue 20, defect 10): NVIDIA GPUs on the PCI bus make both GPU
probes apply; with no expected count they cannot be judged (unknown), with one they are critical.
Without GPUs on the bus and none expected, the probes stay "unsupported"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

NO_LIBRARY = "/nonexistent/libnvidia-ml.so.1"
NO_SMI = "/nonexistent/nvidia-smi"


def sysfs(root: Path, gpus: int) -> Path:
    for i in range(gpus):
        dev = root / "bus/pci/devices" / f"0000:{0x3b + i:02x}:00.0"
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "class").write_text("0x030200\n")
    bmc = root / "bus/pci/devices/0000:02:00.0"  # the BMC's VGA: another vendor
    bmc.mkdir(parents=True)
    (bmc / "vendor").write_text("0x1a03\n")
    (bmc / "class").write_text("0x030000\n")
    return root


def check(hma_env: Any, tmp_path: Path, gpus: int, expected: str = "") -> tuple[int, dict]:
    root = sysfs(tmp_path / "sys", gpus)
    hma_env.write(
        f'[paths]\nsysfs = "{root}"\n'
        f'[probes.gpu]\nlibrary = "{NO_LIBRARY}"\n{expected}'
        f'[probes.nvidia_smi]\ncommand = ["{NO_SMI}", "-q", "-x"]\n{expected}'
    )
    res = hma_env.hma("check", "gpu", "nvidia_smi", "--json")
    return res.returncode, json.loads(res.stdout)


def test_no_gpus_on_the_bus_and_none_expected_is_unsupported(hma_env: Any, tmp_path: Path) -> None:
    rc, doc = check(hma_env, tmp_path, 0)
    assert rc == 0
    assert [p["status"] for p in doc["probes"]] == ["unsupported", "unsupported"]


def test_gpus_on_the_bus_without_a_driver_are_unknown(hma_env: Any, tmp_path: Path) -> None:
    rc, doc = check(hma_env, tmp_path, 2)
    assert rc == 3 and doc["severity"] == "unknown"
    for probe in doc["probes"]:
        assert probe["status"] == "ran", probe
        (f,) = probe["findings"]
        assert (f["code"], f["severity"]) == ("GPU_DRIVER_NOT_LOADED", "unknown")
        assert f["details"]["pci_gpus"] == ["0000:3b:00.0", "0000:3c:00.0"]
        assert "2 NVIDIA GPU(s) on the PCI bus" in f["message"]


@pytest.mark.parametrize("expected", ["expected_gpus = 2\n", "expected_gpus = 8\n"])
def test_an_expected_count_makes_it_critical(hma_env: Any, tmp_path: Path, expected: str) -> None:
    rc, doc = check(hma_env, tmp_path, 2, expected)
    assert rc == 2
    for probe in doc["probes"]:
        assert [(f["code"], f["severity"]) for f in probe["findings"]] == [
            ("GPU_DRIVER_NOT_LOADED", "critical")
        ]


def test_docs_gpu_md_quotes_what_hma_check_says(hma_env: Any, tmp_path: Path) -> None:
    """docs/gpu.md ("When a GPU probe is `unsupported`") shows the reasons as `hma check` prints
    them (the library and tool names of the default configuration)."""
    rc, doc = check(hma_env, tmp_path, 0)
    page = (Path(__file__).resolve().parents[3] / "docs" / "gpu.md").read_text()
    section = page.split("## When a GPU probe is `unsupported`\n", 1)[1].split("\n## ", 1)[0]
    for probe in doc["probes"]:
        reason = probe["error"].replace(NO_SMI, "nvidia-smi")
        assert f"`{probe['name']} unsupported ... {reason}`" in section, reason
