"""The daemon's parts on their own: the probe scheduler, the event sources' supervisor, the
loop's housekeeping, operator requests and the status document built from a snapshot."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from hma.contracts.model import Finding, ProbeRun, RunStatus
from hma.contracts.source import MemoryKV
from hma.daemon.housekeeping import STATE_PROBE, Housekeeping
from hma.daemon.operator import OperatorRequests
from hma.detection.scheduler import UNSUPPORTED_RECHECK_S, ProbeState, Scheduler
from hma.detection.setup import Setup
from hma.detection.sources import SourceSupervisor
from hma.health import requests
from hma.health.store import Store
from hma.reporters import statusfile
from hma.reporters.status import ProbeStatus, Snapshot, StatusReporter, document, status_line

pytestmark = pytest.mark.timeout(60)

NOW = 1_800_000_000.0


# --- the status document ------------------------------------------------------------------------

RAN = ProbeRun("gpu", RunStatus.RAN, NOW - 3, 0.123456, (Finding("C", "gpu:0", "m", {}),))


@pytest.mark.parametrize(
    ("last", "status", "last_run", "duration_s", "findings"),
    [
        (None, "pending", None, None, 0),
        (RAN, "ran", NOW - 3, 0.1235, 1),
        (ProbeRun("gpu", RunStatus.FAILED, NOW, 1.0, (), "boom"), "failed", NOW, 1.0, 0),
    ],
)
def test_a_probe_line_of_the_document(
    last: Optional[ProbeRun], status: str, last_run: Any, duration_s: Any, findings: int
) -> None:
    line = ProbeStatus("gpu", last, NOW + 29.96, {"domain": "d"}).to_json()
    assert line == {
        "name": "gpu",
        "status": status,
        "last_run": last_run,
        "duration_s": duration_s,
        "next_run": round(NOW + 29.96, 1),
        "error": last.error if last else "",
        "findings": findings,
        "summary": {"domain": "d"},
    }


def _snapshot(maintenance: Optional[dict[str, Any]]) -> Snapshot:
    return Snapshot(
        node="n1",
        boot_id="b",
        started=NOW - 60,
        generated=NOW,
        severity="critical",
        action="reboot",
        active=1,
        instance_type="p5.48xlarge",
        topology={"domain": "", "source": ""},
        probes=(ProbeStatus("gpu", None, NOW, None),),
        faults=({"code": "C"},),
        remediation={"enabled": False},
        maintenance=maintenance,
    )


@pytest.mark.parametrize(
    ("maintenance", "last_key"), [(None, "remediation"), ({"until": 1.0}, "maintenance")]
)
def test_the_document_of_a_snapshot(maintenance: Any, last_key: str) -> None:
    doc = document(_snapshot(maintenance), 15.0)
    assert list(doc)[:6] == ["schema", "version", "node", "hostname", "pid", "boot_id"]
    assert list(doc)[-1] == last_key
    assert (doc["severity"], doc["action"], doc["heartbeat_s"]) == ("critical", "reboot", 15.0)
    assert doc["faults"] == [{"code": "C"}] and doc["probes"][0]["status"] == "pending"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("ok", 0, 7), "ok: 0 active fault(s), 7 probes"),
        (("critical", 2, 1), "critical: 2 active fault(s), 1 probes"),
    ],
)
def test_the_status_line(args: tuple[str, int, int], line: str) -> None:
    assert status_line(*args) == line


def test_the_status_reporter_writes_and_publishes(tmp_path: Path) -> None:
    published: list[dict[str, Any]] = []
    reporter = SimpleNamespace(name="r", publish=published.append)
    writer = StatusReporter(tmp_path / "status.json", 15.0)
    writer.publish(_snapshot(None), [reporter])  # type: ignore[list-item]
    assert json.loads((tmp_path / "status.json").read_text()) == statusfile.bounded(published[0])
    writer.publish(_snapshot(None), [reporter])  # type: ignore[list-item]
    assert len(published) == 1 and writer.error == ""  # unchanged: not written again
    gone = StatusReporter(tmp_path / "file" / "status.json", 15.0)
    (tmp_path / "file").write_text("")
    gone.publish(_snapshot(None), [])
    assert gone.error.startswith("FileExistsError")


@pytest.mark.parametrize(
    ("configured", "on_disk", "later", "answers"),
    [
        ("p5.48xlarge", "x", "y", ["p5.48xlarge", "p5.48xlarge"]),  # the file is never read
        ("", "p5.48xlarge\n", "other\n", ["p5.48xlarge", "p5.48xlarge"]),  # read once
        ("", None, "late\n", [None, None]),  # no DMI: none later either (a reload reads again)
        ("", "\n", "late\n", [None, None]),
    ],
)
def test_the_instance_type_is_read_once_per_setup(
    tmp_path: Path, configured: str, on_disk: Optional[str], later: str, answers: list[Any]
) -> None:
    product = tmp_path / "class/dmi/id/product_name"
    product.parent.mkdir(parents=True)
    if on_disk is not None:
        product.write_text(on_disk)
    sections = {"agent": {"instance_type": configured}, "paths": {"sysfs": str(tmp_path)}}
    setup = Setup(SimpleNamespace(section=sections.__getitem__), None, {})  # type: ignore[arg-type]
    first = setup.instance_type()
    product.write_text(later)
    assert [first, setup.instance_type()] == answers


# --- the probe scheduler ------------------------------------------------------------------------


class FakeProbe:
    isolation = "thread"

    def __init__(self, stands: bool = False) -> None:
        self.unsupported_stands = stands
        self.digests = 0  # calls of summary

    def summary(self, snapshot: Any) -> Any:
        self.digests += 1
        if snapshot == "bad":
            raise ValueError("no")
        return {"seen": snapshot}


def _setup(probes: dict[str, FakeProbe], triggers: tuple[str, ...] = ()) -> Any:
    opts = {"interval": 30, "timeout": 5, "triggers": list(triggers)}
    config = SimpleNamespace(probe=lambda name: opts)
    return SimpleNamespace(probes=probes, config=config, enabled=lambda: list(probes))


def _scheduler(setup: Any, kv: Optional[MemoryKV] = None) -> Scheduler:
    return Scheduler(setup, "b", kv or MemoryKV(), time.time, lambda s, r: None, print)


@pytest.mark.parametrize(
    ("status", "stands", "event_during_run", "held"),
    [
        (RunStatus.UNSUPPORTED, True, False, True),
        (RunStatus.UNSUPPORTED, True, True, False),  # a device came: ask again at the interval
        (RunStatus.UNSUPPORTED, False, False, False),  # depends on the configuration
        (RunStatus.RAN, True, False, False),
    ],
)
def test_an_unsupported_answer_stands_only_when_the_probe_says_so(
    status: RunStatus, stands: bool, event_during_run: bool, held: bool
) -> None:
    sched = _scheduler(_setup({"p": FakeProbe(stands)}))
    state = sched.probes["p"] = ProbeState("p", None, time.monotonic() + 30)
    state.in_flight, state.device_events = True, 1
    state.dispatched_events = 0 if event_during_run else 1
    assert sched.finish(state, ProbeRun("p", status, NOW, 0.0))
    assert not state.in_flight and state.last is not None
    assert (state.next_due > time.monotonic() + UNSUPPORTED_RECHECK_S - 60) is held


def test_a_completed_run_keeps_its_snapshot_and_a_reconfigured_one_is_dropped() -> None:
    kv = MemoryKV()
    sched = _scheduler(_setup({"p": FakeProbe()}), kv)
    state = sched.probes["p"] = ProbeState("p", None, 0.0, in_flight=True)
    assert sched.finish(state, ProbeRun("p", RunStatus.RAN, NOW, 0.0, snapshot=[1]))
    assert (state.previous, state.previous_ts) == ([1], NOW)
    assert kv.get("p.previous") == {"ts": NOW, "snapshot": [1]}
    assert sched.summaries() == {"p": {"seen": [1]}}
    stale = ProbeState("p", None, 0.0, in_flight=True)  # the probe was replaced meanwhile
    assert not sched.finish(stale, ProbeRun("p", RunStatus.RAN, NOW, 0.0, snapshot=[2]))
    assert state.previous == [1] and not stale.in_flight


@pytest.mark.parametrize(
    ("previous", "summary"), [(None, None), ("bad", {"error": "ValueError: no"})]
)
def test_a_summary_never_raises(previous: Any, summary: Any) -> None:
    sched = _scheduler(_setup({"p": FakeProbe()}))
    sched.probes["p"] = ProbeState("p", None, 0.0, previous=previous)
    assert sched.summaries() == {"p": summary}


@pytest.mark.parametrize(
    ("snapshots", "digests"),
    [
        ([[1]], 1),  # asked at each status write: made once
        ([[1], [2]], 2),  # a new snapshot: made again
        ([[1], [1]], 2),  # an equal but new snapshot: made again (identity, not equality)
        (["bad"], 1),  # a raising summary: its error kept, not retried
    ],
)
def test_a_summary_is_made_once_per_snapshot(snapshots: list[Any], digests: int) -> None:
    probe = FakeProbe()
    sched = _scheduler(_setup({"p": probe}))
    state = sched.probes["p"] = ProbeState("p", None, 0.0)
    for snapshot in snapshots:
        state.in_flight = True
        assert sched.finish(state, ProbeRun("p", RunStatus.RAN, NOW, 0.0, snapshot=snapshot))
        first = sched.summaries()
        assert sched.summaries() == first
    assert probe.digests == digests


def test_dispatch_starts_what_is_due_and_says_when_the_next_is() -> None:
    sched = _scheduler(_setup({"due": FakeProbe(), "later": FakeProbe(), "busy": FakeProbe()}))
    mono = time.monotonic()
    sched.probes = {
        "due": ProbeState("due", None, mono - 1),
        "later": ProbeState("later", None, mono + 10),
        "busy": ProbeState("busy", None, mono - 1, in_flight=True),
    }
    started: list[str] = []
    sched.start = lambda state, facts: started.append(state.name)  # type: ignore[method-assign]
    facts: list[int] = []
    wait = sched.dispatch(lambda: facts.append(1) or SimpleNamespace())  # type: ignore[func-returns-value]
    assert started == ["due"] and facts == [1]
    assert 9.0 < wait <= 10.0
    assert sched.probes["due"].next_due >= mono + 30
    assert _scheduler(_setup({})).dispatch(lambda: SimpleNamespace()) == float("inf")  # type: ignore[arg-type,return-value]


def test_a_device_event_runs_only_the_interested_probes_soon() -> None:
    sched = _scheduler(_setup({"p": FakeProbe()}, triggers=("pci",)))
    state = sched.probes["p"] = ProbeState("p", None, time.monotonic() + 30)
    sched.device_changed("net", "add", "eth9")
    assert state.device_events == 0 and state.next_due > time.monotonic() + 20
    sched.device_changed("pci", "remove", "0000:3b:00.0")
    assert state.device_events == 1 and state.next_due <= time.monotonic() + 0.2
    sched.run_now("p")
    sched.run_now("absent")
    assert state.next_due <= time.monotonic()


def test_configure_keeps_unchanged_probes_and_names_the_gone_ones() -> None:
    kept, gone = FakeProbe(), FakeProbe()
    kv = MemoryKV()
    kv.set("new.previous", {"ts": 5.0, "snapshot": "s"})
    sched = _scheduler(_setup({"kept": kept, "gone": gone}), kv)
    assert sched.configure(_setup({"kept": kept, "gone": gone})) == []
    before = sched.probes["kept"]
    assert sched.configure(_setup({"kept": kept, "new": FakeProbe()})) == ["gone"]
    assert sched.probes["kept"] is before
    assert (sched.probes["new"].previous, sched.probes["new"].previous_ts) == ("s", 5.0)
    assert sched.probes["new"].next_due <= time.monotonic() + 5.0  # jitter: at most 5 s
    sched.stop_devices()


# --- the event sources' supervisor -------------------------------------------------------------


class FakeSource:
    def __init__(self, reason: str = "", fail: Optional[Exception] = None) -> None:
        self.reason, self.fail, self.runs = reason, fail, 0

    def applies(self, ctx: Any) -> str:
        return self.reason

    def run(self, ctx: Any, emit: Any) -> None:
        self.runs += 1
        emit(Finding("X", "c", "m", {}))
        emit(Finding("Y", "c", "m", {}, probe="other"))
        if self.fail is not None and self.runs == 1:
            raise self.fail
        ctx.stop.wait(30)


def _sources_setup(source: FakeSource, enabled: bool = True) -> Any:
    ctx = SimpleNamespace(stop=None)
    config = SimpleNamespace(sources={"src": {"enabled": enabled}})
    return SimpleNamespace(
        sources={"src": source}, config=config, source_context=lambda name, boot, kv: ctx
    )


def _supervise(
    source: FakeSource, enabled: bool = True, wait_s: float = 5.0
) -> tuple[list[Any], list[Finding]]:
    reports: list[ProbeRun] = []
    found: list[Finding] = []
    prefixes: list[str] = []
    arrived = threading.Event()

    def kv(prefix: str) -> MemoryKV:
        prefixes.append(prefix)
        return MemoryKV()

    def report(run: ProbeRun) -> None:
        reports.append(run)
        if len(reports) >= 3:
            arrived.set()

    sup = SourceSupervisor(lambda: NOW, kv, report, found.append)
    sup.start(_sources_setup(source, enabled), "b")
    arrived.wait(wait_s)
    sup.stop()
    sup.start(_sources_setup(FakeSource(), enabled=False), "b")  # joins the stopped thread
    assert set(prefixes) <= {"source:src."}
    return [(r.probe, r.status, [f.code for f in r.findings], r.error) for r in reports], found


def test_a_source_that_fails_is_reported_and_restarted() -> None:
    reports, found = _supervise(FakeSource(fail=RuntimeError("gone")))
    assert reports == [
        ("source:src", RunStatus.RAN, [], ""),
        ("source:src", RunStatus.FAILED, ["HMA_PROBE_ERROR"], "RuntimeError: gone"),
        ("source:src", RunStatus.RAN, [], ""),  # restarted after 1 s
    ]
    assert [(f.code, f.probe) for f in found][:2] == [("X", "src"), ("Y", "other")]


@pytest.mark.parametrize(
    ("source", "enabled"), [(FakeSource(reason="no kmsg"), True), (FakeSource(), False)]
)
def test_a_source_that_does_not_apply_or_is_off_never_runs(
    source: FakeSource, enabled: bool
) -> None:
    reports, found = _supervise(source, enabled, wait_s=0.2)
    assert found == [] and source.runs == 0
    # not applicable: one run of its pseudo probe (its state changed; no blind finding here)
    assert reports == ([("source:src", RunStatus.RAN, [], "")] if enabled else [])


# --- housekeeping -------------------------------------------------------------------------------


def test_state_write_failures_are_reported_when_they_change(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "state.db"), memory=True)
    writer = StatusReporter(tmp_path / "status.json", 15.0)
    reports: list[ProbeRun] = []
    notifier = SimpleNamespace(watchdog_s=None)
    house = Housekeeping(store, writer, notifier, lambda: NOW, lambda: 30.0, reports.append)  # type: ignore[arg-type]
    try:
        for error, codes in [
            ("", None),  # nothing failed, nothing changed: no report
            ("OSError: full", [f"agent:{tmp_path / 'status.json'}"]),
            ("OSError: still", None),  # the same path still fails: no new report
            ("", []),  # written again: the finding clears
        ]:
            writer.error = error
            reports.clear()
            house.check_writes(NOW)
            if codes is None:
                assert reports == []
            else:
                [run] = reports
                assert run.probe == STATE_PROBE and run.completed
                assert [f.component for f in run.findings] == codes
    finally:
        store.close()


# --- operator requests --------------------------------------------------------------------------


class FakeEffects:
    def __init__(self, remediator: Any = None) -> None:
        self.remediator = remediator
        self.calls: list[Any] = []

    def react(self, applied: Any, force_status: bool = False) -> None:
        self.calls.append(("react", applied))

    def alert(self, alert: Any) -> None:
        self.calls.append(alert.kind)

    def decide_now(self) -> None:
        self.calls.append("decide")

    def write_status(self) -> None:
        self.calls.append("status")


class FakePipeline:
    def ack(self, code: str, component: Any, who: str, now: float) -> Any:
        return ("ack", code, component, who)

    def observe_run(self, run: ProbeRun, now: float) -> Any:
        return ("observed", run.probe, run.status)


class FakeRemediator:
    def release(self, code: Any, component: Any, who: str, reason: str) -> Any:
        return {"cleared": 0}


DEEP = {
    "runs": [
        {"probe": "deep_check.nccl", "status": "ran", "started": 1.0, "duration_s": 2.0,
         "findings": []},
        {"probe": "not_deep", "status": "ran", "started": 1.0, "duration_s": 2.0, "findings": []},
    ]
}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "payload", "remediator", "calls"),
    [
        (
            "ack",
            {"code": "C", "component": "gpu:0"},
            None,
            [("react", ("ack", "C", "gpu:0", "op"))],
        ),
        ("ack", {}, None, [("react", ("ack", "", None, "op"))]),
        ("reset", {"reason": "fixed"}, None, []),  # no remediation running: nothing to release
        ("reset", {"reason": "fixed"}, FakeRemediator(), ["acknowledged", "decide", "status"]),
        ("deep_check", DEEP, None, [("react", ("observed", "deep_check.nccl", RunStatus.RAN))]),
        ("maintenance", {"window": {"nonsense": 1}}, None, []),  # refused (logged)
        ("maintenance", {"window": None}, None, ["status"]),  # off
        ("unknown", {}, None, []),
    ],
)
def test_each_request_kind_is_applied(
    tmp_path: Path, kind: str, payload: dict[str, Any], remediator: Any, calls: list[Any]
) -> None:
    store = Store(str(tmp_path / "state.db"), memory=True)
    other = Store(str(tmp_path / "state.db"))  # the command's process
    effects = FakeEffects(remediator)
    ops = OperatorRequests(store, FakePipeline(), lambda: NOW, effects)  # type: ignore[arg-type]
    try:
        requests.add(other, kind, payload, "op", NOW)
        ops.process()
        assert effects.calls == calls
        effects.calls.clear()
        ops.process()  # taken once
        assert effects.calls == []
    finally:
        other.close()
        store.close()
