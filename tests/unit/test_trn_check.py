"""`hma check neuron efa` end to end (real CLI, entry points, config) on generated trees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trn_support import gen_sysfs

pytestmark = pytest.mark.timeout(60)


def check(tmp_path: Path, root: Path, *probes: str) -> tuple[int, dict]:
    config = tmp_path / "hma.toml"
    config.write_text(
        f'[paths]\nsysfs = "{root}"\n'
        "[probes.neuron]\noneshot_sample_s = 0.05\n"
        "[probes.efa]\noneshot_sample_s = 0.05\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(config), "check", "--json", *probes],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_healthy_trn1_is_ok(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path / "sys", "trn1.32xlarge")
    rc, doc = check(tmp_path, root, "neuron", "efa")
    assert rc == 0 and doc["severity"] == "ok"
    assert [p["status"] for p in doc["probes"]] == ["ran", "ran"]


def test_faulty_trn1_reports_each_fault_with_catalogue_severity(tmp_path: Path) -> None:
    faults = ["neuron_sram_ecc", "neuron_missing_device", "efa_unbound_function"]
    root = gen_sysfs.build(tmp_path / "sys", "trn1.32xlarge", faults)
    rc, doc = check(tmp_path, root, "neuron", "efa")
    assert rc == 2 and doc["severity"] == "critical"
    found = {
        (f["code"], f["component"], f["severity"], f["action"])
        for p in doc["probes"]
        for f in p["findings"]
    }
    assert found == {
        ("NEURON_SRAM_ECC_UNCORRECTED", "neuron:5", "critical", "replace"),
        ("NEURON_DEVICE_COUNT", "node", "critical", "reboot"),
        ("EFA_ADAPTER_COUNT", "node", "critical", "reboot"),
        ("EFA_PCI_UNBOUND", "pci:0000:14:00.0", "critical", "reboot"),
    }


def test_p5_without_neuron_is_unsupported_for_neuron(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path / "sys", "p5.48xlarge")
    rc, doc = check(tmp_path, root, "neuron", "efa")
    assert rc == 0
    assert [p["status"] for p in doc["probes"]] == ["unsupported", "ran"]
