"""Fuzz of the GPU process lists (issue 28, part 7): ``nvidia-smi -q -x`` lists each GPU's
processes (``<processes>``, ``<accounted_processes>``) with their pid, type, name and memory, all
chosen or caused by a job's processes. Generated lists (names with commas, quotes, newlines,
status words, ``[Not Found]``, forged XML as nvidia-smi escapes it; negative, huge or missing
pids and memory) spliced into every real capture of tests/fixtures/nvidia-smi give the findings
of the capture with empty lists: never a fault, never a status, and never an unreadable
document: a name holding a character that XML 1.0 cannot carry (a C0 control) made every GPU of
the node unknown before.

hma reads no other process list: not ``nvidia-smi --query-compute-apps`` and not NVML's
(``nvmlDeviceGetComputeRunningProcesses``); a GPU's processes matter only to nvidia-smi's own
refusal of a reset (tests/unit/test_fuzz_reset_ladder.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget
from nvmlstub import SMI_FIXTURES as FIXTURES

from hma.contracts.model import Severity
from hma.probes.nvidia import common as rules
from hma.probes.nvidia.smi import NvidiaSmiProbe, parse_result

CORPUS = sorted(FIXTURES.glob("*.xml"))
OPTS = {k: o.default for k, o in NvidiaSmiProbe.options.items()}
LISTS = re.compile(
    r"<(processes|accounted_processes)\s*/>|<(processes|accounted_processes)>.*?</\2>", re.S
)

HOSTILE = (
    "GPU is lost",
    "Unknown Error",
    "[Not Found]",
    "[N/A]",
    "N/A",
    "No devices were found",
    "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error",
    'python3 "train, eval".py --x=1,2,3',
    "a\nGPU is lost\nb",
    "\r\nUnknown Error\r\n",
    "</process_name><retired_pages><pending_retirement>Yes</pending_retirement>",
    "<xid>79</xid>",
    "&amp;&lt;",
    "x" * 5000,
    "\u202egnp.exe",
    "\x01\x1b[31m",
    "a\x00b\x08\x0c\x1f",
)
NUMBERS = (
    "N/A",
    "[Not Found]",
    "-1",
    "0",
    str(2**64),
    "9" * 40,
    "1e300",
    "nan",
)


def escaped(text: str) -> str:
    """As nvidia-smi writes element text: ``&``, ``<``, ``>`` escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def field() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40))


def number() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NUMBERS), st.integers(min_value=-(2**70), max_value=2**70).map(str)
    )


@st.composite
def process(draw: st.DrawFn) -> str:
    memory = draw(st.one_of(number().map(lambda n: f"{n} MiB"), field()))
    parts = {
        "gpu_instance_id": draw(st.one_of(number(), field())),
        "compute_instance_id": draw(number()),
        "pid": draw(st.one_of(number(), field())),
        "type": draw(st.sampled_from(["C", "G", "C+G", "M", "", "[Not Found]"]) | field()),
        "process_name": draw(field()),
        "used_memory": memory,
    }
    body = "".join(f"<{k}>{escaped(v)}</{k}>" for k, v in parts.items())
    return f"<process_info>{body}</process_info>"


def lists(text: str, rows: str) -> str:
    """``text`` with every process list holding ``rows``."""

    def fill(m: re.Match[str]) -> str:
        tag = m.group(1) or m.group(2)
        return f"<{tag}>{rows}</{tag}>"

    return LISTS.sub(fill, text)


def judged(doc: str) -> list[tuple[str, str, Severity]]:
    snap = parse_result({"rc": 0, "stdout": doc, "stderr": ""})
    return sorted((f.code, f.component, f.severity) for f in rules.evaluate(snap, OPTS))


BASELINE = {p.name: judged(lists(p.read_text(), "")) for p in CORPUS}


def test_every_capture_has_process_lists() -> None:
    for doc in CORPUS:
        assert LISTS.search(doc.read_text()), doc.name


@given(
    doc=st.sampled_from(CORPUS),
    rows=st.lists(process(), min_size=1, max_size=6),
)
@budget(120)
def test_process_lists_never_change_a_finding(doc: Path, rows: list[str]) -> None:
    text = lists(doc.read_text(), "".join(rows))
    assert judged(text) == BASELINE[doc.name]


@pytest.mark.parametrize("name", HOSTILE)
def test_each_hostile_name_in_every_capture(name: str) -> None:
    row = f"<process_info><pid>1</pid><process_name>{escaped(name)}</process_name></process_info>"
    for doc in CORPUS:
        assert judged(lists(doc.read_text(), row)) == BASELINE[doc.name], doc.name
