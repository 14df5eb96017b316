"""A damaged state folder (issue 28, part 3): a valid SQLite file without one of its tables, with
a table of other columns, with a wrong ``user_version``, or an immutable folder. The store checks
the schema at open: it repairs what it can (a missing table, a wrong version), moves the file
aside otherwise, and says so (HMA_STATE_RESET, status); every command ends with one line and its
documented exit code, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from hma import cli
from hma.contracts.maintenance import Maintenance
from hma.daemon.loop import Daemon
from hma.health import history, maintenance_mode, records, requests, schema
from hma.health.store import DAMAGE_KEY, Store
from hma.remediation import remediations

pytestmark = pytest.mark.timeout(120)

TABLES = sorted(schema.reference(schema.SCHEMA_VERSION).tables)


def _drop(table: str) -> Callable[[sqlite3.Connection], None]:
    return lambda c: c.execute(f"DROP TABLE {table}")


def _replace(table: str, columns: str) -> Callable[[sqlite3.Connection], None]:
    def damage(c: sqlite3.Connection) -> None:
        c.execute(f"DROP TABLE {table}")
        c.execute(f"CREATE TABLE {table} ({columns})")

    return damage


def _version(number: int) -> Callable[[sqlite3.Connection], None]:
    return lambda c: c.execute(f"PRAGMA user_version = {number}")


# shape: (damage, what the store says: "repaired" or "moved aside")
SHAPES: dict[str, tuple[Callable[[sqlite3.Connection], None], str]] = {
    **{f"no-{t}": (_drop(t), "repaired") for t in TABLES},
    "occurrences-columns": (_replace("occurrences", "scope TEXT, code TEXT"), "moved aside"),
    "occurrences-no-key": (
        _replace("occurrences", "scope TEXT NOT NULL, code TEXT NOT NULL, data TEXT NOT NULL"),
        "moved aside",
    ),
    "kv-columns": (_replace("kv", "key TEXT PRIMARY KEY, value TEXT NOT NULL, x"), "moved aside"),
    "history-no-who": (
        _replace("history", "id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL"),
        "moved aside",
    ),
    "version-0": (_version(0), "repaired"),
    "version-2": (_version(2), "repaired"),
    "version-newer": (_version(schema.SCHEMA_VERSION + 7), "moved aside"),
}
# the command matrix takes the shapes that differ for the commands' paths
COMMAND_SHAPES = [
    "no-occurrences",
    "no-kv",
    "no-requests",
    "no-maintenance",
    "occurrences-columns",
    "kv-columns",
    "version-2",
]


def damaged(path: Path, shape: str) -> None:
    """A state file of hma's schema, with one valid row in each table, then damaged."""
    store = Store(str(path))
    store.kv_set("keep", 1)
    history.add(store, 1.0, "raised", "SYS_X", "node")
    store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        SHAPES[shape][0](conn)
    finally:
        conn.close()


def usable(store: Store) -> None:
    """Every owner of a table reads and writes it."""
    records.save_occurrences(store, [("node", "X")], {("node", "X"): [(1.0, "c", "s")]})
    assert records.load_occurrences(store)[0] == {("node", "X"): [(1.0, "c", "s")]}
    records.save_records(store, [], {})
    assert records.note_boot(store, "b-1", 1.0) and records.boot_count(store) >= 1
    store.kv_set("k", [1])
    assert store.kv_get("k") == [1]
    history.add(store, 2.0, "cleared", "SYS_X", "node")
    assert history.rows(store, 1)[0]["kind"] == "cleared"
    requests.add(store, "ack", {"code": "X"}, "root", 3.0)
    remediations.add(store, {"ts": 4.0, "code": "X", "component": "node", "action": "drain"})
    assert [r["action"] for r in remediations.rows(store)][-1:] == ["drain"]
    maintenance_mode.save(store, Maintenance(5.0), "root", 5.0)
    assert maintenance_mode.load(store) == Maintenance(5.0)
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO actions (key, kind, node, reason, payload, state) "
            "VALUES ('k1', 'drain', 'n', 'r', '{}', 'pending')"
        )


@pytest.mark.parametrize("memory", [False, True], ids=["file", "memory"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_store_repairs_or_moves_aside_and_says_so(
    tmp_path: Path, shape: str, memory: bool
) -> None:
    path = tmp_path / "state.db"
    damaged(path, shape)
    store = Store(str(path), memory=memory)
    try:
        said = store.kv_get(DAMAGE_KEY)
        assert said.startswith(SHAPES[shape][1] + ": "), said
        aside = list(tmp_path.glob("state.db.corrupt-*"))
        if SHAPES[shape][1] == "repaired":
            assert store.reset_reason == "" and store.repaired and aside == []
            assert store.kv_get("keep", 1) == 1  # what the file held stays (kv unless dropped)
        else:
            assert store.reset_reason and [p for p in aside if p.name[-4:] not in ("-wal", "-shm")]
        usable(store)
        assert store.write_error == ""
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        assert schema.shape(conn) == schema.reference(schema.SCHEMA_VERSION).shape
    again = Store(str(path))  # repaired once: the next open finds nothing to say
    try:
        assert (again.reset_reason, again.repaired) == ("", "")
    finally:
        again.close()


def test_a_damage_note_is_raised_once_by_the_next_start(hma_env: Any) -> None:
    from hma import assembly
    from hma.health.pipeline import Pipeline

    hma_env.state.mkdir()
    damaged(hma_env.state / "state.db", "no-occurrences")
    Store(str(hma_env.state / "state.db")).close()  # a command's open: noted, not yet raised
    setup = assembly.load(str(hma_env.config))
    store = Store(str(hma_env.state / "state.db"))
    try:
        pipeline = Pipeline(setup, store, "b-1", lambda _alert: None)
        pipeline.start(10.0)
        [fault] = [r for r in pipeline.model.records() if r.code == "HMA_STATE_RESET"]
        assert "repaired: missing table(s) occurrences created empty" in fault.message
        assert store.kv_get(DAMAGE_KEY) is None
        assert [r.code for r in pipeline.model.records()] == ["HMA_STATE_RESET"]
    finally:
        store.close()


# --- the commands over each damaged shape -----------------------------------------------------


def _config(env: Any) -> None:
    env.write("[reporters.journald]\nenabled = false\n[slurm]\nenabled = false\n")


def _cli(capsys: Any, env: Any, *argv: str) -> tuple[int, str, str]:
    rc = cli.main([*argv, "--config", str(env.config)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _faults(env: Any) -> dict[str, str]:
    store = Store(str(env.state / "state.db"))
    try:
        found, _ = records.load_records(store)
        return {r.code: r.message for r in found if r.active}
    finally:
        store.close()


COMMANDS: dict[str, tuple[list[str], set[int]]] = {
    # argv, the exit codes docs/cli.md gives for it on a working store
    "ack": (["ack", "HMA_STATE_RESET"], {0, 1}),
    "reset": (["reset", "--all", "--reason", "new board"], {0}),
    "maintenance-on": (["maintenance", "on", "--for", "1h"], {0}),
    "maintenance-off": (["maintenance", "off"], {0}),
    "maintenance-status": (["maintenance", "status", "--json"], {0}),
    "healthcheck": (["healthcheck", "--quiet"], {0, 1, 2}),
}


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the commands that change the store need root")


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("shape", COMMAND_SHAPES)
def test_each_command_over_a_damaged_store(
    hma_env: Any, capsys: Any, shape: str, command: str
) -> None:
    _root()
    _config(hma_env)
    hma_env.state.mkdir()
    damaged(hma_env.state / "state.db", shape)
    argv, codes = COMMANDS[command]
    rc, out, err = _cli(capsys, hma_env, *argv)
    assert rc in codes, (rc, out, err)
    assert "Traceback" not in out + err
    if command == "maintenance-status":
        assert json.loads(out)["active"] is False
    if command == "healthcheck":  # it starts the pipeline: the damage is raised
        assert SHAPES[shape][1] in _faults(hma_env)["HMA_STATE_RESET"]
    else:  # said at the next start
        store = Store(str(hma_env.state / "state.db"))
        try:
            assert SHAPES[shape][1] in store.kv_get(DAMAGE_KEY)
        finally:
            store.close()


def _daemon(env: Any) -> Daemon:
    return Daemon(str(env.config))


def _stop(daemon: Daemon) -> None:
    daemon.store.close()
    if daemon._lock is not None:
        os.close(daemon._lock)


@pytest.mark.parametrize("shape", COMMAND_SHAPES)
def test_run_starts_over_a_damaged_store_and_status_says_so(
    hma_env: Any, capsys: Any, shape: str
) -> None:
    _config(hma_env)
    hma_env.state.mkdir()
    damaged(hma_env.state / "state.db", shape)
    daemon = _daemon(hma_env)
    try:
        daemon._startup_findings()
        daemon.effects.write_status()
        rc, out, _err = _cli(capsys, hma_env, "status", "--json")
    finally:
        _stop(daemon)
    doc = json.loads(out)
    [fault] = [f for f in doc["faults"] if f["code"] == "HMA_STATE_RESET"]
    assert SHAPES[shape][1] in fault["message"]
    assert rc >= 1  # a warning at least


# --- a folder that cannot be written -----------------------------------------------------------


def _run(*argv: str) -> bool:
    tool = shutil.which(argv[0])
    if tool is None:
        return False
    done = subprocess.run([tool, *argv[1:]], capture_output=True, timeout=10, check=False)
    return done.returncode == 0


def _lock(how: str, folder: Path) -> Optional[Callable[[], object]]:
    """Make ``folder`` unwritable: chattr +i, or a read-only bind mount on itself; the call that
    undoes it, or None when this host cannot."""
    if how == "immutable":
        return (
            (lambda: _run("chattr", "-i", str(folder)))
            if _run("chattr", "+i", str(folder))
            else None
        )
    if not _run("mount", "--bind", str(folder), str(folder)):
        return None
    if not _run("mount", "-o", "remount,ro,bind", str(folder)):
        _run("umount", str(folder))
        return None
    return lambda: _run("umount", str(folder))


class Unwritable:
    """An agent installation whose state folder holds a good state file and cannot be written."""

    def __init__(self, env: Any, release: Callable[[], object]) -> None:
        self.env, self.release = env, release


@pytest.fixture(params=["immutable", "read-only-mount"])
def unwritable(hma_env: Any, request: Any) -> Any:
    """The agent's state folder, holding a good state file, made immutable (chattr +i) or
    mounted read-only (a bind mount on itself); undone after the test."""
    _root()
    _config(hma_env)
    store = Store(str(hma_env.state / "state.db"))
    store.kv_set("keep", 1)
    store.close()
    release = _lock(request.param, hma_env.state)
    if release is None:
        pytest.skip(f"{request.param} not supported here")
    done = [False]

    def once() -> None:
        if not done[0]:
            done[0] = True
            release()

    try:
        yield Unwritable(hma_env, once)
    finally:
        once()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_on_an_unwritable_state_folder(
    unwritable: Unwritable, capsys: Any, command: str
) -> None:
    argv, _codes = COMMANDS[command]
    rc, out, err = _cli(capsys, unwritable.env, *argv)
    want = 3 if command == "healthcheck" else 73  # docs/cli.md: unknown; state store unusable
    assert rc == want, (rc, out, err)
    [line, *rest] = err.splitlines()
    assert "state store" in line and line.startswith("hma ")
    # the health check's run log lives in the same folder: one more line says it is not kept
    assert [r.split(":")[0] for r in rest] == (["hma healthcheck"] if want == 3 else [])
    assert all("run log not written" in r for r in rest)
    if command == "maintenance-status":
        assert json.loads(out)["severity"] == "unknown"
    else:
        assert out == ""


def test_run_starts_on_an_unwritable_state_folder_and_catches_up(unwritable: Unwritable) -> None:
    daemon = _daemon(unwritable.env)
    try:
        assert daemon.store.write_error  # reading from memory, writing later
        daemon._startup_findings()
        assert daemon.store.kv_get("keep") == 1
        unwritable.release()
        daemon.store.kv_set("after", 2)
        deadline = time.monotonic() + 30
        while not daemon.store.flush(force=True) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert daemon.store.write_error == ""
    finally:
        _stop(daemon)
    store = Store(str(unwritable.env.state / "state.db"))
    try:
        assert (store.kv_get("keep"), store.kv_get("after")) == (1, 2)
    finally:
        store.close()


# --- a store that opens and then refuses a write ------------------------------------------------


def _refusing(env: Any) -> None:
    """A state file whose every write fails after the open (a trigger per table and statement:
    what a disk that fills after the open gives, without filling one)."""
    _config(env)
    Store(str(env.state / "state.db")).close()
    with contextlib.closing(sqlite3.connect(env.state / "state.db", isolation_level=None)) as c:
        for table in TABLES:
            for event in ("INSERT", "UPDATE", "DELETE"):
                c.execute(
                    f"CREATE TRIGGER refuse_{table}_{event} BEFORE {event} ON {table} "
                    "BEGIN SELECT RAISE(FAIL, 'write refused'); END"
                )


@pytest.mark.parametrize("command", ["reset", "maintenance-on", "maintenance-off", "healthcheck"])
def test_a_write_that_fails_after_the_open_is_one_line(
    hma_env: Any, capsys: Any, command: str
) -> None:
    _root()
    _refusing(hma_env)
    argv, _codes = COMMANDS[command]
    rc, out, err = _cli(capsys, hma_env, *argv)
    assert rc == (3 if command == "healthcheck" else 73), (rc, out, err)
    [line] = err.splitlines()
    assert line == f"hma {argv[0]}: state store unusable: IntegrityError: write refused"


def test_deep_check_results_that_cannot_be_written_are_said_not_recorded(
    hma_env: Any, capsys: Any
) -> None:
    from hma import assembly
    from hma.commands import deep_check

    _refusing(hma_env)
    said = deep_check._record(assembly.load(str(hma_env.config)), [])
    assert said.startswith("not recorded: write refused")
    assert "results not recorded" in capsys.readouterr().err
