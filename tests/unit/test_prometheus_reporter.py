"""prometheus reporter: golden textfile, atomic replacement, clean failures."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from hma import reporters
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
    assert rows["hma_node_severity"] == [({}, 2.0)]
    # pending faults (active false) are not counted; the worst per component is kept
    assert ({"component": "gpu:0000:3b:00"}, 2.0) in rows["hma_component_severity"]
    assert len(rows["hma_findings_active"]) == 3
    # unsupported, disabled and never-run probes have no success sample
    assert [r[0]["probe"] for r in rows["hma_probe_success"]] == ["efa", "gpu", "slurm", "system"]
    assert ({"kind": "reboot", "state": "held"}, 1.0) in rows["hma_actions"]


def test_minimal_document() -> None:
    rows = prom.samples({"severity": "ok", "probes": [], "faults": [], "remediation": {}})
    assert rows["hma_node_severity"] == [({}, 0.0)]
    assert rows["hma_remediation_held"] == [({}, 0.0)]
    assert rows["hma_findings_active"] == [] and rows["hma_actions"] == []


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
