"""prometheus reporter: golden textfile, atomic replacement, clean failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from hma import reporters
from hma.contracts.alert import Alert
from hma.contracts.model import Severity
from hma.reporters import prometheus as prom

pytestmark = pytest.mark.timeout(60)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "status"


def sample() -> dict:
    return json.loads((FIXTURES / "sample.json").read_text("utf-8"))


def test_reporters_are_registered_with_their_defaults() -> None:
    classes, broken = reporters.discover()
    assert {"journald", "prometheus"} <= set(classes)
    assert [b for b in broken if b.name in ("journald", "prometheus")] == []
    schemas = reporters.schemas()
    assert schemas["journald"]["enabled"].default is True
    assert schemas["prometheus"]["enabled"].default is False
    assert schemas["prometheus"]["textfile"].default.endswith(".prom")


@pytest.mark.parametrize(
    ("value", "problem"),
    [("/tmp/hma.txt", "must end in .prom"), ("hma.prom", "absolute path"), ("/x/hma.prom", None)],
)
def test_textfile_option_is_checked(value: str, problem: str) -> None:
    got = prom.PrometheusReporter.options["textfile"].validate(value)
    assert (got is None) if problem is None else (problem in (got or ""))


def test_samples_of_a_status_document() -> None:
    rows = prom.samples(sample())
    assert ({"state": "critical"}, 1.0) in rows["hma_node_state"]
    # pending faults (active false) are not counted; the worst per component is kept
    gpu = {r[0]["state"]: r[1] for r in rows["hma_component_state"]}
    assert ({"component": "gpu:0000:3b:00", "state": "critical"}, 1.0) in rows[
        "hma_component_state"
    ]
    assert ({"component": "gpu:0000:3b:00", "state": "warning"}, 0.0) in rows["hma_component_state"]
    assert set(gpu) == {"ok", "warning", "critical", "unknown"}
    assert len(rows["hma_findings_active"]) == 3
    # unsupported, disabled and never-run probes have no success sample
    assert [r[0]["probe"] for r in rows["hma_probe_success"]] == ["efa", "gpu", "slurm", "system"]
    assert ({"kind": "reboot", "state": "held"}, 1.0) in rows["hma_actions"]


@pytest.mark.parametrize("severity", ["ok", "warning", "critical", "unknown", "bogus"])
def test_node_state_is_one_hot(severity: str) -> None:
    """Issue 20: one sample per state, exactly one of them 1 (Nagios codes ordered unknown above
    critical, so `>` misled); what cannot be parsed is unknown."""
    rows = prom.samples({"severity": severity})
    states = {labels["state"]: value for labels, value in rows["hma_node_state"]}
    assert states == {
        s: float(s == (severity if severity != "bogus" else "unknown"))
        for s in ("ok", "warning", "critical", "unknown")
    }


def test_minimal_document() -> None:
    rows = prom.samples({"severity": "ok", "probes": [], "faults": [], "remediation": {}})
    assert ({"state": "ok"}, 1.0) in rows["hma_node_state"]
    assert rows["hma_remediation_held"] == [({}, 0.0)]
    assert rows["hma_findings_active"] == [] and rows["hma_actions"] == []
    assert rows["hma_component_state"] == []


def test_empty_labels_are_left_out() -> None:
    """Issue 20: `hma_info{instance_type=""}` when the instance type is unknown."""
    doc = {**sample(), "instance_type": None}
    assert prom.samples(doc)["hma_info"] == [({"version": "0.1.0", "node": "node1"}, 1.0)]
    assert prom.samples(sample())["hma_info"][0][0]["instance_type"] == "p5.48xlarge"


def alert(kind: str, action_kind: str = "") -> Alert:
    details = {"action_kind": action_kind} if action_kind else {}
    return Alert(kind, "GPU_XID_79", "gpu:0000:3b:00", Severity.CRITICAL, "m", details=details)


def test_counters_count_alerts(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    rep = prom.PrometheusReporter({"textfile": str(tmp_path / "hma.prom")})
    for a in (
        alert("raised"),
        alert("raised"),
        alert("cleared"),
        alert("action_requested", "drain"),
        alert("action_applied", "drain"),
        alert("action_failed", "reboot"),
    ):
        rep.alert(a)
    rep.publish(sample())
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in parse(tmp_path / "hma.prom")
        for s in f.samples
        if f.type == "counter"
    }
    assert got[("hma_alerts_total", (("kind", "raised"),))] == 2
    assert got[("hma_alerts_total", (("kind", "cleared"),))] == 1
    assert got[("hma_alerts_total", (("kind", "escalated"),))] == 0  # every kind, from 0
    assert got[("hma_alerts_total", (("kind", "action_applied"),))] == 1
    actions = {k[1]: v for k, v in got.items() if k[0] == "hma_remediation_actions_total"}
    assert actions == {
        (("action", "drain"), ("outcome", "requested")): 1,
        (("action", "drain"), ("outcome", "applied")): 1,
        (("action", "reboot"), ("outcome", "failed")): 1,
    }


def parse(path: Path) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    return list(text_string_to_metric_families(path.read_text("utf-8")))


def test_textfile_follows_the_naming_conventions(tmp_path: Path) -> None:
    """Issue 20: parsed by prometheus-client's own text parser: counters end in `_total`,
    gauges never do; units in the name; no `hma_up` (a stale textfile cannot say it is down);
    a freshness timestamp; no empty label value."""
    pytest.importorskip("prometheus_client")
    path = tmp_path / "hma.prom"
    rep = prom.PrometheusReporter({"textfile": str(path)})
    rep.alert(alert("raised"))
    rep.publish({**sample(), "instance_type": ""})
    families = {f.name: f for f in parse(path)}
    # the parser gives counters their name without _total; their samples carry it
    written = {f.name + ("_total" if f.type == "counter" else "") for f in families.values()}
    assert written == set(prom.families())
    assert "hma_up" not in written and "hma_node_severity" not in written
    for f in families.values():
        assert f.type in ("gauge", "counter"), f.name
        assert f.documentation, f.name
        for s in f.samples:
            assert s.name.endswith("_total") == (f.type == "counter"), s.name
            assert all(v != "" for v in s.labels.values()), s
            if "timestamp" in s.name:
                assert s.name.endswith("_timestamp_seconds") and s.value > 1e9
    assert (
        families["hma_status_generated_timestamp_seconds"].samples[0].value
        == (sample()["generated"])
    )
    assert sum(s.value for s in families["hma_node_state"].samples) == 1


def test_golden_textfile(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    path = tmp_path / "hma.prom"
    prom.PrometheusReporter({"textfile": str(path)}).publish(sample())
    golden = FIXTURES / "sample.prom"
    if os.environ.get("HMA_UPDATE_GOLDEN") == "1":
        golden.write_text(path.read_text("utf-8"), "utf-8")
    assert path.read_text("utf-8") == golden.read_text("utf-8")
    assert os.listdir(tmp_path) == ["hma.prom"]


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    path = tmp_path / "hma.prom"
    big = sample()
    big["faults"] = big["faults"] * 200  # distinct lengths make a torn read detectable
    for i, fault in enumerate(big["faults"]):
        fault["component"] = f"c{i}"
    docs = [sample(), big]
    expected = {prom.render(d) for d in docs}
    rep = prom.PrometheusReporter({"textfile": str(path)})
    rep.publish(docs[0])
    seen: set[str] = set()
    bad: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            text = path.read_text("utf-8")
            if text in expected:
                seen.add(text)
            else:
                bad.append(text)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(300):
            rep.publish(docs[i % 2])
    finally:
        done.set()
        thread.join(10)
    assert not bad, f"{len(bad)} torn reads"
    assert seen  # the reader did read
    assert os.listdir(tmp_path) == ["hma.prom"]  # no temp files left behind


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    rep = prom.PrometheusReporter({"textfile": str(tmp_path / "nope" / "hma.prom")})
    with pytest.raises(prom.TextfileError, match=r"hma\.prom: folder .*nope does not exist"):
        rep.publish(sample())


def test_path_that_is_a_folder_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    target = tmp_path / "hma.prom"
    target.mkdir()
    rep = prom.PrometheusReporter({"textfile": str(target)})
    with pytest.raises(prom.TextfileError, match="it is a folder"):
        rep.publish(sample())
    assert os.listdir(tmp_path) == ["hma.prom"]  # the temp file was removed


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_folder_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    tmp_path.chmod(0o500)
    try:
        rep = prom.PrometheusReporter({"textfile": str(tmp_path / "hma.prom")})
        with pytest.raises(prom.TextfileError, match="Permission denied"):
            rep.publish(sample())
    finally:
        tmp_path.chmod(0o700)


def test_missing_prometheus_client_is_said_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import now raises ImportError
    with pytest.raises(prom.TextfileError, match="needs prometheus-client"):
        prom.PrometheusReporter({"textfile": "/tmp/x.prom"})


def test_docs_list_every_metric() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "alerting.md"
    text = docs.read_text("utf-8")
    for name in prom.families():
        assert f"| `{name}` |" in text


def test_start_reporters_keeps_an_unchanged_reporter(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    opts = {"enabled": True, "textfile": str(tmp_path / "hma.prom")}
    problems: list[str] = []
    first = reporters.start_reporters({"prometheus": opts}, problems.append)
    first[0].alert(alert("raised"))
    again = reporters.start_reporters({"prometheus": dict(opts)}, problems.append, first)
    assert again == first  # the same instance, its counters with it
    moved = {**opts, "textfile": str(tmp_path / "other.prom")}
    changed = reporters.start_reporters({"prometheus": moved}, problems.append, first)
    assert changed[0] is not first[0]
    off = reporters.start_reporters(
        {"prometheus": {**opts, "enabled": False}}, problems.append, first
    )
    assert off == [] and problems == []


@pytest.mark.timeout(90)
def test_a_reload_keeps_the_counters(hma_env) -> None:  # type: ignore[no-untyped-def]
    """The daemon keeps an unchanged reporter across SIGHUP: hma_alerts_total does not reset."""
    pytest.importorskip("prometheus_client")
    textfile = hma_env.base / "hma.prom"
    hma_env.exec_probe("fan", 'echo "fan 3 failed"\nexit 2')
    hma_env.write(
        "[probes.fan]\ninterval = 0.5\n[probes.system]\nenabled = false\n"
        "[reporters.journald]\nenabled = false\n"
        f'[reporters.prometheus]\nenabled = true\ntextfile = "{textfile}"\n'
    )
    log = hma_env.base / "daemon.log"

    def counters() -> dict:
        if not textfile.exists():
            return {}
        return {
            (s.name, s.labels.get("kind")): s.value
            for f in parse(textfile)
            for s in f.samples
            if s.name in ("hma_alerts_total", "hma_status_generated_timestamp_seconds")
        }

    def wait(cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not cond():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"], env=hma_env.env(), stdout=out, stderr=out
        )
    try:
        wait(lambda: counters().get(("hma_alerts_total", "raised")) == 1, "the fault counted")
        proc.send_signal(signal.SIGHUP)
        wait(lambda: "configuration reloaded" in log.read_text(), "the reload")
        reloaded = time.time()
        key = ("hma_status_generated_timestamp_seconds", None)
        wait(lambda: counters().get(key, 0) > reloaded, "a textfile written after the reload")
        assert counters()[("hma_alerts_total", "raised")] == 1
    finally:
        proc.terminate()
        proc.wait(30)
