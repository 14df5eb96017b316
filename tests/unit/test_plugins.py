"""Entry-point plugins: broken ones reported, raising/garbage/hanging ones contained."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest


def check(hma_env, *names: str) -> dict:  # type: ignore[no-untyped-def]
    res = hma_env.hma("check", *names, "--json", plugins=True)
    return {"rc": res.returncode, **json.loads(res.stdout)}


def test_broken_plugin_reported_not_fatal(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.write("[probes.system]\nfilesystems = []\n")
    doc = check(hma_env, "system", "broken")  # `hma check` loads only the probes it names
    assert [p["status"] for p in doc["probes"]] == ["ran"]
    [f] = doc["agent_findings"]
    assert f["code"] == "HMA_PLUGIN_BROKEN" and f["component"] == "probe:broken"
    assert "hma_testprobes_missing" in f["message"]


def test_raising_probe_is_unknown(hma_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fail = tmp_path / "fail"
    fail.write_text("")
    hma_env.write(f'[probes.flaky]\nenabled = true\nfail_file = "{fail}"\n')
    doc = check(hma_env, "flaky")
    [probe] = doc["probes"]
    assert probe["status"] == "failed" and "simulated probe bug" in probe["error"]
    assert probe["findings"][0]["code"] == "HMA_PROBE_ERROR"


def test_garbage_from_evaluate_is_unknown(hma_env) -> None:  # type: ignore[no-untyped-def]
    hma_env.write("[probes.garbage]\nenabled = true\n")
    doc = check(hma_env, "garbage")
    assert doc["probes"][0]["status"] == "failed"
    assert doc["probes"][0]["findings"][0]["code"] == "HMA_PROBE_ERROR"


@pytest.mark.parametrize("probe", ["stuck", "stuckproc"])
def test_hang_times_out(hma_env, tmp_path: Path, probe: str) -> None:  # type: ignore[no-untyped-def]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    hma_env.write(f'[probes.{probe}]\nenabled = true\nfifo = "{fifo}"\ntimeout = 1\n')
    doc = check(hma_env, probe)
    [p] = doc["probes"]
    assert p["status"] == "timed_out" and doc["rc"] == 3
    assert p["findings"][0]["code"] in ("HMA_PROBE_TIMEOUT",)


def test_thread_slot_reports_hung_and_recovers(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))
    try:
        from hma_testprobes import StuckProbe
    finally:
        sys.path.pop(0)
    from hma.adapters.command import CommandRunner
    from hma.adapters.files import RootReader
    from hma.contracts.model import RunStatus
    from hma.contracts.probe import ProbeContext
    from hma.detection.runner import ThreadSlot, run_probe

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ctx = ProbeContext({"fifo": str(fifo)}, RootReader("/"), RootReader("/"), CommandRunner())
    slot = ThreadSlot(StuckProbe())
    first = run_probe(slot, ctx, 0.3, time.time())
    assert first.findings[0].code == "HMA_PROBE_TIMEOUT"
    second = run_probe(slot, ctx, 0.3, time.time())
    assert second.findings[0].code == "HMA_PROBE_HUNG"  # no second thread was started
    assert threading.active_count() >= 2
    opener = threading.Thread(target=lambda: open(fifo, "wb").close())
    opener.start()  # release the stuck open(); the stuck thread finishes
    opener.join(5)
    ctx.options = {"fifo": ""}
    for _ in range(50):
        third = run_probe(slot, ctx, 2.0, time.time())
        if third.status is RunStatus.RAN:
            break
        time.sleep(0.05)
    assert third.status is RunStatus.RAN and third.findings == ()


def test_named_disabled_probe_reports_disabled(hma_env) -> None:  # type: ignore[no-untyped-def]
    doc = check(hma_env, "garbage")
    # exit 0: the disabled probe adds nothing (and the broken test plugin, not named, is not
    # even imported: `hma check NAME` loads only what it runs)
    assert doc["probes"][0]["status"] == "disabled" and doc["rc"] == 0
    assert "agent_findings" not in doc
