"""One pipeline applies verdicts to the state store for the daemon, `hma ack` and the healthcheck:
the same start (a new boot, a reset database) and the same history and alerts per transition."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hma import assembly
from hma.commands import ack, healthcheck
from hma.contracts.alert import Alert
from hma.contracts.model import Severity
from hma.health import history
from hma.health.pipeline import Pipeline
from hma.health.records import load_records
from hma.health.store import Store


def corrupt_state(env: Any) -> Path:
    env.state.mkdir(parents=True, exist_ok=True)
    db = env.state / "state.db"
    db.write_bytes(b"this is not sqlite" * 100)
    return db


def kinds(store: Store, code: str) -> list[str]:
    return [h["kind"] for h in reversed(history.rows(store)) if h["code"] == code]


def test_start_raises_a_reset_database_with_history_and_alert(hma_env: Any) -> None:
    hma_env.write("")
    setup = assembly.load(str(hma_env.config))
    store = Store(str(corrupt_state(hma_env)))
    alerts: list[Alert] = []
    try:
        pipeline = Pipeline(setup, store, "boot-a", alerts.append)
        pipeline.start(time.time())
        assert kinds(store, "HMA_STATE_RESET") == ["raised"]
        records, _ = load_records(store)
        assert [(r.code, r.active) for r in records] == [("HMA_STATE_RESET", True)]
    finally:
        store.close()
    assert [(a.kind, a.code) for a in alerts] == [("raised", "HMA_STATE_RESET")]


def test_ack_without_daemon_records_the_clear_as_the_daemon_does(hma_env: Any) -> None:
    hma_env.write("")
    setup = assembly.load(str(hma_env.config))
    store = Store(str(corrupt_state(hma_env)))
    Pipeline(setup, store, "", lambda _alert: None).start(time.time())
    store.close()
    assert ack.main(setup, "HMA_STATE_RESET", None) == 0  # no status.json: no daemon
    store = Store(str(hma_env.state / "state.db"))
    try:
        assert kinds(store, "HMA_STATE_RESET") == ["raised", "acknowledged", "cleared"]
        records, _ = load_records(store)
        assert not any(r.active for r in records if r.code == "HMA_STATE_RESET")
    finally:
        store.close()


def test_healthcheck_without_daemon_raises_a_reset_database(hma_env: Any) -> None:
    hma_env.write("")
    corrupt_state(hma_env)
    assert healthcheck.run(str(hma_env.config), quiet=True) == int(Severity.WARNING)
    store = Store(str(hma_env.state / "state.db"))
    try:
        assert kinds(store, "HMA_STATE_RESET") == ["raised"]
    finally:
        store.close()
