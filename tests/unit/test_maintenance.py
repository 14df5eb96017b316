"""Maintenance mode pieces (issue 20): durations, the window and its Slurm mark, the store, the
command's refusals, `hma status`, Prometheus and `hma fleet` over a mark in Slurm."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from test_slurm_hostile_text import Slurm, client, node

from hma.commands import fleet, status
from hma.contracts import label
from hma.contracts.maintenance import (
    TOKEN_PREFIX,
    Maintenance,
    clean_reason,
    in_field,
    parse_duration,
)
from hma.health import history, maintenance_mode
from hma.health.store import Store
from hma.reporters import prometheus


@pytest.mark.parametrize(
    "text, seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "2 h", "-5m", "1.5h", "2w", "h", "400d", "１h"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_a_window_ends_by_itself() -> None:
    window = Maintenance(1000.0, 1600.0, "swap PSU", "alice")
    assert window.active(1599.0) and not window.active(1600.0)
    assert Maintenance(1000.0).active(10**12)  # until turned off
    assert Maintenance.from_json(window.to_json()) == window
    assert "reason 'swap PSU'" in window.describe() and "by alice" in window.describe()


def test_the_slurm_mark_is_one_word_read_strictly() -> None:
    window = Maintenance(1000.0, 1600.0)
    text = label.edit_token("rack=4 hma=unhealthy:X:none", TOKEN_PREFIX, window.token())
    assert text == "rack=4 hma=unhealthy:X:none hma-maint=1600"
    assert label.find(text) is not None  # hma's own label is untouched
    assert in_field(text) == Maintenance(0.0, 1600.0)
    assert in_field("hma-maint=0") == Maintenance(0.0, None)
    for forged in ("hma-maint=16OO", "xhma-maint=1600", "hma-maint=", "hma-maint=1e9"):
        assert in_field(forged) is None
    assert label.edit_token(text, TOKEN_PREFIX, None) == "rack=4 hma=unhealthy:X:none"


def test_reasons_are_one_printable_line() -> None:
    assert clean_reason("PSU\n\x1b[2Jswap") == "PSU  [2Jswap"
    assert len(clean_reason("x" * 1000)) == 200


def test_the_window_survives_reopening_the_store(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "state.db"))
    maintenance_mode.save(store, Maintenance(10.0, 20.0, "bios", "bob"), "bob", 10.0)
    store.close()
    again = Store(str(tmp_path / "state.db"))
    assert maintenance_mode.load(again) == Maintenance(10.0, 20.0, "bios", "bob")
    maintenance_mode.save(again, None, "bob", 11.0)
    assert maintenance_mode.load(again) is None
    kinds = [h["kind"] for h in history.rows(again)]
    assert kinds[:2] == ["maintenance_off", "maintenance_on"]
    again.close()


def test_on_and_off_need_root_and_a_good_duration(hma_env: Any) -> None:
    res = hma_env.hma("maintenance", "on", "--for", "soon")
    assert res.returncode == 2 and "not a duration" in res.stderr
    res = hma_env.hma("maintenance", "off", "--reason", "x")
    assert res.returncode == 2
    if os.geteuid() == 0:
        res = hma_env.hma("maintenance", "on", "--for", "1h", "--reason", "test")
        assert res.returncode == 0 and "no daemon running" in res.stdout, res.stderr
        assert "MAINTENANCE" not in hma_env.hma("status").stdout  # no daemon: no status file
        assert "maintenance: ON" in hma_env.hma("maintenance", "status").stdout


def test_status_and_prometheus_show_an_open_window() -> None:
    now = time.time()
    doc = {
        "node": "n1",
        "severity": "critical",
        "maintenance": {**Maintenance(now - 60, now + 3600, "psu").to_json(now)},
    }
    text = status.render(doc, now=now)
    assert "MAINTENANCE: on" in text and "takes no action" in text
    samples = prometheus.samples(doc)
    assert samples["hma_maintenance"] == [({}, 1.0)]
    assert samples["hma_maintenance_until_timestamp_seconds"] == [({}, now + 3600)]
    ended = {**doc, "maintenance": Maintenance(now - 60, now - 1).to_json(now)}
    assert "MAINTENANCE" not in status.render(ended, now=now)
    assert prometheus.samples(ended)["hma_maintenance"] == [({}, 0.0)]


def test_fleet_lists_a_node_in_maintenance_from_one_sinfo() -> None:
    until = int(time.time()) + 3600
    slurm = Slurm(
        [
            node("node1", Extra=f"rack=1 hma-maint={until}", **{"State": "idle"}),
            node("node2", Extra="hma-maint=1", **{"State": "idle"}),  # ran out long ago
            node("node3", Extra="hma-maint=soon"),  # not a mark
        ]
    )
    doc = fleet.collect(client(slurm), "extra", 10.0, None)
    rows = {r["node"]: r for r in doc["nodes"]}
    assert rows["node1"]["maintenance"] == {"until": float(until)}
    assert "node2" not in rows or rows["node2"]["maintenance"] is None
    assert "maintenance" in fleet.render_text(doc)
    assert len(slurm.calls) == 1


def test_status_for_a_user_reads_the_daemons_status_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import json

    from hma import assembly
    from hma.commands import maintenance as command
    from hma.reporters import statusfile

    run = tmp_path / "run"
    run.mkdir()
    cfg = tmp_path / "hma.toml"
    cfg.write_text(f'[agent]\nstate_dir = "{tmp_path}/state"\nrun_dir = "{run}"\n')
    setup = assembly.load(str(cfg))
    monkeypatch.setattr(command.os, "geteuid", lambda: 1000)  # the state store is root's
    assert command.main(setup, "status", None, "", True) == 3  # no daemon: it says so
    assert json.loads(capsys.readouterr().out)["problem"].startswith("no daemon")
    now = time.time()
    doc = {
        "schema": statusfile.SCHEMA,
        "pid": os.getpid(),
        "boot_id": statusfile.current_boot_id(),
        "generated": now,
        "heartbeat_s": 15.0,
        "maintenance": Maintenance(now - 5, now + 600, "fans", "bob").to_json(now),
    }
    (run / "status.json").write_text(json.dumps(doc))
    assert command.main(setup, "status", None, "", True) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["active"] and got["reason"] == "fans" and got["who"] == "bob"
