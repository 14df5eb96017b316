"""Expectations from the machine (issue 31 parts 3, 4): the GPUs settle after a boot or a driver
upgrade before counts, the driver and the fabric are judged; the fabric registration is judged;
ECC only where the product ships with it on; the PCIe width against both ends of the link.

The gpu probe runs over the real nvidia-ml-py binding and the stand-in NVML library, with a
procfs (``stat`` btime, a fabric manager process) and a sysfs tree (module version, PCIe ports)
generated per test; the nvidia_smi probe reads the real captures through the stand-in
nvidia-smi.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from nvmlstub import ERROR_FUNCTION_NOT_FOUND, NVIDIA_SMI
from nvmlstub import SMI_FIXTURES as FIXTURES

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Action, Severity
from hma.contracts.probe import ProbeContext
from hma.probes.nvidia import settle
from hma.probes.nvidia.gpu import GpuProbe
from hma.probes.nvidia.smi import NvidiaSmiProbe
from tests.unit.gpu.test_gpu_probe_nvml import BUS_IDS
from tests.unit.trn_support import gen_sysfs

CORPUS = sorted(FIXTURES.glob("*.xml"))
T4 = FIXTURES / "tesla-t4-v11.xml"
RTX = FIXTURES / "rtx-pro-6000-blackwell-v13.xml"
H100 = FIXTURES / "h100-v13.xml"
A100 = FIXTURES / "a100-sxm4-v12.xml"


def procfs(tmp_path: Path, booted_ago: float) -> Path:
    """A procfs with ``stat`` (btime ``booted_ago`` seconds back) and a fabric manager."""
    root = tmp_path / "proc"
    (root / "4242").mkdir(parents=True, exist_ok=True)
    (root / "4242" / "comm").write_text("nv-fabricmanage\n")
    (root / "4242" / "cmdline").write_bytes(b"/usr/bin/nv-fabricmanager\0-c\0fm.cfg\0")
    btime = int(time.time() - booted_ago)
    (root / "stat").write_text(f"cpu  1 2 3 4\nintr 0\nctxt 9\nbtime {btime}\nprocesses 7\n")
    return root


def sysfs(tmp_path: Path, module: Optional[str] = "590.48.01", slot: int = 16) -> Path:
    """A sysfs with the loaded nvidia module's version and the stand-in's GPUs in x``slot``
    ports."""
    root = tmp_path / "sys"
    gen_sysfs.pci_gpus(root, BUS_IDS, slot)
    if module is not None:
        (root / "module" / "nvidia").mkdir(parents=True, exist_ok=True)
        (root / "module" / "nvidia" / "version").write_text(module + "\n")
    return root


def gpu_check(
    lib: Path,
    tmp_path: Path,
    booted_ago: float = 3600.0,
    previous: Any = None,
    module: Optional[str] = "590.48.01",
    slot: int = 16,
    **opts: Any,
) -> tuple[dict, list]:
    """One gpu probe run; findings resolved against the catalogue."""
    options = {k: o.default for k, o in GpuProbe.options.items()}
    options.update({"library": str(lib), "expected_gpus": 8, **opts})
    ctx = ProbeContext(
        options=options,
        sysfs=RootReader(str(sysfs(tmp_path, module, slot))),
        procfs=RootReader(str(procfs(tmp_path, booted_ago))),
        runner=CommandRunner(),
        previous=previous,
    )
    probe = GpuProbe()
    snap = probe.collect(ctx)
    return snap, [load_builtin().resolve(f) for f in probe.evaluate(snap, ctx)]


def found(findings: list) -> list[tuple[str, str, str]]:
    return sorted((f.code, f.component, f.severity.name) for f in findings)


def test_fewer_gpus_right_after_boot_is_settling_then_critical(
    scenario: Any, nvml_lib: Path, tmp_path: Path
) -> None:
    scenario.count = 7
    scenario.write()
    snap, findings = gpu_check(nvml_lib, tmp_path, booted_ago=30)
    assert snap["settle"]["why"] == "boot"
    assert found(findings) == [("GPU_COUNT_MISMATCH", "node", "UNKNOWN")]
    until = time.strftime("%H:%M", time.localtime(snap["settle"]["until"]))
    assert findings[0].message == (
        f"settling after boot: judged from {until}; now: 7 GPU(s) visible, 8 expected"
    )
    assert findings[0].action is Action.NONE
    snap, findings = gpu_check(nvml_lib, tmp_path, booted_ago=30, settle_s=0)
    assert "settle" not in snap
    assert found(findings) == [("GPU_COUNT_MISMATCH", "node", "CRITICAL")]
    snap, findings = gpu_check(nvml_lib, tmp_path, booted_ago=121)
    assert "settle" not in snap
    assert found(findings) == [("GPU_COUNT_MISMATCH", "node", "CRITICAL")]


def test_driver_not_loaded_after_boot_is_settling(
    scenario: Any, nvml_lib: Path, tmp_path: Path
) -> None:
    scenario.set("err.nvmlInitWithFlags", 9)  # NVML_ERROR_DRIVER_NOT_LOADED
    _snap, findings = gpu_check(nvml_lib, tmp_path, booted_ago=10, module=None)
    assert found(findings) == [("GPU_DRIVER_NOT_LOADED", "node", "UNKNOWN")]
    assert findings[0].message.startswith("settling after boot: judged from ")
    _snap, findings = gpu_check(nvml_lib, tmp_path, booted_ago=600, module=None)
    assert found(findings) == [("GPU_DRIVER_NOT_LOADED", "node", "CRITICAL")]


def test_driver_upgrade_settles_from_the_run_that_saw_it(
    scenario: Any, nvml_lib: Path, tmp_path: Path
) -> None:
    old, findings = gpu_check(nvml_lib, tmp_path, module="570.86.15")
    assert old["module_version"] == "570.86.15" and "settle" not in old and findings == []
    scenario.count = 0  # NVML sees no GPUs for a while after the new module loads
    scenario.write()
    new, findings = gpu_check(nvml_lib, tmp_path / "2", previous=old)
    assert new["settle"]["why"] == "driver upgrade (570.86.15 -> 590.48.01)"
    assert found(findings) == [("GPU_COUNT_MISMATCH", "node", "UNKNOWN")]
    assert "settling after driver upgrade (570.86.15 -> 590.48.01)" in findings[0].message
    # the next run sees the same version: the window is carried until it ends
    carried, findings = gpu_check(nvml_lib, tmp_path / "3", previous=new)
    assert carried["settle"] == new["settle"]
    assert found(findings) == [("GPU_COUNT_MISMATCH", "node", "UNKNOWN")]
    ended = {**new, "settle": {**new["settle"], "until": time.time() - 1}}
    over, findings = gpu_check(nvml_lib, tmp_path / "4", previous=ended)
    assert "settle" not in over
    assert found(findings) == [("GPU_COUNT_MISMATCH", "node", "CRITICAL")]
    # the module unloaded for the upgrade: the last version known is kept, so the change is seen
    scenario.count = None
    scenario.write()
    gone, _findings = gpu_check(nvml_lib, tmp_path / "5", previous=old, module=None)
    assert gone["module_version"] == "570.86.15"


@pytest.mark.parametrize(
    "fabric, code, severity",
    [
        ("1 0 0 0", "GPU_FABRIC_NOT_READY", "CRITICAL"),  # NOT_STARTED
        ("2 0 0 0", "GPU_FABRIC_NOT_READY", "CRITICAL"),  # IN_PROGRESS
        ("3 999 0 0", "GPU_FABRIC_UNHEALTHY", "CRITICAL"),  # completed, failure status
    ],
)
def test_fabric_registration_is_judged_after_the_settle_time(
    scenario: Any, nvml_lib: Path, tmp_path: Path, fabric: str, code: str, severity: str
) -> None:
    scenario.dev(3, fabric=fabric)
    _snap, findings = gpu_check(nvml_lib, tmp_path)
    assert found(findings) == [(code, "gpu:0000:5d:00", severity)]
    _snap, findings = gpu_check(nvml_lib, tmp_path / "boot", booted_ago=20)
    settling = "UNKNOWN" if code == "GPU_FABRIC_NOT_READY" else severity
    assert found(findings) == [(code, "gpu:0000:5d:00", settling)]


def test_fabric_not_ready_has_a_remedy_and_drains_after_two_runs() -> None:
    entry = load_builtin().entry("GPU_FABRIC_NOT_READY")
    assert (entry.severity, entry.action) == (Severity.CRITICAL, Action.REBOOT)
    assert "fabric manager" in entry.remedy


def test_nvml_without_the_fabric_calls_is_no_finding(
    scenario: Any, nvml_lib: Path, tmp_path: Path
) -> None:
    for i in range(8):
        scenario.dev(i, fabric="2 0 0 0")  # would be a finding, if it could be read
    scenario.set("err.nvmlDeviceGetGpuFabricInfoV", ERROR_FUNCTION_NOT_FOUND)
    scenario.set("err.nvmlDeviceGetGpuFabricInfo", ERROR_FUNCTION_NOT_FOUND)
    snap, findings = gpu_check(nvml_lib, tmp_path)
    assert findings == [] and all(g["fabric"] is None for g in snap["gpus"])


def test_fabric_manager_dead_while_every_gpu_reads_healthy(
    scenario: Any, nvml_lib: Path, tmp_path: Path
) -> None:
    """Every GPU registered (Completed/Success) and healthy, the fabric manager gone."""
    snap, findings = gpu_check(nvml_lib, tmp_path, fabricmanager_process="no-such-process")
    assert snap["nvswitch"] is True
    assert found(findings) == [("GPU_FABRIC_MANAGER_DOWN", "node", "CRITICAL")]


@pytest.mark.parametrize(
    "pcie, slot, expected",
    [
        ("8 16 5 5", 8, []),  # an x16 GPU in an x8 slot: the link does what both ends can
        ("8 8 5 5", 16, []),  # an x8 card in an x16 slot
        ("16 16 5 5", 16, []),
        ("8 16 5 5", 16, [("GPU_PCIE_WIDTH_NARROW", "gpu:0000:3a:00", "WARNING")]),
        ("4 16 5 5", 8, [("GPU_PCIE_WIDTH_NARROW", "gpu:0000:3a:00", "WARNING")]),
    ],
)
def test_pcie_width_against_both_ends(
    scenario: Any, nvml_lib: Path, tmp_path: Path, pcie: str, slot: int, expected: list
) -> None:
    scenario.dev(2, pcie=pcie, clocks_event_reasons="0x0")  # busy: the width is judged
    snap, findings = gpu_check(nvml_lib, tmp_path, slot=slot)
    assert snap["gpus"][2]["pcie"]["slot_max_width"] == slot
    assert found(findings) == expected


def test_slot_is_unknown_on_a_root_bus_or_a_bad_attribute(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    gen_sysfs.pci_gpus(root, ["0000:3a:00.0"], 8)
    reader = RootReader(str(root))
    assert settle.slot_width(reader, "00000000:3A:00.0") == 8
    port = root / "devices/pci0000:00/0000:00:01.0/max_link_width"
    for bad in ("x8", "64", "", "0x8", "\u0668"):
        port.write_text(bad)
        assert settle.slot_width(reader, "00000000:3A:00.0") is None, bad
    vm = root / "devices/pci0000:00/0000:00:1e.0"  # on the root bus, as in a VM
    vm.mkdir(parents=True)
    os.symlink(vm, root / "bus/pci/devices/0000:00:1e.0")
    assert settle.slot_width(reader, "00000000:00:1E.0") is None
    assert settle.slot_width(reader, "not a bus id") is None
    assert settle.slot_width(reader, None) is None


# The nvidia_smi probe over the real captures.


def smi_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, doc: Path, slot: Optional[int] = None
) -> list:
    """The nvidia_smi probe on ``doc``; with ``slot``, each GPU of the document sits in a port of
    that width (else on a root bus, as in the cloud VMs most captures come from)."""
    monkeypatch.setenv("HMA_SMI_DOCUMENT", str(doc))
    monkeypatch.setenv("HMA_SMI_EXIT", "0")
    root = tmp_path / "sys"
    if slot is not None:
        ids = re.findall(r'<gpu id="([0-9A-Fa-f:.]+)"', doc.read_text())
        names = [settle.pci_name(i) for i in ids]
        gen_sysfs.pci_gpus(root, [n for n in names if n], slot)
    options = {k: o.default for k, o in NvidiaSmiProbe.options.items()}
    options["command"] = [str(NVIDIA_SMI), "-q", "-x"]
    ctx = ProbeContext(
        options,
        RootReader(str(root)),
        RootReader(str(procfs(tmp_path, 3600))),
        CommandRunner(),
    )
    probe = NvidiaSmiProbe()
    snap = probe.collect(ctx)
    return [load_builtin().resolve(f) for f in probe.evaluate(snap, ctx)]


def current_width(doc: Path) -> int:
    match = re.search(r"<current_link_width>(\d+)x<", doc.read_text())
    return int(match.group(1)) if match else 16


@pytest.mark.parametrize("doc", CORPUS, ids=lambda p: p.name)
def test_every_healthy_capture_raises_no_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, doc: Path
) -> None:
    """On the VM it came from (no port above the GPU) and in a slot as wide as its link."""
    assert [(f.code, f.message) for f in smi_check(monkeypatch, tmp_path, doc)] == []
    in_slot = smi_check(monkeypatch, tmp_path / "slot", doc, current_width(doc))
    assert [(f.code, f.message) for f in in_slot] == []


def edited(tmp_path: Path, src: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text, old
    out = tmp_path / f"edited-{src.name}"
    out.write_text(text.replace(old, new))
    return out


def test_degraded_variants_still_warn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the T4 capture (x8 of x16, gen 3 of 3) in an x16 slot: a link that did not train wide
    (f,) = smi_check(monkeypatch, tmp_path / "t4", T4, slot=16)
    assert (f.code, f.severity, f.details["expected"]) == (
        "GPU_PCIE_WIDTH_NARROW",
        Severity.WARNING,
        16,
    )
    # ECC off on a data-center part that ships with it on (the A100 capture, ECC disabled)
    doc = edited(tmp_path, A100, "<current_ecc>Enabled", "<current_ecc>Disabled")
    assert [f.code for f in smi_check(monkeypatch, tmp_path / "a100", doc)] == ["GPU_ECC_DISABLED"]
    # the RTX PRO capture named as a data-center product: its ECC-off is judged again
    doc = edited(tmp_path, RTX, "RTX PRO 6000 Blackwell Max-Q Workstation Edition", "B200")
    assert [f.code for f in smi_check(monkeypatch, tmp_path / "rtx", doc)] == ["GPU_ECC_DISABLED"]
    # fabric registration still in progress on the H100 capture
    doc = edited(tmp_path, H100, "<state>Completed", "<state>In Progress")
    assert [f.code for f in smi_check(monkeypatch, tmp_path / "h100", doc)] == [
        "GPU_FABRIC_NOT_READY"
    ]


@pytest.mark.timeout(60)
def test_hma_check_shows_the_settling_time(
    scenario: Any, nvml_lib: Path, hma_env: Any, tmp_path: Path
) -> None:
    """`hma check gpu` right after boot with a GPU missing: unknown, with "judged from"."""
    scenario.count = 7
    scenario.write()
    proc_root = procfs(tmp_path, booted_ago=5)
    hma_env.write(
        f'[paths]\nprocfs = "{proc_root}"\nsysfs = "{sysfs(tmp_path)}"\n'
        f'[probes.gpu]\nlibrary = "{nvml_lib}"\nexpected_gpus = 8\nsettle_s = 600\n'
    )
    env = hma_env.env()
    env["HMA_NVML_SCENARIO"] = str(scenario.path)
    proc = hma_env.hma("check", "gpu", "--json", env=env)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3, proc.stderr
    (finding,) = doc["probes"][0]["findings"]
    assert (finding["code"], finding["severity"]) == ("GPU_COUNT_MISMATCH", "unknown")
    assert re.match(r"settling after boot: judged from \d\d:\d\d; now: 7 GPU", finding["message"])
