"""nvidia_smi reads nvidia-smi's output by its structure (issue 23): text that users choose
(process names) is never a status, and an empty document is not "0 GPUs"."""

from __future__ import annotations

import re

import pytest
from nvmlstub import SMI_FIXTURES as FIXTURES

from hma.contracts.model import Severity
from hma.probes.nvidia import common as rules
from hma.probes.nvidia.smi import NvidiaSmiProbe, parse_result

A10G = FIXTURES / "a10g.xml"  # one process: /usr/lib/xorg/Xorg
LOST = "GPU is lost"
HANDLE = "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error"
OPTS = {k: o.default for k, o in NvidiaSmiProbe.options.items()}


def judge(stdout: str, rc: int = 0, stderr: str = "", **opts: object) -> list:
    snap = parse_result({"rc": rc, "stdout": stdout, "stderr": stderr})
    return rules.evaluate(snap, {**OPTS, **opts})


def named(name: str) -> str:
    """The real A10G capture with its one process renamed (escaped as nvidia-smi prints it)."""
    text = A10G.read_text()
    escaped = name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out, n = re.subn(r"<process_name>[^<]*</process_name>", f"<process_name>{escaped}<", text)
    assert n == 1
    return out.replace(f"<process_name>{escaped}<", f"<process_name>{escaped}</process_name>")


@pytest.mark.parametrize(
    "name",
    [
        LOST,
        HANDLE,
        f"\n{HANDLE}\n",
        f"x\n{LOST}\n{HANDLE}",
        "No devices were found",
        "Unknown Error",
    ],
)
def test_process_name_is_never_a_status(name: str) -> None:
    assert judge(named(name), expected_gpus=1) == []


def test_handle_message_as_its_own_line_still_counts() -> None:
    findings = judge(HANDLE + "\n" + A10G.read_text(), rc=15)
    assert ("GPU_UNKNOWN_ERROR", "gpu:0000:3b:00") in [(f.code, f.component) for f in findings]


def test_process_name_in_a_malformed_document_is_not_no_devices() -> None:
    doc = named("No devices were found")
    cut = doc[: doc.index("</process_name>") + 40]  # cut after the process name
    (f,) = judge(cut, rc=0, expected_gpus=1)
    assert (f.code, f.severity) == ("GPU_READ_FAILED", Severity.UNKNOWN)


@pytest.mark.parametrize(
    "doc",
    [
        "<nvidia_smi_log/>",
        '<?xml version="1.0" ?>\n<nvidia_smi_log>\n</nvidia_smi_log>\n',
        "<nvidia_smi_log><timestamp>Mon</timestamp><driver_version>N/A</driver_version>"
        "</nvidia_smi_log>",
    ],
)
def test_empty_document_is_a_read_failure_not_zero_gpus(doc: str) -> None:
    (f,) = judge(doc, expected_gpus=8)
    assert (f.code, f.severity) == ("GPU_READ_FAILED", Severity.UNKNOWN)
    assert "no <gpu> and no driver version" in f.message


@pytest.mark.parametrize("value", ["\u20038", "8\u3000", "\u00a08"])
def test_unicode_space_around_a_value_is_a_read_failure(value: str) -> None:
    """Only ASCII blanks around an element's text are dropped (issue 23): ``str.strip()`` would
    read U+2003 8 as 8 uncorrected remapped rows."""
    text = A10G.read_text()
    doc = text.replace("<remapped_row_unc>0<", f"<remapped_row_unc>{value}<")
    assert doc != text
    findings = judge(doc)
    assert {(f.code, f.severity) for f in findings} == {("GPU_READ_FAILED", Severity.UNKNOWN)}
    assert "remapped_row_unc" in findings[0].message
