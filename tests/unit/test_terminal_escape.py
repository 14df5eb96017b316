"""Text others control (Slurm reasons, log lines, finding messages, tool output) reaches the
terminal escaped: no C0 but the newlines a format needs, no DEL, C1, bidi or format controls."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from test_slurm_hostile_text import Slurm, client, node

from hma.adapters.text import printable
from hma.commands import check, fleet, logscan, status
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Finding, ProbeRun, RunStatus
from hma.probes.kernel_log.rules import RuleSet

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202e"
ESCAPED = "\\x1b]0;pwned\\x07\\x1b[2J\\u202e"
REFUSED = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)
STATUS = Path(__file__).resolve().parent.parent / "fixtures" / "status" / "hostile.json"


def safe(text: str) -> bool:
    """Nothing a terminal would act on or reorder, newlines aside."""
    return REFUSED.search(text) is None


@given(st.text())
def test_printable_refuses_every_control_class(text: str) -> None:
    out = printable(text)
    assert safe(out) and "\n" not in out
    assert safe(printable(text, newlines=True))
    assert printable(text, newlines=True).count("\n") == text.count("\n")


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E)))
def test_printable_keeps_printable_ascii(text: str) -> None:
    assert printable(text) == text == printable(text, newlines=True)


def test_printable_escapes_as_repr_does() -> None:
    assert printable(HOSTILE) == ESCAPED
    assert printable("a\tb\r\n\x85\u2028\u061c") == "a\\tb\\r\\n\\x85\\u2028\\u061c"
    assert printable("été 日本 \\x1b") == "été 日本 \\x1b"


def test_fleet_escapes_a_reason_from_slurm() -> None:
    reason = f"HMA: GPU_XID_79{HOSTILE} gpu:0{HOSTILE} : reboot issued"
    slurm = Slurm([node("node1", Reason=reason)])
    doc = fleet.collect(client(slurm), "extra", 10.0, None)
    assert doc["nodes"][0]["code"] == "GPU_XID_79" + HOSTILE  # kept whole in the document
    text = fleet.render_text(doc)
    assert safe(text) and f"GPU_XID_79{ESCAPED}" in text and f"gpu:0{ESCAPED}" in text
    as_json = json.dumps(doc, indent=2, allow_nan=False)  # `hma fleet --json`
    assert as_json.isascii() and json.loads(as_json)["nodes"][0]["code"] == "GPU_XID_79" + HOSTILE


def test_logscan_escapes_a_kernel_line(tmp_path: Path) -> None:
    line = f"[ 5.000001] NVRM: Xid (PCI:0000:01:00): 79, pid=1, name={HOSTILE}python, fell off"
    log = tmp_path / "dmesg"
    log.write_text(f"{line}\n{line}\u2066\x9b\n", encoding="utf-8")
    hits, errors = logscan.scan([str(log)], RuleSet.load(None))
    doc = logscan.document(hits, errors, load_builtin())
    assert doc["findings"] and HOSTILE in doc["findings"][0]["details"]["raw"]
    text = logscan.render_text(doc)
    assert safe(text) and f"name={ESCAPED}python" in text and "\\u2066\\x9b" in text


def test_check_escapes_finding_messages_and_probe_errors() -> None:
    found = Finding("GPU_XID_79", f"gpu:0{HOSTILE}", f"fell off\n{HOSTILE}", probe="gpu")
    runs = [
        ProbeRun("gpu", RunStatus.RAN, 0.0, 0.01, (found,)),
        ProbeRun("efa", RunStatus.FAILED, 0.0, 0.01, error=f"fi_info: {HOSTILE}"),
    ]
    text = check.render_text(check.document(f"node1{HOSTILE}", runs, (found,)))
    assert safe(text) and len(text.splitlines()) == 5
    assert f"node1{ESCAPED}: " in text and f"fi_info: {ESCAPED}" in text
    assert f"gpu:0{ESCAPED}: fell off\\n{ESCAPED}" in text


def test_status_escapes_the_status_file_text() -> None:
    doc = json.loads(STATUS.read_text("utf-8"))
    text = status.render(doc, now=float(doc["generated"]))
    assert safe(text)
    assert f"node1{ESCAPED}: CRITICAL" in text
    assert f"Xid 79 {ESCAPED}\\u2066hidden\\u2069\\x9b31m" in text
    assert f"sinfo: {ESCAPED}" in text and "second line" not in text  # an error's first line
    assert f"NVRM: Xid {ESCAPED}\n" in text and "next line\\r\\x7f" in text  # evidence lines
