"""Between probe runs the daemon's loop sleeps until its next timer; remediation wakes it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hma.contracts.model import Finding, ProbeRun, RunStatus
from hma.daemon.housekeeping import HEARTBEAT_S
from hma.daemon.loop import AlertsQueued, Daemon
from hma.detection.runner import make_slot
from hma.detection.scheduler import UNSUPPORTED_RECHECK_S, ProbeState

pytestmark = pytest.mark.timeout(60)

NOW = 1_800_000_000.0


def daemon(tmp_path: Path, clock: list[float]) -> Daemon:
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[agent]\nstate_dir = "{tmp_path}/state"\nrun_dir = "{tmp_path}/run"\n'
        f'probes_dir = "{tmp_path}/probes.d"\n[slurm]\nenabled = false\n'
    )
    return Daemon(str(cfg), clock=lambda: clock[0])


def test_idle_loop_sleeps_until_the_heartbeat(tmp_path: Path) -> None:
    d = daemon(tmp_path, [NOW])
    try:
        d._periodic()  # prunes, writes the status: nothing left due
        wait = d.housekeeping.wait(time.monotonic(), d.model)
        assert 1.0 < wait <= HEARTBEAT_S  # not the once-a-second poll it was
    finally:
        d.store.close()


def test_a_window_cleared_fault_wakes_the_loop_when_it_expires(tmp_path: Path) -> None:
    clock = [NOW]
    d = daemon(tmp_path, clock)
    try:
        hung = Finding("KERNEL_HUNG_TASK", "kernel", "task blocked", {}, probe="kernel_log")
        d.pipeline.observe_run(ProbeRun("kernel_log", RunStatus.RAN, NOW, 0.0, (hung,)), NOW)
        window = d.model.catalogue.entry("KERNEL_HUNG_TASK").window_s
        clock[0] = NOW + window - 0.25
        d._periodic()  # prunes, writes the status: nothing left due
        assert d.housekeeping.wait(time.monotonic(), d.model) == pytest.approx(0.25)
    finally:
        d.store.close()


def test_remediation_alerts_arrive_as_a_message(tmp_path: Path) -> None:
    d = daemon(tmp_path, [NOW])
    try:
        d.effects.start_remediator(d.setup, d.topology()["domain"])
        while not d.inputs.empty():  # the one put when it was made
            assert isinstance(d.inputs.get_nowait(), AlertsQueued)
        d.effects.remediator.on_alert()
        assert isinstance(d.inputs.get_nowait(), AlertsQueued)
    finally:
        if d.effects.remediator is not None:
            d.effects.remediator.close()
        d.store.close()


def test_an_unsupported_answer_stands_until_a_device_event(tmp_path: Path) -> None:
    """neuron on a node without Neuron devices is not run again (not every 30 s) until a device
    of its triggers comes; slurm's "unsupported" depends on the configuration and is asked again
    at its interval; an event during the run means the answer may be stale."""
    d = daemon(tmp_path, [NOW])
    try:
        for name in ("neuron", "slurm"):  # as _configure makes them, without sources or udev
            d.scheduler.probes[name] = ProbeState(
                name, make_slot(d.setup.probes[name]), time.monotonic()
            )
        neuron, slurm = d.scheduler.probes["neuron"], d.scheduler.probes["slurm"]
        for state in (neuron, slurm):
            d.scheduler.start(state, d.effects.facts(d.setup.node_name))
            while state.in_flight:
                d._handle(d.inputs.get(timeout=30))
            assert state.last is not None and state.last.status is RunStatus.UNSUPPORTED
        mono = time.monotonic()
        assert neuron.next_due >= mono + UNSUPPORTED_RECHECK_S - 60
        assert slurm.next_due < mono + 3600 - 60
        d.scheduler.device_changed("neuron_device", "add", "neuron0")
        assert neuron.next_due <= time.monotonic() + 0.2
        held = ProbeRun("neuron", RunStatus.UNSUPPORTED, NOW, 0.0, (), "no Neuron devices")
        neuron.in_flight, neuron.dispatched_events = True, neuron.device_events - 1
        d._probe_done(neuron, held)  # a device came while it ran: ask again soon
        assert neuron.next_due <= time.monotonic() + 0.2
    finally:
        d.store.close()


def test_a_second_daemon_on_one_state_folder_exits_75(tmp_path: Path) -> None:
    """One `hma run` per state folder: while a daemon holds it, another exits at once."""
    first = daemon(tmp_path, [NOW])
    assert first.store is not None  # constructed: the lock is held
    done = subprocess.run(
        [sys.executable, "-m", "hma", "run", "--config", str(tmp_path / "hma.toml")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 75, done.stderr
    assert f"another hma run (pid {os.getpid()}) uses the state folder" in done.stderr
    first._teardown()  # the lock goes with the daemon: a next one may start
    assert (tmp_path / "state" / "hma.lock").read_text() == f"{os.getpid()}\n"
    with open(tmp_path / "state" / "hma.lock") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
