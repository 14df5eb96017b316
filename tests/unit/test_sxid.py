"""The NVSwitch SXid catalogue (generated from NVIDIA's Fabric Manager guide) and its decoder."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Action, Clears, Severity
from hma.health.model import HealthModel
from hma.probes.kernel_log import decoders
from hma.probes.nvidia import sxid

ROOT = Path(__file__).resolve().parents[2]


def table_rows() -> list[dict[str, str]]:
    lines = (ROOT / "scripts" / "sxid-table.tsv").read_text().splitlines()
    body = [ln for ln in lines if not ln.startswith("#")]
    return list(csv.DictReader(body, delimiter="\t", quoting=csv.QUOTE_NONE))


def line(n: int, word: str, pci: str = "0000:06:00.0", rest: str = "Link 48 LTSSM Fault Up") -> str:
    return f"nvidia-nvswitch1: SXid (PCI:{pci}): {n:05d}, {word}, {rest}"


def test_every_sxid_of_the_guide_has_its_own_code() -> None:
    rows = table_rows()
    assert len(rows) == 93  # gpud keeps 93 from NVIDIA's Fabric Manager guide
    cat = load_builtin()
    for row in rows:
        entry = cat.get(f"GPU_SXID_{row['sxid']}")
        assert entry is not None and entry.fatal and entry.fail_after == 1, row["sxid"]
    assert sxid.catalogued_sxids() == frozenset(int(r["sxid"]) for r in rows)


# One row per class of NVIDIA's guide: (class, an SXid of it, severity, action, drains, clears).
CLASSES = [
    ("nonfatal", 12028, Severity.WARNING, Action.NONE, False, Clears.WINDOW),
    ("port-fatal", 20034, Severity.CRITICAL, Action.REBOOT, True, Clears.REBOOT),
    ("always-fatal", 10003, Severity.CRITICAL, Action.REBOOT, True, Clears.REBOOT),
]


@pytest.mark.parametrize(("kind", "n", "severity", "action", "drains", "clears"), CLASSES)
def test_each_class_maps_to_one_severity_and_action(
    kind: str, n: int, severity: Severity, action: Action, drains: bool, clears: Clears
) -> None:
    (row,) = [r for r in table_rows() if r["sxid"] == str(n)]
    assert row["class"] == kind
    entry = load_builtin().get(f"GPU_SXID_{n}")
    assert entry is not None
    assert (entry.severity, entry.action, entry.drains, entry.clears) == (
        severity,
        action,
        drains,
        clears,
    )


def test_every_row_of_the_table_has_one_of_the_classes() -> None:
    assert {r["class"] for r in table_rows()} == {c[0] for c in CLASSES}
    for row in table_rows():
        entry = load_builtin().get(f"GPU_SXID_{row['sxid']}")
        expected = {c[0]: c[2] for c in CLASSES}[row["class"]]
        assert entry is not None and entry.severity is expected, row["sxid"]


# (SXid, the line's word, code, severity of the finding after the catalogue, drains)
VERDICTS = [
    (20034, "Fatal", "GPU_SXID_20034", Severity.CRITICAL, True),  # port-fatal, Fatal
    (20034, "Non-fatal", "GPU_SXID_20034", Severity.WARNING, False),  # port-fatal, not this time
    (10003, "Non-fatal", "GPU_SXID_10003", Severity.CRITICAL, True),  # always fatal, any word
    (12028, "Non-fatal", "GPU_SXID_12028", Severity.WARNING, False),  # non-fatal
    (12028, "Fatal", "KERNEL_SXID_FATAL", Severity.CRITICAL, True),  # non-fatal printed Fatal
    (28006, "Non-fatal", "KERNEL_SXID_NONFATAL", Severity.WARNING, False),  # not catalogued
    (28006, "Fatal", "KERNEL_SXID_FATAL", Severity.CRITICAL, True),
]


@pytest.mark.parametrize(("n", "word", "code", "severity", "drains"), VERDICTS)
def test_the_line_word_refines_the_class(
    n: int, word: str, code: str, severity: Severity, drains: bool
) -> None:
    cat = load_builtin()
    decoder = decoders.load("sxid")
    text = line(n, word)
    fault = decoder.fault(text)
    assert fault is not None and fault[:2] == (code, "nvswitch:0000:06:00.0")
    finding = cat.resolve(decoder.finding(text, {"line": text}, "kernel_log", 1.0))
    assert finding.code == code and finding.severity is severity
    assert finding.details["sxid"] == n and finding.details["nvswitch_link"] == 48
    verdict = HealthModel(cat, "b").observe_event(finding, 1.0)
    assert bool(verdict.draining) is drains


@pytest.mark.parametrize(
    "text",
    [
        "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000}",
        "foo nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1 x",  # not at the start
        "nvidia-nvswitch0: SXid (PCI:0000:05:00): 20034, Fatal, Link 1 x",  # no function number
    ],
)
def test_lines_without_a_verdict_or_out_of_shape_are_not_sxids(text: str) -> None:
    assert sxid.parse_sxid_line(text) is None and decoders.load("sxid").fault(text) is None


def test_a_line_without_a_link_has_none() -> None:
    parsed = sxid.parse_sxid_line(line(10004, "Non-fatal", rest="thermal event start"))
    assert parsed is not None and parsed.link is None and parsed.switch == "nvswitch1"


@budget(200)
@given(
    n=st.one_of(st.sampled_from(sorted(sxid.catalogued_sxids())), st.integers(0, 99999)),
    fatal=st.booleans(),
    rest=st.text(max_size=80),
)
def test_the_number_and_word_decide_whatever_follows(n: int, fatal: bool, rest: str) -> None:
    """The text after the word (the driver's, but free-form) never changes code, component or
    severity; fault() and finding() agree."""
    decoder = decoders.load("sxid")
    text = line(n, "Fatal" if fatal else "Non-fatal", rest=rest)
    fault = decoder.fault(text)
    expected = sxid.verdict(n, fatal)
    assert fault == (expected[0], "nvswitch:0000:06:00.0", expected[1])
    finding = decoder.finding(text, {}, "kernel_log", 0.0)
    assert (finding.code, finding.component, finding.severity) == fault
    assert finding.details["sxid"] == n and finding.details["sxid_fatal"] is fatal
    assert expected[0] in decoder.codes()
