"""Storm rules (N matches for one component within a window) and clearing rules (a line saying the
fault is over): in the matcher, the health model and the catalogue."""

from __future__ import annotations

from typing import Optional

import pytest

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Finding, Severity
from hma.health.model import HealthModel
from hma.probes.kernel_log.rules import RuleSet, compile_rule

CAT = load_builtin()
RULES = RuleSet.load(None)
CORRECTED = (
    "{drv} {pci}: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
)


def corrected(pci: str = "0000:3b:00.0", drv: str = "nvidia") -> str:
    return CORRECTED.format(drv=drv, pci=pci)


def feed_at(times: list[Optional[float]], line: str) -> list[Optional[Finding]]:
    matcher = RULES.matcher("t")
    return [matcher.feed(line, 0.0, None, at) for at in times]


def test_a_corrected_error_storm_raises_on_the_tenth_within_a_minute() -> None:
    got = feed_at([float(i) for i in range(12)], corrected())
    assert [i for i, f in enumerate(got) if f is not None] == [9]  # then the count starts again
    f = got[9]
    assert f is not None and f.code == "KERNEL_AER_CORRECTED_STORM"
    assert f.component == "gpu:0000:3b:00"
    assert (f.details["storm_count"], f.details["storm_window_s"]) == (10, 60.0)


def test_corrected_errors_spread_out_are_no_storm() -> None:
    assert not any(feed_at([i * 7.0 for i in range(40)], corrected()))  # 9 per minute at most


def test_sata_link_resets_are_a_storm_only_when_three_come_within_ten_minutes() -> None:
    line = "ata3: hard resetting link"
    got = feed_at([0.0, 5.0, 10.0], line)  # a link that keeps failing
    assert [f is not None for f in got] == [False, False, True]
    f = got[2]
    assert f is not None and (f.code, f.component) == ("KERNEL_ATA_ERROR", "disk:ata3")
    assert not any(feed_at([0.0, 400.0, 800.0, 1200.0], line))  # one now and then: routine
    # a link reset behind a port multiplier counts for its port
    assert feed_at([0.0, 1.0, 2.0], "ata1.15: hard resetting link")[2] is not None


def test_without_times_the_count_alone_makes_the_storm() -> None:
    got = feed_at([None] * 10, corrected())
    assert [f is not None for f in got] == [False] * 9 + [True]


def test_storms_are_counted_per_component() -> None:
    matcher = RULES.matcher("t")
    lines = [corrected(f"0000:{i % 2 + 1:02x}:00.0", "mlx5_core") for i in range(19)]
    got = [matcher.feed(line, 0.0, None, float(i)) for i, line in enumerate(lines)]
    assert [f.component for f in got if f] == ["nic:0000:01:00.0"]  # 10 on 01, 9 on 02


def test_the_time_is_only_computed_when_a_storm_rule_matches() -> None:
    calls: list[int] = []

    def at() -> float:
        calls.append(1)
        return 1.0

    matcher = RULES.matcher("t")
    matcher.feed("NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, fell", 0.0, None, at)
    matcher.feed("usb 1-1: new device", 0.0, None, at)
    assert calls == []
    matcher.feed(corrected(), 0.0, None, at)
    assert calls == [1]


@pytest.mark.parametrize(
    ("line", "component", "severity"),
    [
        ("nfs: server fs1 not responding, still trying", "nfs:fs1", None),
        ("nfs: server fs1 OK", "nfs:fs1", Severity.OK),
        ("lockd: server 10.0.0.2 not responding, timed out", "nfs:10.0.0.2", None),
    ],
)
def test_nfs_lines_raise_and_clear(line: str, component: str, severity: Severity) -> None:
    f = RULES.matcher("t").feed(line)
    assert f is not None and (f.code, f.component) == ("KERNEL_NFS_NOT_RESPONDING", component)
    assert f.severity is severity


def test_an_ok_line_clears_the_fault_in_the_health_model() -> None:
    model = HealthModel(CAT, "b")
    matcher = RULES.matcher("kernel_log")
    down = CAT.resolve(matcher.feed("nfs: server fs1 not responding, still trying"))
    other = CAT.resolve(matcher.feed("nfs: server fs2 not responding, still trying"))
    model.observe_event(down, 1.0)
    model.observe_event(other, 1.0)
    assert {f.component for f in model.verdict(1.0).faults} == {"nfs:fs1", "nfs:fs2"}
    ok = CAT.resolve(matcher.feed("nfs: server fs1 OK"))
    verdict = model.observe_event(ok, 2.0)
    assert [(t.kind, t.fault.component) for t in verdict.transitions] == [("cleared", "nfs:fs1")]
    assert {f.component for f in verdict.faults} == {"nfs:fs2"}
    assert model.observe_event(ok, 3.0).transitions == ()  # nothing left to clear


def test_an_operator_severity_override_does_not_turn_a_clearing_line_into_a_fault() -> None:
    cat = CAT.with_overrides({"KERNEL_NFS_NOT_RESPONDING": {"severity": "critical"}})
    ok = RULES.matcher("t").feed("nfs: server fs1 OK")
    down = RULES.matcher("t").feed("nfs: server fs1 not responding, still trying")
    assert ok is not None and down is not None
    assert cat.resolve(ok).severity is Severity.OK
    assert cat.resolve(down).severity is Severity.CRITICAL


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"count": 5}, "count and window_s go together"),
        ({"window_s": 10}, "count and window_s go together"),
        ({"count": 0, "window_s": 1}, "count"),
        ({"count": True, "window_s": 1}, "count"),
        ({"count": 3, "window_s": -1}, "window_s"),
        ({"clears": "yes"}, "clears"),
        ({"clears": True, "count": 2, "window_s": 5}, "clears"),
    ],
)
def test_bad_storm_or_clear_keys_are_rejected(extra: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        compile_rule({"name": "x", "pattern": "a", "code": "SITE_X", **extra}, "site.toml")


def test_every_new_code_names_its_source() -> None:
    for rule in RULES.rules:
        if rule.origin != "neuron.toml" and rule.kind == "code":
            entry = CAT.get(rule.code)
            assert entry is not None and entry.source, rule.code


def test_explain_and_the_catalogue_document_show_the_source() -> None:
    from hma.commands.docs import catalogue_md
    from hma.contracts.catalogue import explain

    entry = CAT.entry("KERNEL_FS_READONLY")
    assert "Source: fs/ext4/super.c ext4_handle_error()" in explain(entry)
    assert "  Source:" not in explain(CAT.entry("SYS_FS_READONLY"))  # no source: no line
    doc = catalogue_md()
    sources = doc[doc.index("## Sources") :]
    assert "| `KERNEL_SXID_FATAL` | open-gpu-kernel-modules" in sources
