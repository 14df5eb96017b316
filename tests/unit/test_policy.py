"""Per-code policy in the pure health model: N occurrences within T, per component or per node,
and observe (shadow) mode; its configuration and the state store that keeps the window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hma.config.files import ConfigError
from hma.config.schema import validate
from hma.contracts.catalogue import CatalogueError, load_builtin, parse_entry
from hma.contracts.model import Action, Finding, ProbeRun, RunStatus, Severity
from hma.contracts.options import parse_duration
from hma.health.model import MERGE_S, HealthModel
from hma.health.records import load_occurrences, save_occurrences
from hma.health.store import Store
from hma.probes.nvidia.xid import xid_finding

GPU3, GPU4, GPU5 = "0000:3b:00", "0000:5d:00", "0000:86:00"
HOUR = 3600.0


def catalogue(**codes: dict[str, Any]) -> Any:
    """The built-in catalogue with ``[codes.X]`` overrides (validated like a config file)."""
    return load_builtin().with_overrides(codes)


XID13 = {"after": 3, "within": "1h", "severity": "critical", "action": "reboot"}


def xid(cat: Any, n: int, pci: str, source: str = "kernel_log") -> Finding:
    (found,) = cat.resolve_all([xid_finding(n, pci, {}, source).with_(probe=source)])
    return found


def test_below_the_count_a_warning_that_never_drains_then_promoted() -> None:
    cat = catalogue(GPU_XID_13=XID13)
    model = HealthModel(cat, "b")
    first = model.observe_event(xid(cat, 13, GPU3), 100.0)
    (fault,) = first.faults
    assert fault.severity is Severity.WARNING and fault.action is Action.NONE
    assert first.draining == () and first.action is Action.NONE
    assert [t.kind for t in first.transitions] == ["raised"]
    assert first.transitions[0].reason.startswith("1 of 3 occurrences within 1 h")
    assert fault.threshold is not None and fault.threshold["reached"] is False
    assert model.observe_event(xid(cat, 13, GPU3), 200.0).draining == ()
    third = model.observe_event(xid(cat, 13, GPU3), 300.0)
    assert [t.kind for t in third.transitions] == ["escalated"]
    (fault,) = third.draining
    assert (fault.severity, fault.action) == (Severity.CRITICAL, Action.REBOOT)
    assert fault.component == "gpu:0000:3b:00" and fault.count == 3
    assert fault.threshold is not None and fault.threshold["reached"] is True
    assert fault.to_json()["threshold"]["occurrences"] == 3


def test_once_on_each_of_three_gpus_is_not_a_repeat() -> None:
    cat = catalogue(GPU_XID_13=XID13)
    model = HealthModel(cat, "b")
    for i, pci in enumerate((GPU3, GPU4, GPU5)):
        verdict = model.observe_event(xid(cat, 13, pci), 100.0 + i)
    assert len(verdict.faults) == 3 and verdict.draining == ()
    assert {f.severity for f in verdict.faults} == {Severity.WARNING}


def test_per_node_counts_every_component_together() -> None:
    cat = catalogue(GPU_XID_13={**XID13, "per": "node"})
    model = HealthModel(cat, "b")
    model.observe_event(xid(cat, 13, GPU3), 100.0)
    model.observe_event(xid(cat, 13, GPU4), 101.0)
    verdict = model.observe_event(xid(cat, 13, GPU5), 102.0)
    (fault,) = verdict.draining
    assert fault.component == "gpu:0000:86:00"
    assert fault.threshold is not None and fault.threshold["per"] == "node"


def test_occurrences_outside_the_window_do_not_count() -> None:
    cat = catalogue(GPU_XID_13=XID13)
    model = HealthModel(cat, "b")
    model.observe_event(xid(cat, 13, GPU3), 0.0)
    model.observe_event(xid(cat, 13, GPU3), 0.5 * HOUR)
    verdict = model.observe_event(xid(cat, 13, GPU3), 1.2 * HOUR)  # the first one aged out
    assert verdict.draining == ()
    verdict = model.observe_event(xid(cat, 13, GPU3), 1.3 * HOUR)
    assert len(verdict.draining) == 1


def test_one_event_through_two_sources_is_one_occurrence() -> None:
    cat = catalogue(GPU_XID_13=XID13)
    model = HealthModel(cat, "b")
    model.observe_event(xid(cat, 13, GPU3, "nvml_events"), 100.0)
    model.observe_event(xid(cat, 13, GPU3, "kernel_log"), 100.0 + MERGE_S / 2)
    verdict = model.observe_event(xid(cat, 13, GPU3, "nvml_events"), 200.0)
    assert verdict.draining == ()  # 2 occurrences, not 3
    (fault,) = verdict.faults
    assert fault.threshold is not None and fault.threshold["occurrences"] == 2


def test_watching_fault_clears_when_it_stops_recurring_but_the_count_remains() -> None:
    cat = catalogue(GPU_XID_13={**XID13, "within": "2h"})  # window_s (1 h) shows the warning
    model = HealthModel(cat, "b")
    model.observe_event(xid(cat, 13, GPU3), 0.0)
    model.observe_event(xid(cat, 13, GPU3), 10.0)
    cleared = model.tick(10.0 + HOUR)
    assert [t.kind for t in cleared.transitions] == ["cleared"] and cleared.faults == ()
    again = model.observe_event(xid(cat, 13, GPU3), 1.5 * HOUR)  # third within 2 h
    assert len(again.draining) == 1
    assert [t.kind for t in again.transitions] == ["raised"]


def test_promoted_fault_clears_as_its_code_says_and_occurrences_expire() -> None:
    cat = catalogue(GPU_XID_13=XID13)
    model = HealthModel(cat, "b")
    for t in (0.0, 1.0, 2.0):
        model.observe_event(xid(cat, 13, GPU3), t * 20)
    assert model.tick(5 * HOUR).draining  # promoted: clears by reboot, not by time
    assert model.occurrences() == {}  # the window is over: nothing kept
    assert model.new_boot("b2", 5 * HOUR).faults == ()


def test_polled_findings_count_each_run_that_reports_them() -> None:
    cat = catalogue(SYS_FS_FULL={"after": 3, "within": 600})
    model = HealthModel(cat, "b")

    def observe(bad: bool, t: float) -> Any:
        found = cat.resolve_all([Finding("SYS_FS_FULL", "node", "full", probe="system")])
        return model.observe_run(
            ProbeRun("system", RunStatus.RAN, t, 0.0, tuple(found) if bad else ()), t
        )

    assert observe(True, 0).faults[0].severity is Severity.WARNING
    assert observe(False, 60).faults  # one good observation: still shown (clear_after 2)
    assert observe(False, 120).faults == ()  # cleared by observation
    assert observe(True, 180).draining == ()  # 2 in 10 min: flapping is remembered
    assert len(observe(True, 240).draining) == 1


def test_unknown_is_not_an_occurrence() -> None:
    cat = catalogue(SYS_FS_FULL={"after": 2, "within": 600})
    model = HealthModel(cat, "b")
    unknown = Finding("SYS_FS_FULL", "node", "?", severity=Severity.UNKNOWN, probe="system")
    (found,) = cat.resolve_all([unknown])
    model.observe_run(ProbeRun("system", RunStatus.RAN, 0, 0, (found,)), 0)
    assert model.occurrences() == {}


def test_observe_mode_decides_but_nothing_can_act() -> None:
    cat = catalogue(GPU_XID_79={"mode": "observe"})
    model = HealthModel(cat, "b")
    verdict = model.observe_event(xid(cat, 79, GPU3), 1.0)
    (fault,) = verdict.faults
    assert fault.observe and fault.would == "reboot"
    assert fault.severity is Severity.WARNING and fault.action is Action.NONE
    assert verdict.draining == () and verdict.action is Action.NONE
    assert verdict.severity is Severity.WARNING
    assert fault.to_json()["would"] == "reboot" and fault.to_json()["observe"] is True
    # the decision itself is kept: back to act mode, the same record drains
    acting = HealthModel(load_builtin(), "b", model.records())
    assert len(acting.verdict(2.0).draining) == 1


def test_observe_mode_with_a_count_would_act_only_at_the_count() -> None:
    cat = catalogue(GPU_XID_13={**XID13, "mode": "observe", "action": "none"})
    model = HealthModel(cat, "b")
    first = model.observe_event(xid(cat, 13, GPU3), 1.0)
    assert first.faults[0].would == ""
    model.observe_event(xid(cat, 13, GPU3), 20.0)
    third = model.observe_event(xid(cat, 13, GPU3), 40.0)
    assert third.faults[0].would == "drain" and third.draining == ()
    assert [t.kind for t in third.transitions] == ["escalated"]


def test_records_of_an_older_agent_load_and_default() -> None:
    model = HealthModel(load_builtin(), "b")
    model.observe_event(xid(load_builtin(), 79, GPU3), 1.0)
    (rec,) = model.records()
    old = rec.to_json()
    del old["watching"]
    assert type(rec).from_json(old).watching is False


def test_store_keeps_occurrences_across_a_restart(tmp_path: Path) -> None:
    cat = catalogue(GPU_XID_13=XID13)
    path = str(tmp_path / "state.db")
    store = Store(path)
    model = HealthModel(cat, "b")
    for t in (1.0, 30.0):
        model.observe_event(xid(cat, 13, GPU3), t)
    save_occurrences(store, sorted(model.changed_occurrences), model.occurrences())
    store.close()
    again, bad = load_occurrences(Store(path))
    assert bad == [] and again == model.occurrences()
    restarted = HealthModel(cat, "b", model.records(), again)
    assert len(restarted.observe_event(xid(cat, 13, GPU3), 60.0).draining) == 1


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("30m", 1800), ("1h", 3600), ("1h30m", 5400), ("7d", 604800), (45, 45)],
)
def test_durations(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["an hour", "1 h", "h", "", "1y", "-1h", True])
def test_bad_durations(text: Any) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    "table, problem",
    [
        ({"after": 0, "within": "1h"}, "codes.GPU_XID_13.after: must be >= 1"),
        ({"after": -3, "within": "1h"}, "codes.GPU_XID_13.after: must be >= 1"),
        ({"after": 3, "within": "soon"}, "codes.GPU_XID_13.within: expected seconds or a"),
        ({"after": 3, "within": 0}, "codes.GPU_XID_13.within: must be > 0"),
        ({"mode": "bogus"}, "codes.GPU_XID_13.mode: expected one of 'act', 'observe'"),
        ({"mode": "obsrve"}, "(did you mean 'observe'?)"),
        ({"per": "gpu"}, "codes.GPU_XID_13.per: expected one of 'component', 'node'"),
        ({"aftr": 3}, "codes.GPU_XID_13.aftr: unknown key (did you mean 'after'?)"),
        ({"after": 3}, "codes.SYS_FS_FULL.within: required with after = 3"),
    ],
)
def test_config_errors(table: dict[str, Any], problem: str) -> None:
    from hma.commands.docs import schema

    code = "SYS_FS_FULL" if problem.startswith("codes.SYS_FS_FULL") else "GPU_XID_13"
    with pytest.raises(ConfigError) as err:
        validate({"codes": {code: table}}, schema())
    assert any(problem in e for e in err.value.errors), err.value.errors


def test_config_accepts_a_policy_and_the_catalogue_applies_it() -> None:
    from hma.commands.docs import schema

    table = {"after": 3, "within": "1h", "per": "node", "mode": "observe"}
    config = validate({"codes": {"GPU_XID_13": table}}, schema())
    entry = load_builtin().with_overrides(config.codes).entry("GPU_XID_13")
    assert (entry.after, entry.within, entry.per, entry.mode) == (3, 3600.0, "node", "observe")


def test_site_codes_declare_a_policy_and_bad_ones_are_refused() -> None:
    base = {"summary": "s", "remedy": "r", "severity": "critical", "action": "reboot"}
    entry = parse_entry("SITE_X", {**base, "clears": "reboot", "after": 2, "within": "10m"})
    assert entry.counted and entry.within == 600
    with pytest.raises(CatalogueError, match="SITE_X.within: required"):
        parse_entry("SITE_X", {**base, "clears": "reboot", "after": 2})
    with pytest.raises(CatalogueError, match="SITE_X.mode"):
        parse_entry("SITE_X", {**base, "clears": "reboot", "mode": "shadow"})


def test_pipeline_keeps_the_window_across_a_restart_and_alerts_would(hma_env: Any) -> None:
    from hma import assembly
    from hma.contracts.alert import Alert
    from hma.health.pipeline import Pipeline
    from hma.reporters import journal

    hma_env.write(
        '[codes.GPU_XID_13]\nafter = 3\nwithin = "1h"\n[codes.GPU_XID_79]\nmode = "observe"\n'
    )
    setup = assembly.load(str(hma_env.config))
    path = str(hma_env.state / "state.db")
    alerts: list[Alert] = []
    for t in (100.0, 200.0):  # one daemon life per occurrence
        store = Store(path, memory=True)
        try:
            Pipeline(setup, store, "boot-a", alerts.append).event(xid(setup.catalogue, 13, GPU3), t)
        finally:
            store.close()
    store = Store(path, memory=True)
    try:
        pipeline = Pipeline(setup, store, "boot-a", alerts.append)
        (third,) = pipeline.event(xid(setup.catalogue, 13, GPU3), 300.0)
        assert len(third.verdict.draining) == 1
        (observed,) = pipeline.event(xid(setup.catalogue, 79, GPU4), 301.0)
        (fault,) = [f for f in observed.verdict.faults if f.code == "GPU_XID_79"]
        assert fault.would == "reboot" and fault.observe
        assert [f.code for f in observed.verdict.draining] == ["GPU_XID_13"]
    finally:
        store.close()
    assert [(a.kind, a.code) for a in alerts] == [
        ("raised", "GPU_XID_13"),
        ("escalated", "GPU_XID_13"),
        ("raised", "GPU_XID_79"),
    ]
    fields = dict(journal.fields(alerts[-1]))
    assert fields["HMA_MODE"] == "observe" and fields["HMA_WOULD"] == "reboot"
    assert fields["HMA_SEVERITY"] == "warning" and fields["PRIORITY"] == str(journal.WARNING)
    assert "observe mode, would reboot: " in fields["MESSAGE"]
    assert "HMA_MODE" not in journal.decode(journal.encode(journal.fields(alerts[0])))


def test_status_and_metrics_show_the_count_and_observe_mode() -> None:
    from hma.commands import status
    from hma.reporters import prometheus

    cat = catalogue(GPU_XID_13=XID13, GPU_XID_79={"mode": "observe"})
    model = HealthModel(cat, "b")
    model.observe_event(xid(cat, 13, GPU3), 1.0)
    verdict = model.observe_event(xid(cat, 79, GPU4), 2.0)
    doc = {
        "node": "n1",
        "severity": str(verdict.severity),
        "action": str(verdict.action),
        "faults": [f.to_json() for f in verdict.faults],
    }
    text = status.render(doc, now=3.0)
    assert "below its threshold: 1 of 3 within 60 min on this component" in text
    assert "observe mode: would reboot, never acted on" in text
    assert status.exit_code(doc) == 1  # warnings: nothing is critical yet
    rows = prometheus.samples(doc)["hma_findings_observed"]
    assert rows == [({"code": "GPU_XID_79", "component": "gpu:0000:5d:00", "would": "reboot"}, 1.0)]


def test_a_gpu_reset_keeps_the_counts_of_counted_codes(hma_env: Any) -> None:
    from hma import assembly
    from hma.health.pipeline import Pipeline

    hma_env.write('[codes.GPU_XID_13]\nafter = 3\nwithin = "1h"\n')
    setup = assembly.load(str(hma_env.config))
    store = Store(str(hma_env.state / "state.db"))
    try:
        pipeline = Pipeline(setup, store, "boot-a", lambda _alert: None)
        pipeline.event(xid(setup.catalogue, 13, GPU3), 100.0)
        pipeline.event(xid(setup.catalogue, 13, GPU3), 200.0)
        pipeline.event(xid(setup.catalogue, 109, GPU3), 210.0)  # a reset clears Xid 109
        cleared = pipeline.gpu_reset("gpu:0000:3b:00", 220.0, 230.0)
        assert [f.code for f in cleared.verdict.faults] == ["GPU_XID_13"]
        (third,) = pipeline.event(xid(setup.catalogue, 13, GPU3), 300.0)
        assert [f.code for f in third.verdict.draining] == ["GPU_XID_13"]
        assert load_occurrences(store)[0] == pipeline.model.occurrences()
    finally:
        store.close()


def test_logscan_shows_a_burst_of_a_counted_code_as_a_warning() -> None:
    from hma.commands import logscan

    cat = load_builtin()
    burst = logscan.Hit(xid_finding(13, GPU3, {}, "logscan"), count=6)
    (found,) = logscan.document([burst], [], cat)["findings"]
    assert (found["severity"], found["action"], found["details"]["count"]) == ("warning", "none", 6)
    (fatal,) = logscan.document([logscan.Hit(xid_finding(79, GPU3))], [], cat)["findings"]
    assert fatal["severity"] == "critical"
