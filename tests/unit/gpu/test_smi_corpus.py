"""Corpus: every real ``nvidia-smi -q -x`` capture in tests/fixtures/nvidia-smi, served by the
stand-in nvidia-smi and read by the real command runner, is healthy (no critical finding) and
fully readable (no GPU_READ_FAILED); an 8-GPU and a ~2 MB document are read whole."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from nvmlstub import NVIDIA_SMI
from nvmlstub import SMI_FIXTURES as FIXTURES

from hma.adapters.command import TOOL_OUTPUT_CAP, CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.contracts.probe import ProbeContext
from hma.probes.nvidia.smi import NvidiaSmiProbe

CORPUS = sorted(FIXTURES.glob("*.xml"))
EIGHT = FIXTURES / "a100-sxm4-8gpu-v12.xml"
EXEC_CAP = 65536  # [agent] exec_output_cap's default, the cap that cut nvidia-smi before


def judge(monkeypatch: pytest.MonkeyPatch, doc: Path, runner: CommandRunner) -> tuple[dict, list]:
    monkeypatch.setenv("HMA_SMI_DOCUMENT", str(doc))
    monkeypatch.setenv("HMA_SMI_EXIT", "0")
    options = {k: o.default for k, o in NvidiaSmiProbe.options.items()}
    options["command"] = [str(NVIDIA_SMI), "-q", "-x"]
    ctx = ProbeContext(options, RootReader("/sys"), RootReader("/proc"), runner)
    probe = NvidiaSmiProbe()
    snap = probe.collect(ctx)
    return snap, [load_builtin().resolve(f) for f in probe.evaluate(snap, ctx)]


def test_every_capture_has_its_provenance() -> None:
    assert len(CORPUS) >= 5
    for doc in CORPUS:
        assert Path(f"{doc}.src.txt").is_file(), doc.name


@pytest.mark.parametrize("doc", CORPUS, ids=lambda p: p.name)
def test_real_capture_is_healthy_and_readable(monkeypatch: pytest.MonkeyPatch, doc: Path) -> None:
    snap, findings = judge(monkeypatch, doc, CommandRunner())
    assert [f for f in findings if f.severity is Severity.CRITICAL] == []
    assert [f.message for f in findings if f.code == "GPU_READ_FAILED"] == []
    assert snap["gpus"] and all(g.get("bus_id") for g in snap["gpus"])


def test_eight_gpu_document_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EIGHT.stat().st_size > EXEC_CAP
    snap, findings = judge(monkeypatch, EIGHT, CommandRunner())
    assert snap["count"] == 8 and len(snap["gpus"]) == 8 and findings == []
    _snap, cut = judge(monkeypatch, EIGHT, CommandRunner(EXEC_CAP))
    assert [(f.code, f.severity) for f in cut] == [("GPU_READ_FAILED", Severity.UNKNOWN)]
    assert f"output cut at {EXEC_CAP} bytes" in cut[0].message


def two_megabytes(tmp_path: Path) -> Path:
    """The 8-GPU document with 1,200 compute processes per GPU (as under MPS or many ranks)."""
    text = EIGHT.read_text()
    rows = "".join(
        "            <process_info>\n"
        "                <gpu_instance_id>N/A</gpu_instance_id>\n"
        "                <compute_instance_id>N/A</compute_instance_id>\n"
        f"                <pid>{10000 + n}</pid>\n"
        "                <type>C</type>\n"
        f"                <process_name>/usr/bin/python3 train.py --rank {n}</process_name>\n"
        "                <used_memory>1024 MiB</used_memory>\n"
        "            </process_info>\n"
        for n in range(1200)
    )
    text = re.sub(r"<processes\s*/>", f"<processes>\n{rows}        </processes>", text)
    out = tmp_path / "a100-8gpu-2mb.xml"
    out.write_text(text)
    return out


def test_two_megabyte_document_is_read_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = two_megabytes(tmp_path)
    assert 2_000_000 < doc.stat().st_size < TOOL_OUTPUT_CAP
    snap, findings = judge(monkeypatch, doc, CommandRunner())
    assert len(snap["gpus"]) == 8 and findings == []
