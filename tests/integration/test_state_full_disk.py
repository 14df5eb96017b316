"""A full disk does not blind the agent: ``state_dir`` on a small tmpfs that is filled while
``hma run`` works; an Xid injected through the /dev/kmsg stand-in still drains the node in the
real (loopback) Slurm, ``HMA_STATE_WRITE_FAILED`` names the path, and once space is freed the
finding clears by itself and the database file holds the fault, its history and the drain. Also:
the store starts on a full disk, and the finding is a journald alert naming the path and error;
every write path of the store under ENOSPC at fuzzed points, then space back, loses nothing
(hypothesis); the commands on a full disk end with one line and exit 73, and work again after."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
from conftest import Env, journald_usable, read_back
from hypothesis import given
from hypothesis import strategies as st

from hma.contracts.maintenance import Maintenance
from hma.health import history, maintenance_mode, records, requests, schema
from hma.health.store import Store
from hma.remediation import remediations
from tests.simnode import SimNode
from tests.slurmcluster import SlurmCluster, available
from tests.standin import nvmlstub
from tests.unit.mutate import budget

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODE = "node2"
TIMEOUT = 60.0


@pytest.fixture
def node() -> Iterator[SimNode]:
    why = available()
    if why:
        pytest.skip(why)
    if nvmlstub.compiler() is None:
        pytest.skip("no C compiler (cc) for the stand-in NVML library")
    cluster = SlurmCluster(3)
    sim = None
    mounted = None
    try:
        cluster.start()
        sim = SimNode(cluster, NODE).build()
        state = sim.base / f"state-{NODE}"
        state.mkdir(mode=0o700)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "hma-test-state", str(state)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        mounted = state
        yield sim
    finally:
        if sim is not None:
            sim.close()
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], capture_output=True, timeout=30, check=False)
        cluster.stop()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "small"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "hma-test-small", str(folder)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True, timeout=30, check=False)


def fill(folder: Path) -> Path:
    """Write zeros into ``folder/filler`` until the filesystem is full."""
    filler = folder / "filler"
    block = b"\0" * 65536
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def active(sim: SimNode, code: str) -> list[dict[str, Any]]:
    return [f for f in sim.faults() if f["code"] == code]


def test_full_state_dir_still_drains_and_recovers_when_space_returns(node: SimNode) -> None:
    sim, cluster = node, node.cluster
    state_dir = sim.base / f"state-{NODE}"
    db = state_dir / "state.db"
    sim.start_agent()
    sim.wait(sim.healthy, TIMEOUT, "a first healthy verdict")
    filler = fill(state_dir)

    sim.wait(lambda: active(sim, "HMA_STATE_WRITE_FAILED"), TIMEOUT, "HMA_STATE_WRITE_FAILED")
    (finding,) = active(sim, "HMA_STATE_WRITE_FAILED")
    assert finding["component"] == f"agent:{db}"
    assert str(db) in finding["message"] and "full" in finding["message"]
    assert finding["severity"] == "warning" and finding["action"] == "none"

    res = sim.hma(
        "inject", "xid", "--gpu", sim.gpu_pci(0), "--xid", "79", "--yes-really-drain",
        "--kmsg", str(sim.dev_kmsg),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    sim.wait(lambda: active(sim, "GPU_XID_79"), TIMEOUT, "GPU_XID_79 in status.json")
    sim.wait(
        lambda: cluster.node(NODE)["reason"].startswith("HMA: GPU_XID_79")
        and ("drain", "done") in sim.actions(),
        TIMEOUT,
        f"{NODE} drained by hma while its state_dir is full",
    )
    assert active(sim, "HMA_STATE_WRITE_FAILED")  # still full: the drain did not wait on it

    filler.unlink()
    sim.wait(
        lambda: not active(sim, "HMA_STATE_WRITE_FAILED"), TIMEOUT, "HMA_STATE_WRITE_FAILED clear"
    )
    assert sim.agent is not None and sim.agent.poll() is None
    log = sim.log.read_text()
    assert f"cannot write {db}: OperationalError: database or disk is full" in log
    assert f"{db} is written again" in log and "Traceback" not in log

    # the file holds what happened while the disk was full (read beside the running agent)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        faults = {r[0] for r in conn.execute("SELECT code FROM faults")}
        raised = {r[0] for r in conn.execute("SELECT code FROM history WHERE kind = 'raised'")}
        kinds = [tuple(r) for r in conn.execute("SELECT kind, state FROM actions ORDER BY id")]
    finally:
        conn.close()
    assert "GPU_XID_79" in faults and {"GPU_XID_79", "HMA_STATE_WRITE_FAILED"} <= raised
    assert ("drain", "done") in kinds
    for suffix in ("", "-wal", "-shm"):
        assert stat.S_IMODE(os.stat(f"{db}{suffix}").st_mode) == 0o600


def test_the_daemon_store_starts_on_a_full_disk_and_writes_everything_later(
    small_tmpfs: Path,
) -> None:
    path = small_tmpfs / "state.db"
    before = Store(str(path), memory=True)
    before.kv_set("cursor", {"seq": 41})
    before.close()  # a clean stop: no -wal or -shm left; opening needs to create them
    filler = fill(small_tmpfs)
    clock = [0.0]
    store = Store(str(path), memory=True, clock=lambda: clock[0])
    assert store.write_error.startswith("OperationalError")
    assert store.kv_get("cursor") == {"seq": 41}  # read without writing
    store.kv_set("cursor", {"seq": 42})
    history.add(store, 1.0, "raised", "GPU_XID_79", "gpu:0000:01:00", "critical", "m")
    clock[0] = 100.0
    assert store.flush() is False and store.write_error  # still full
    filler.unlink()
    clock[0] = 200.0
    assert store.flush() is True and store.write_error == ""
    store.close()
    after = Store(str(path))
    assert (
        after.kv_get("cursor") == {"seq": 42} and history.rows(after, 1)[0]["code"] == "GPU_XID_79"
    )
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    after.close()


@pytest.mark.skipif(not journald_usable(), reason="needs root, systemd-journald, journalctl")
@pytest.mark.parametrize(
    ("folder", "name", "error"),
    [
        ("state", "state.db", "OperationalError: database or disk is full"),
        ("run", "status.json", "OSError: [Errno 28] No space left on device"),
    ],
)
def test_write_failure_is_a_journald_alert_naming_path_and_error(
    hma_env: Env, journald: tuple[str, str], small_tmpfs: Path, folder: str, name: str, error: str
) -> None:
    ns, sock = journald
    setattr(hma_env, folder, small_tmpfs)  # state_dir or run_dir on the small tmpfs
    hma_env.exec_probe("fan", 'echo "fans ok"\nexit 0')
    hma_env.write(
        "[probes.fan]\ninterval = 0.5\n[probes.system]\nenabled = false\n"
        f'[reporters.journald]\nsocket = "{sock}"\n'
    )
    path = small_tmpfs / name
    with open(hma_env.base / "daemon.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"], env=hma_env.env(), stdout=log, stderr=log
        )
    try:
        assert read_back(ns, "HMA_KIND=agent", timeout=30), "the agent did not start"
        filler = fill(small_tmpfs)
        (raised,) = read_back(ns, "HMA_CODE=HMA_STATE_WRITE_FAILED", "HMA_KIND=raised")
        assert raised["HMA_COMPONENT"] == f"agent:{path}"
        assert f"cannot write {path}: {error}" in raised["MESSAGE"]
        filler.unlink()
        cleared = read_back(ns, "HMA_CODE=HMA_STATE_WRITE_FAILED", "HMA_KIND=cleared")
        assert cleared and proc.poll() is None
        # status.json is rewritten right after the alert: wait for it, never race it
        deadline = time.monotonic() + 30
        while "HMA_STATE_WRITE_FAILED" in hma_env.hma("status").stdout:
            assert time.monotonic() < deadline, "status.json still shows HMA_STATE_WRITE_FAILED"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert "Traceback" not in (hma_env.base / "daemon.log").read_text()


def test_stopping_on_a_full_disk_says_what_is_lost(hma_env: Env, small_tmpfs: Path) -> None:
    hma_env.state = small_tmpfs
    hma_env.exec_probe("fan", 'echo "fans ok"\nexit 0')
    hma_env.write("[probes.fan]\ninterval = 0.5\n[probes.system]\nenabled = false\n")
    log_path = hma_env.base / "daemon.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hma", "run"], env=hma_env.env(), stdout=log, stderr=log
        )
    try:
        fill(small_tmpfs)
        deadline = time.monotonic() + 60
        while "HMA_STATE_WRITE_FAILED" not in hma_env.hma("status").stdout:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    text = log_path.read_text()
    assert proc.returncode == 0 and "Traceback" not in text
    assert f"stopped without writing everything to {small_tmpfs / 'state.db'}" in text


# --- every write path under ENOSPC, then space back (issue 28, part 7) -------------------------

WRITES: dict[str, Callable[[Store, int], None]] = {
    "records": lambda s, i: records.save_records(s, [], {}),
    "occurrences": lambda s, i: records.save_occurrences(
        s, [("node", f"C{i % 3}")], {("node", f"C{i % 3}"): [(float(i), "node", "gpu")]}
    ),
    "boot": lambda s, i: records.note_boot(s, f"boot-{i}", float(i)),
    "kv": lambda s, i: s.kv_set(f"k{i % 4}", {"seq": i, "pad": "x" * 3000}),
    "kv_delete": lambda s, i: s.kv_delete(f"k{(i + 1) % 4}"),
    "history": lambda s, i: history.add(s, float(i), "raised", "X", "node", "warning", "m" * 500),
    "prune": lambda s, i: history.prune(s, float(i - 5)),
    "request": lambda s, i: requests.add(s, "ack", {"code": "X", "i": i}, "root", float(i)),
    "remediation": lambda s, i: remediations.add(
        s, {"ts": float(i), "code": "X", "component": "node", "action": "drain"}
    ),
    "maintenance": lambda s, i: maintenance_mode.save(
        s, Maintenance(float(i)) if i % 2 else None, "root", float(i)
    ),
    "outbox": lambda s, i: _outbox(s, i),
}


def _outbox(store: Store, i: int) -> None:
    with store.transaction() as conn:
        conn.execute(
            "INSERT OR REPLACE INTO actions (key, kind, node, reason, payload, state, created) "
            "VALUES (?, 'drain', 'n', 'r', '{}', 'pending', ?)",
            (f"a{i % 5}", float(i)),
        )


def _dump(conn: Any) -> dict[str, list[tuple[Any, ...]]]:
    tables = sorted(schema.reference(schema.SCHEMA_VERSION).tables)
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in tables}


@budget(60)
@given(
    steps=st.lists(st.sampled_from(sorted(WRITES)), min_size=1, max_size=14),
    full_at=st.integers(0, 14),
    space_at=st.integers(0, 14),
)
def test_every_write_path_under_enospc_loses_nothing_once_space_returns(
    small_tmpfs: Path, steps: list[str], full_at: int, space_at: int
) -> None:
    for old in small_tmpfs.iterdir():
        old.unlink()
    path = small_tmpfs / "state.db"
    clock = [0.0]
    store = Store(str(path), memory=True, clock=lambda: clock[0])
    filler: Optional[Path] = None
    try:
        for i, step in enumerate(steps):
            if i == full_at:
                filler = fill(small_tmpfs)
            if i == space_at and filler is not None:
                filler.unlink()
                filler = None
            WRITES[step](store, i)  # never raises: the memory copy takes it
            clock[0] += 1.0
            store.flush()
        if filler is not None:
            assert store.flush(force=True) is False or store.write_error == ""
            filler.unlink()
        clock[0] += 120.0
        assert store.flush() is True and store.write_error == ""
        kept = _dump(store._conn)
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert _dump(conn) == kept  # the file holds every write the agent made
    again = Store(str(path), memory=True)  # and the next start reads it without complaint
    try:
        assert (again.write_error, again.reset_reason, again.repaired) == ("", "", "")
        assert _dump(again._conn) == kept
    finally:
        again.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["ack", "HMA_STATE_RESET"],
        ["reset", "--all", "--reason", "new board"],
        ["maintenance", "on", "--for", "1h"],
        ["maintenance", "off"],
    ],
)
def test_commands_on_a_full_state_disk_say_so_and_work_once_space_returns(
    hma_env: Env, small_tmpfs: Path, argv: list[str]
) -> None:
    hma_env.state = small_tmpfs
    hma_env.write("[reporters.journald]\nenabled = false\n[slurm]\nenabled = false\n")
    Store(str(small_tmpfs / "state.db")).close()
    filler = fill(small_tmpfs)
    full = hma_env.hma(*argv)
    assert "Traceback" not in full.stderr
    assert full.returncode in (0, 1, 73), full.stderr  # a write that still fit, nothing to ack
    if full.returncode == 73:
        [line] = full.stderr.splitlines()
        assert line.startswith(f"hma {argv[0]}: ") and "state store" in line
    filler.unlink()
    again = hma_env.hma(*argv)
    assert again.returncode in (0, 1) and "Traceback" not in again.stderr, again.stderr
