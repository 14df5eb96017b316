"""`hma run` as a real process: sd_notify, watchdog under a stuck probe, signals, restart, udev."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from conftest import Env

STUCK_SECONDS = float(os.environ.get("HMA_STUCK_SECONDS", "60"))


class Agent:
    """A daemon under test with a real NOTIFY_SOCKET."""

    def __init__(self, env: Env, prefix: list[str] | None = None, watchdog_usec: int = 1_000_000):
        self.env = env
        self.sock_path = str(env.base / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        environ = env.env(plugins=True)
        environ.update(NOTIFY_SOCKET=self.sock_path, WATCHDOG_USEC=str(watchdog_usec))
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "hma", "run"],
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except socket.timeout:
                pass

    def wait_for(self, cond: Callable[[], bool], timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond():
                return
            self.pump(0.1)
            assert self.proc.poll() is None, self.proc.communicate()[0]
        raise AssertionError("condition not met in time")

    def sent(self, key: str) -> list[float]:
        return [t for t, m in self.messages if any(line.startswith(key) for line in m.split("\n"))]

    def status(self) -> dict[str, Any]:
        try:
            return self.env.status()
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def probe(self, name: str) -> dict[str, Any]:
        return next((p for p in self.status().get("probes", []) if p["name"] == name), {})

    def faults(self) -> dict[str, dict]:
        return {f["code"]: f for f in self.status().get("faults", []) if f["active"]}

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.pump(0.2)
            self.close()
        return rc

    def close(self) -> None:
        """Release the output pipe and the notify socket (idempotent)."""
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.sock.close()


@pytest.fixture
def agent_factory(hma_env: Env) -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []

    def start(**kw: Any) -> Agent:
        if os.path.exists(hma_env.base / "notify.sock"):
            os.unlink(hma_env.base / "notify.sock")
        agent = Agent(hma_env, **kw)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        agent.close()


@pytest.mark.timeout(STUCK_SECONDS + 60)
def test_ready_watchdog_and_stuck_probe(hma_env: Env, agent_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    hma_env.write(
        f'[probes.stuck]\nenabled = true\nfifo = "{fifo}"\ninterval = 1\ntimeout = 1\n'
        "[probes.system]\ninterval = 1\nfilesystems = []\n"
    )
    agent = agent_factory()
    agent.wait_for(lambda: bool(agent.sent("READY=1")))
    agent.pump(STUCK_SECONDS)
    status = agent.status()
    probes = {p["name"]: p for p in status["probes"]}
    assert probes["stuck"]["status"] == "timed_out"
    assert {"HMA_PROBE_TIMEOUT", "HMA_PROBE_HUNG"} & set(agent.faults())
    # The system probe kept reporting while `stuck` was blocked the whole time.
    assert probes["system"]["status"] == "ran"
    assert time.time() - probes["system"]["last_run"] < 3
    pings = agent.sent("WATCHDOG=1")
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert len(pings) >= STUCK_SECONDS * 2 and max(gaps) < 1.0, gaps
    assert agent.stop() == 0
    assert agent.sent("STOPPING=1")


def test_sighup_reload_keeps_old_config_when_invalid(hma_env: Env, agent_factory) -> None:  # type: ignore[no-untyped-def]
    hma_env.write("[probes.system]\ninterval = 1\nfilesystems = []\n")
    agent = agent_factory()
    agent.wait_for(lambda: bool(agent.sent("READY=1")))
    hma_env.write("[probes.system]\ninterval = -5\n")
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_for(lambda: "HMA_CONFIG_RELOAD_FAILED" in agent.faults())
    fault = agent.faults()["HMA_CONFIG_RELOAD_FAILED"]
    assert "probes.system.interval: must be > 0" in fault["message"]
    last = agent.probe("system")["last_run"] or 0
    agent.wait_for(lambda: (agent.probe("system")["last_run"] or 0) > last)  # still running
    hma_env.write('[probes.system]\ninterval = 1\nfilesystems = ["/nonexistent-hma"]\n')
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_for(lambda: "SYS_FS_MISSING" in agent.faults())  # the new config is in force
    assert agent.stop() == 0


def test_sighup_refuses_an_empty_or_too_deep_file(hma_env: Env, agent_factory) -> None:  # type: ignore[no-untyped-def]
    hma_env.write("[probes.system]\ninterval = 1\nfilesystems = []\n")
    agent = agent_factory()
    agent.wait_for(lambda: bool(agent.sent("READY=1")))
    hma_env.config.write_text("")  # caught half-written: all defaults would move the state away
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_for(lambda: "HMA_CONFIG_RELOAD_FAILED" in agent.faults())
    assert "empty file" in agent.faults()["HMA_CONFIG_RELOAD_FAILED"]["message"]
    hma_env.config.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_for(
        lambda: "nested too deeply" in agent.faults()["HMA_CONFIG_RELOAD_FAILED"]["message"]
    )
    last = agent.probe("system")["last_run"] or 0  # the old configuration (run_dir) still holds
    agent.wait_for(lambda: (agent.probe("system")["last_run"] or 0) > last)
    assert agent.stop() == 0


def test_kill9_restart_keeps_state(hma_env: Env, agent_factory) -> None:  # type: ignore[no-untyped-def]
    hma_env.exec_probe("site", 'echo "fan 3 failed"\nexit 2')
    hma_env.write("[probes.site]\ninterval = 0.5\n[probes.system]\nenabled = false\n")
    agent = agent_factory()
    agent.wait_for(lambda: agent.faults().get("SITE_PROBE_CRITICAL", {}).get("count", 0) >= 3)
    before = agent.faults()["SITE_PROBE_CRITICAL"]
    agent.stop(signal.SIGKILL)
    agent = agent_factory()
    agent.wait_for(lambda: agent.status().get("pid") == agent.proc.pid)
    after = agent.faults()["SITE_PROBE_CRITICAL"]
    assert after["first_seen"] == before["first_seen"]
    assert after["count"] >= before["count"]
    assert agent.stop() == 0


def test_corrupt_state_reset_then_ack(hma_env: Env, agent_factory) -> None:  # type: ignore[no-untyped-def]
    hma_env.state.mkdir()
    (hma_env.state / "state.db").write_bytes(b"\x00garbage" * 512)
    hma_env.write("[probes.system]\nfilesystems = []\n")
    agent = agent_factory()
    agent.wait_for(lambda: "HMA_STATE_RESET" in agent.faults())
    res = hma_env.hma("ack", "HMA_STATE_RESET")
    assert res.returncode == 0 and "notified" in res.stdout
    agent.wait_for(lambda: "HMA_STATE_RESET" not in agent.faults())
    assert agent.stop() == 0


@pytest.mark.skipif(shutil.which("ip") is None or os.geteuid() != 0, reason="needs ip and root")
def test_udev_event_triggers_probe_run(hma_env: Env, agent_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ns = f"hmat-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    listing = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False
    )
    for leftover in listing.stdout.split():
        parts = leftover.split("-")
        # sweep only namespaces of earlier runs whose test process is gone
        if len(parts) == 3 and parts[0] == "hmat" and parts[1].isdigit():
            if not os.path.exists(f"/proc/{parts[1]}"):
                subprocess.run(["ip", "netns", "del", leftover], timeout=10, check=False)
    runs = tmp_path / "runs"
    hma_env.exec_probe("nic", f"echo run >> {runs}\necho ok\nexit 0")
    hma_env.write(
        '[probes.nic]\ninterval = 3600\ntriggers = ["net"]\n' "[probes.system]\nenabled = false\n"
    )
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        agent = agent_factory(prefix=["ip", "netns", "exec", ns])
        count = lambda: len(runs.read_text().splitlines()) if runs.exists() else 0  # noqa: E731
        agent.wait_for(lambda: count() == 1)
        agent.pump(1.0)  # the monitor is up well before the first run finishes
        subprocess.run(
            ["ip", "-n", ns, "link", "add", "hv0", "type", "veth", "peer", "name", "hv1"],
            check=True,
            timeout=10,
        )
        agent.wait_for(lambda: count() >= 2, timeout=10)
        assert agent.stop() == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], timeout=10, check=False)


def test_maintenance_reaches_a_running_daemon_and_survives_a_restart(
    hma_env: Env,
    agent_factory,  # type: ignore[no-untyped-def]
) -> None:
    hma_env.write("[probes.system]\nfilesystems = []\ninterval = 0.5\n")
    agent = agent_factory()
    agent.wait_for(lambda: agent.status().get("pid") == agent.proc.pid)
    res = hma_env.hma("maintenance", "on", "--for", "1h", "--reason", "BIOS update")
    assert res.returncode == 0 and "notified" in res.stdout, res.stderr
    agent.wait_for(lambda: (agent.status().get("maintenance") or {}).get("active") is True)
    assert "MAINTENANCE: on" in hma_env.hma("status").stdout
    agent.stop(signal.SIGKILL)
    agent = agent_factory()
    agent.wait_for(lambda: agent.status().get("pid") == agent.proc.pid)
    window = agent.status()["maintenance"]
    assert window["active"] and window["reason"] == "BIOS update"
    assert hma_env.hma("maintenance", "off").returncode == 0
    agent.wait_for(lambda: agent.status().get("maintenance") is None)
    assert agent.stop() == 0
