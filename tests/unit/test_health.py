"""Table tests of the pure health model."""

from __future__ import annotations

from typing import Optional

import pytest

from hma.contracts.catalogue import Catalogue, load_builtin
from hma.contracts.model import Action, Finding, ProbeRun, RunStatus, Severity
from hma.health.model import HealthModel

CAT = load_builtin()


def run(probe: str, *findings: Finding, status: RunStatus = RunStatus.RAN) -> ProbeRun:
    return ProbeRun(
        probe, status, 0.0, 0.0, tuple(CAT.resolve_all([f.with_(probe=probe) for f in findings]))
    )


def fs_full(comp: str = "node", sev: Optional[Severity] = None) -> Finding:
    return Finding("SYS_FS_FULL", comp, "full", {"path": "/"}, severity=sev)


@pytest.mark.parametrize(
    "sequence, active_after",
    [
        # (findings present in each completed run?) -> active after each step; SYS_FS_FULL has
        # fail_after 2 and clear_after 2 (catalogue defaults)
        ([True], [False]),
        ([True, True], [False, True]),
        ([True, False, True], [False, False, False]),
        ([True, True, False], [False, True, True]),
        ([True, True, False, False], [False, True, True, False]),
        ([True, True, False, True, False, False], [False, True, True, True, True, False]),
    ],
)
def test_hysteresis(sequence: list[bool], active_after: list[bool]) -> None:
    model = HealthModel(CAT, "boot1")
    for step, (bad, want) in enumerate(zip(sequence, active_after)):
        verdict = model.observe_run(run("system", fs_full()) if bad else run("system"), step)
        assert (len(verdict.faults) == 1) == want, f"step {step}"


def test_fatal_code_acts_on_first_observation() -> None:
    model = HealthModel(CAT, "b")
    verdict = model.observe_run(run("system", Finding("SYS_MEM_ECC_UE", "node:edac/mc0", "ue")), 1)
    assert [t.kind for t in verdict.transitions] == ["raised"]
    assert verdict.action is Action.REPLACE and verdict.draining


def test_unknown_never_drains_and_keeps_known_fault() -> None:
    model = HealthModel(CAT, "b")
    model.observe_run(run("system", fs_full()), 1)
    model.observe_run(run("system", fs_full()), 2)
    # The probe times out: no good observation, the fault persists.
    timeout = Finding("HMA_PROBE_TIMEOUT", "probe:system", "t")
    verdict = model.observe_run(run("system", timeout, status=RunStatus.TIMED_OUT), 3)
    codes = {f.code: f for f in verdict.faults}
    assert set(codes) == {"SYS_FS_FULL", "HMA_PROBE_TIMEOUT"}
    assert codes["HMA_PROBE_TIMEOUT"].severity is Severity.UNKNOWN
    assert not codes["HMA_PROBE_TIMEOUT"].draining
    assert [f.code for f in verdict.draining] == ["SYS_FS_FULL"]
    # An unknown reading of the same key neither clears nor grows the fault.
    verdict = model.observe_run(run("system", fs_full(sev=Severity.UNKNOWN)), 4)
    assert {f.code for f in verdict.faults} == {"SYS_FS_FULL"}
    assert verdict.faults[0].severity is Severity.CRITICAL


def test_unknown_alone_never_drains() -> None:
    model = HealthModel(CAT, "b")
    verdict = model.observe_run(run("system", fs_full(sev=Severity.UNKNOWN)), 1)
    assert verdict.severity is Severity.UNKNOWN
    assert verdict.draining == () and verdict.action is Action.NONE


def test_incomplete_run_is_not_a_good_observation() -> None:
    model = HealthModel(CAT, "b")
    model.observe_run(run("system", fs_full()), 1)
    model.observe_run(run("system", fs_full()), 2)
    for t in range(3, 8):
        verdict = model.observe_run(run("system", status=RunStatus.FAILED), t)
    assert [f.code for f in verdict.faults] == ["SYS_FS_FULL"]


def test_escalation_transition() -> None:
    model = HealthModel(CAT, "b")
    warn = Finding("SYS_FS_FULL", "node", "w", severity=Severity.WARNING)
    model.observe_run(run("system", warn), 1)
    model.observe_run(run("system", warn), 2)
    verdict = model.observe_run(run("system", fs_full()), 3)
    assert [t.kind for t in verdict.transitions] == ["escalated"]
    assert verdict.faults[0].severity is Severity.CRITICAL


def test_reboot_clears_reboot_codes_only() -> None:
    model = HealthModel(CAT, "boot1")
    model.observe_event(Finding("SYS_MEM_ECC_UE", "node:edac/mc0", "ue", probe="system"), 1)
    model.observe_run(run("system", fs_full()), 1)
    model.observe_run(run("system", fs_full()), 2)
    verdict = model.new_boot("boot2", 10)
    assert [t.fault.code for t in verdict.transitions] == ["SYS_MEM_ECC_UE"]
    assert [f.code for f in verdict.faults] == ["SYS_FS_FULL"]


def test_operator_and_window_clears() -> None:
    model = HealthModel(CAT, "b")
    model.observe_event(Finding("HMA_STATE_RESET", "agent", "reset", probe="agent"), 1)
    model.observe_event(Finding("HMA_CONFIG_RELOAD_FAILED", "agent", "bad", probe="agent"), 1)
    assert model.tick(100).transitions == ()
    cleared = model.tick(1 + 3600)
    assert [t.fault.code for t in cleared.transitions] == ["HMA_CONFIG_RELOAD_FAILED"]
    assert [f.code for f in cleared.faults] == ["HMA_STATE_RESET"]
    assert model.ack("HMA_STATE_RESET", None, 2000, "alice").faults == ()


def test_operator_overrides_win() -> None:
    cat = CAT.with_overrides({"SYS_FS_FULL": {"severity": "warning", "fail_after": 1}})
    model = HealthModel(cat, "b")
    finding = cat.resolve_all([Finding("SYS_FS_FULL", "node", "f", probe="system")])[0]
    verdict = model.observe_run(ProbeRun("system", RunStatus.RAN, 0, 0, (finding,)), 1)
    assert verdict.faults[0].severity is Severity.WARNING
    assert verdict.draining == ()


def test_disabled_code_is_dropped() -> None:
    cat: Catalogue = CAT.with_overrides({"SYS_FS_FULL": {"enabled": False}})
    assert cat.resolve_all([Finding("SYS_FS_FULL", "node", "f")]) == []


def test_uncatalogued_code_becomes_unknown() -> None:
    [f] = CAT.resolve_all([Finding("SYS_NOT_A_CODE", "node", "x")])
    assert f.code == "HMA_UNCATALOGUED" and f.severity is Severity.UNKNOWN
    assert f.details["uncatalogued_code"] == "SYS_NOT_A_CODE"


def test_records_round_trip() -> None:
    model = HealthModel(CAT, "b")
    model.observe_run(run("system", fs_full()), 1)
    model.observe_run(run("system", fs_full()), 2)
    again = HealthModel(CAT, "b", model.records())
    assert again.verdict(3).faults == model.verdict(3).faults
