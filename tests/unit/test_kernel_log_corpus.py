"""The kernel-log rules over public captures: every line of the fault corpus gives exactly the
code, severity and component its expectations file names (and every other line nothing); the
healthy corpus (real boots of GPU and other servers) gives no finding at all; each rule is
exercised by the corpus."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from hma.commands import logscan
from hma.contracts.catalogue import load_builtin
from hma.probes.kernel_log.lines import saved_line
from hma.probes.kernel_log.rules import RuleSet

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "kernel-log" / "corpus"
FAULTS = sorted((CORPUS / "faults").glob("*.log"))
HEALTHY = sorted(p for p in (CORPUS / "healthy").iterdir() if not p.name.endswith(".src.txt"))
RULES = RuleSet.load(None)
CATALOGUE = load_builtin()


def _expected() -> dict[str, dict[int, tuple[str, str, str]]]:
    out: dict[str, dict[int, tuple[str, str, str]]] = {}
    with open(CORPUS / "faults" / "expected.tsv", encoding="utf-8") as fh:
        for row in csv.reader((r for r in fh if not r.startswith("#")), delimiter="\t"):
            name, line, code, severity, component = row
            out.setdefault(name, {})[int(line)] = (code, severity, component)
    return out


EXPECTED = _expected()


def _per_line(path: Path) -> dict[int, tuple[str, str, str]]:
    """(code, severity, component) of every line of ``path`` that raised something, through
    ``hma logscan``'s own scan (catalogue-resolved, as `hma logscan` reports it)."""
    got: dict[int, tuple[str, str, str]] = {}

    def each(_path: str, lineno: int, finding: object) -> None:
        # a counted code (docs/policy.md) is reported below its threshold, as logscan does
        resolved = CATALOGUE.at_count(CATALOGUE.resolve(finding), 1)  # type: ignore[arg-type]
        assert lineno not in got
        got[lineno] = (resolved.code, str(resolved.severity), resolved.component)

    _hits, errors = logscan.scan([str(path)], RULES, None, each)
    assert errors == []
    return got


def test_every_corpus_file_has_provenance_and_expectations() -> None:
    for path in [*FAULTS, *HEALTHY]:
        assert path.with_name(path.name + ".src.txt").is_file(), path
    assert set(EXPECTED) <= {p.name for p in FAULTS}


@pytest.mark.parametrize("path", FAULTS, ids=lambda p: p.name)
def test_each_line_gives_exactly_its_expected_finding(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    expected = EXPECTED.get(path.name, {})
    assert all(1 <= n <= len(lines) for n in expected)
    assert _per_line(path) == expected


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.name)
def test_healthy_captures_give_no_finding(path: Path) -> None:
    hits, errors = logscan.scan([str(path)], RULES)
    assert errors == [] and hits == []
    # and they were read as kernel messages (not skipped as another shape): all but the
    # user-space `systemd[1]: ` records (and `IOAPIC[0]: `, which looks alike) and the
    # indented continuation lines
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        messages = [saved_line(line)[1] for line in fh if line.strip()]
    assert sum(m is not None for m in messages) > 0.9 * len(messages) > 1000


def test_the_corpus_exercises_every_rule() -> None:
    fired: set[str] = set()
    for path in FAULTS:
        fired |= {f[0] for f in _per_line(path).values()}
    codes = {r.code for r in RULES.rules if r.kind == "code"}
    assert codes - fired <= {"NEURON_KERNEL_HW_ERROR", "KERNEL_MCE_HW_ERROR"}  # own fixtures


def test_a_cleared_fault_is_reported_cleared() -> None:
    hits, errors = logscan.scan([str(CORPUS / "faults" / "nfs.log")], RULES)
    doc = logscan.document(hits, errors, CATALOGUE)
    by_key = {(f["component"], f["severity"]): f for f in doc["findings"]}
    cleared = by_key[("nfs:10.66.16.116", "ok")]  # four `not responding`, then `OK`
    assert cleared["details"]["count"] == 4 and "cleared_line" in cleared["details"]
    assert ("nfs:10.66.16.116", "warning") not in by_key
    assert ("nfs:7.247.192.16", "ok") in by_key
    assert by_key[("nfs:10.0.0.5", "warning")]["details"]["count"] == 1  # never cleared
    assert doc["severity"] == "warning"
    text = logscan.render_text(doc)
    assert "cleared at " in text and "nfs: server 10.66.16.116 OK" in text


@pytest.mark.parametrize("path", FAULTS, ids=lambda p: p.name)
def test_the_fault_a_match_names_is_its_findings(path: Path) -> None:
    # `hma logscan` counts a repeat by the match's (code, component, severity) without building
    # its finding: they must be the finding's own
    matcher = RULES.matcher("t")
    matched = 0
    lines = path.read_text(encoding="utf-8").splitlines()
    for line in lines:
        message = saved_line(line)[1]
        match = matcher.match(message) if message is not None else None
        if match is None:
            continue
        finding = match.finding({"file": "f"})
        assert (match.code, match.component, match.severity) == (
            finding.code,
            finding.component,
            finding.severity,
        )
        assert finding.details["file"] == "f"
        matched += 1
    # a record's indented line is read with its first line (logscan's context), not alone here
    alone = [n for n in EXPECTED.get(path.name, {}) if lines[n - 1][:1] != " "]
    assert matched >= len(alone)
