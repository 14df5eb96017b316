"""nvidia_smi probe: real captured documents (v11, v12, a v13 derived from a real capture) through
the stand-in nvidia-smi and the real command runner, then the shared rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from nvmlstub import NVIDIA_SMI
from nvmlstub import SMI_FIXTURES as FIXTURES

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import Severity
from hma.contracts.probe import ProbeContext
from hma.probes.nvidia.smi import NvidiaSmiProbe, parse_result, parse_xml

V11, V12, V13 = FIXTURES / "a10g.xml", FIXTURES / "a100-sxm4-v12.xml", FIXTURES / "h100-v13.xml"


def ctx(**opts: Any) -> ProbeContext:
    options = {k: o.default for k, o in NvidiaSmiProbe.options.items()}
    options["command"] = [str(NVIDIA_SMI), "-q", "-x"]
    options.update(opts)
    return ProbeContext(
        options=options,
        sysfs=RootReader("/sys"),
        procfs=RootReader("/proc"),
        runner=CommandRunner(),
    )


def run(
    monkeypatch: pytest.MonkeyPatch,
    doc: Any = None,
    rc: int = 0,
    stderr: str = "",
    hang: bool = False,
    **opts: Any,
) -> tuple[dict, list]:
    for key in ("HMA_SMI_DOCUMENT", "HMA_SMI_EXIT", "HMA_SMI_STDERR", "HMA_SMI_HANG"):
        monkeypatch.delenv(key, raising=False)
    if doc is not None:
        monkeypatch.setenv("HMA_SMI_DOCUMENT", str(doc))
    monkeypatch.setenv("HMA_SMI_EXIT", str(rc))
    if stderr:
        monkeypatch.setenv("HMA_SMI_STDERR", stderr)
    if hang:
        monkeypatch.setenv("HMA_SMI_HANG", "1")
    probe = NvidiaSmiProbe()
    c = ctx(**opts)
    snap = probe.collect(c)
    return snap, probe.evaluate(snap, c)


def edited(tmp_path: Path, src: Path, *subs: tuple[str, str]) -> Path:
    text = src.read_text()
    for old, new in subs:
        assert re.search(old, text), old
        text = re.sub(old, new, text, count=1)
    out = tmp_path / src.name
    out.write_text(text)
    return out


@pytest.mark.parametrize("doc, expected", [(V11, 1), (V12, 4), (V13, 1)])
def test_real_captures_are_healthy(
    monkeypatch: pytest.MonkeyPatch, doc: Path, expected: int
) -> None:
    snap, findings = run(monkeypatch, doc, expected_gpus=expected)
    assert findings == []
    assert snap["count"] == expected and len(snap["gpus"]) == 1


def test_schema_differences_are_normalized() -> None:
    v11 = parse_xml(V11.read_text())["gpus"][0]
    v12 = parse_xml(V12.read_text())["gpus"][0]
    v13 = parse_xml(V13.read_text())["gpus"][0]
    assert v11["clocks"]["gpu_idle"] is True  # clocks_throttle_reasons (v11)
    assert v13["clocks"]["gpu_idle"] is True  # clocks_event_reasons (v13)
    assert v11["recovery_action"] is None  # neither gpu_reset_status nor gpu_recovery_action
    assert v12["recovery_action"] == 0  # gpu_reset_status: No/No
    assert v13["recovery_action"] == 0  # gpu_recovery_action: None
    assert "remap" not in v12  # <remapped_rows>N/A</remapped_rows> on an A100 in MIG mode
    assert v11["remap"]["pending"] is False
    assert v11["pcie"] == {"width": 8, "max_width": 16, "gen": 1, "max_gen": 4}
    assert (v11["temp"], v11["temp_slowdown"]) == (17, 95)  # absolute thresholds
    assert (v13["temp"], v13["temp_slowdown"]) == (-46, 2)  # T.Limit scale, negated
    assert v13["fabric"] == {
        "state": 3,
        "status": 0,
        "summary": None,
        "health_mask": None,
        "cluster_uuid": "00000000-0000-0000-0000-000000000000",  # HGX: NVLink ends at the node
        "clique_id": 0,
    }
    assert v12["fabric"] is None  # state N/A
    assert v13["bus_id"] == "00000000:00:09.0"


@pytest.mark.parametrize(
    "src, subs, code",
    [
        (V13, [("<remapped_row_pending>No", "<remapped_row_pending>Yes")], "GPU_ROW_REMAP_PENDING"),
        (V11, [("<remapped_row_failure>No", "<remapped_row_failure>Yes")], "GPU_ROW_REMAP_FAILURE"),
        (V13, [("<dram_uncorrectable>0", "<dram_uncorrectable>2")], "GPU_ECC_UNCORRECTED"),
        (V11, [("<current_ecc>Enabled", "<current_ecc>Disabled")], "GPU_ECC_DISABLED"),
        (
            V13,
            [("<gpu_recovery_action>None", "<gpu_recovery_action>Node Reboot Required")],
            "GPU_RECOVERY_ACTION",
        ),
        (V12, [("<reset_required>No", "<reset_required>Yes")], "GPU_RECOVERY_ACTION"),
        (V13, [("<state>Completed", "<state>In Progress")], "GPU_FABRIC_NOT_READY"),
        (V13, [("<summary>N/A", "<summary>Unhealthy")], "GPU_FABRIC_UNHEALTHY"),
        (
            V11,
            [
                (
                    "<clocks_throttle_reason_hw_slowdown>Not Active",
                    "<clocks_throttle_reason_hw_slowdown>Active",
                )
            ],
            "GPU_CLOCKS_SLOWDOWN",
        ),
        (
            V13,
            [
                (
                    "<clocks_event_reason_hw_thermal_slowdown>Not Active",
                    "<clocks_event_reason_hw_thermal_slowdown>Active",
                )
            ],
            "GPU_CLOCKS_SLOWDOWN",
        ),
        (V13, [("<gpu_temp_tlimit>46 C", "<gpu_temp_tlimit>-3 C")], "GPU_TEMP_HIGH"),
        (V11, [("<gpu_temp>17 C", "<gpu_temp>96 C")], "GPU_TEMP_HIGH"),
    ],
)
def test_faults_in_documents(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, src: Path, subs: list, code: str
) -> None:
    _snap, findings = run(monkeypatch, edited(tmp_path, src, *subs))
    assert [f.code for f in findings] == [code]


def test_field_errors_in_a_document(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = edited(tmp_path, V13, ("<gpu_temp>41 C", "<gpu_temp>Unknown Error"))
    _snap, findings = run(monkeypatch, doc)
    assert [(f.code, f.severity) for f in findings] == [("GPU_READ_FAILED", Severity.UNKNOWN)]
    assert "gpu_temp" in findings[0].message
    doc = edited(tmp_path, V13, ("<remapped_row_corr>0", "<remapped_row_corr>GPU is lost"))
    _snap, findings = run(monkeypatch, doc)
    assert [(f.code, f.component) for f in findings] == [("GPU_LOST", "gpu:0000:00:09")]


def test_v13_with_eight_gpus_one_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _snap, findings = run(monkeypatch, V13, instance_type=None, expected_gpus=8)
    assert [f.code for f in findings] == ["GPU_COUNT_MISMATCH"]


@pytest.mark.parametrize(
    "rc, code, severity",
    [
        (15, "GPU_LOST", None),
        (9, "GPU_DRIVER_NOT_LOADED", None),
        (14, "GPU_INFOROM_CORRUPTED", None),
        (10, "GPU_IRQ_ISSUE", None),
        (255, "GPU_READ_FAILED", Severity.UNKNOWN),
        (4, "GPU_READ_FAILED", Severity.UNKNOWN),
    ],
)
def test_exit_codes(monkeypatch: pytest.MonkeyPatch, rc: int, code: str, severity: Any) -> None:
    _snap, findings = run(monkeypatch, None, rc=rc)
    assert [(f.code, f.severity) for f in findings] == [(code, severity)]
    assert f"exit status {rc}" in findings[0].message


def test_handle_error_line_names_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    line = "Unable to determine the device handle for GPU0000:65:00.0: Unknown Error"
    _snap, findings = run(monkeypatch, None, rc=15, stderr=line)
    assert [(f.code, f.component) for f in findings] == [("GPU_UNKNOWN_ERROR", "gpu:0000:65:00")]


def test_malformed_document_is_unknown_with_the_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cut = tmp_path / "cut.xml"
    cut.write_text(V13.read_text()[:3000])
    _snap, findings = run(monkeypatch, cut)
    (f,) = findings
    assert (f.code, f.severity) == ("GPU_READ_FAILED", Severity.UNKNOWN)
    assert "malformed nvidia-smi XML" in f.message


def test_no_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    _snap, findings = run(monkeypatch, None, rc=6, stderr="No devices were found", expected_gpus=8)
    assert [f.code for f in findings] == ["GPU_COUNT_MISMATCH"]


@pytest.mark.timeout(30)
def test_hang_past_timeout_is_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    snap, findings = run(monkeypatch, None, hang=True, command_timeout=0.5)
    assert [(f.code, f.severity) for f in findings] == [("GPU_NVML_TIMEOUT", Severity.UNKNOWN)]
    c = ctx()
    c.previous = snap  # the previous run hung as well
    assert [f.code for f in NvidiaSmiProbe().evaluate(snap, c)] == ["GPU_DRIVER_HANG"]


def test_missing_binary_is_unknown_when_gpus_expected(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = NvidiaSmiProbe()
    c = ctx(command=["/nonexistent/nvidia-smi", "-q", "-x"])
    assert probe.applies(c) is not None
    c = ctx(command=["/nonexistent/nvidia-smi", "-q", "-x"], expected_gpus=8)
    assert probe.applies(c) is None
    (f,) = probe.evaluate(probe.collect(c), c)
    assert f.code == "GPU_DRIVER_NOT_LOADED"


def test_parse_result_without_document() -> None:
    snap = parse_result({"rc": 0, "stdout": "garbage", "stderr": ""})
    assert snap["init_error"]["code"] == -1


def test_cut_output_is_reported_as_cut_never_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HMA_SMI_DOCUMENT", str(V12))
    monkeypatch.setenv("HMA_SMI_EXIT", "0")
    probe = NvidiaSmiProbe()
    c = ctx()
    c.runner = CommandRunner(output_cap=4096)
    (f,) = probe.evaluate(probe.collect(c), c)
    assert (f.code, f.severity) == ("GPU_READ_FAILED", Severity.UNKNOWN)
    assert "output cut at 4096 bytes" in f.message


@pytest.mark.parametrize(
    "old, new",
    [
        ("<dram_uncorrectable>0", "<dram_uncorrectable>-1"),
        ("<dram_uncorrectable>0", "<dram_uncorrectable>1e-9"),
        ("<dram_uncorrectable>0", f"<dram_uncorrectable>{2**64}"),
        ("<dram_uncorrectable>0", "<dram_uncorrectable>" + "9" * 400),
        ("<dram_uncorrectable>0", "<dram_uncorrectable>\u0663"),
        ("<remapped_row_pending>No", "<remapped_row_pending>Maybe"),
        ("<current_ecc>Enabled", "<current_ecc>Enabledd"),
        ("<gpu_recovery_action>None", "<gpu_recovery_action>%%"),
        ("<state>Completed", "<state>Compl3ted"),
        ("<current_link_width>16x", "<current_link_width>-16x"),
        ("<gpu_temp_tlimit>46 C", "<gpu_temp_tlimit>nan C"),
        ('<gpu id="00000000:00:09.0">', '<gpu id="zz">'),
    ],
)
def test_garbage_values_are_unknown_never_faults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, old: str, new: str
) -> None:
    _snap, findings = run(monkeypatch, edited(tmp_path, V13, (re.escape(old), new)))
    (f,) = findings
    assert (f.code, f.severity) == ("GPU_READ_FAILED", Severity.UNKNOWN), f.message
    assert "unparsable value" in f.message
