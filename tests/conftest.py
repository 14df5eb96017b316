"""Shared test helpers: isolated configs, running the real `hma` command."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from hma.reporters.statusfile import pid_alive
from tests import slurmchroot

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
PLUGINS = ROOT / "tests" / "plugins"

# --- hermetic: no test reads this machine's /dev/kmsg (tests/hermetic/sitecustomize.py) ----------
# Every Python process the tests start finds the guard on PYTHONPATH; this one installs it too. An
# open of the device is refused and logged to KMSG_LOG, which fails the test that did it.
HERMETIC = ROOT / "tests" / "hermetic"
_fd, _kmsg_log = tempfile.mkstemp(prefix="hma-test-kmsg-", suffix=".log")
os.close(_fd)
KMSG_LOG = Path(_kmsg_log)
os.environ["HMA_TEST_KMSG_LOG"] = str(KMSG_LOG)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(HERMETIC), os.environ.get("PYTHONPATH", "")) if p
)
from tests.hermetic import sitecustomize  # noqa: E402  (installs the guard in this process)
from tests.hermetic.postmortem import postmortem_section  # noqa: E402


class Env:
    """An isolated agent installation: config, state and run folders under tmp_path."""

    def __init__(self, base: Path, trusted: Path) -> None:
        self.base = base
        self.config = base / "hma.toml"
        self.state = base / "state"
        self.run = base / "run"
        # executable probes run only from a path root alone can change (not under /tmp)
        self.probes_d = trusted / "probes.d"
        self.probes_d.mkdir()
        os.chmod(self.probes_d, 0o755)
        os.chmod(base, 0o755)
        # the kernel log: a FIFO no one writes (opened read-write by the source: no end of file),
        # never this machine's /dev/kmsg
        self.kmsg = base / "hma-env-kmsg"
        os.mkfifo(self.kmsg, 0o600)
        self.write("")

    def write(self, extra: str, kernel_log: bool = True) -> None:
        """(Re)write hma.toml: the folders, then ``extra`` TOML (and, unless ``extra`` has its
        own or ``kernel_log`` is false, a ``[sources.kernel_log]`` that reads the silent
        stand-in ``kmsg`` and a ``[sources.postmortem]`` that reads an empty folder and no
        journal: no daemon of a test reads this machine's kernel log or crash records)."""
        if kernel_log and "[sources.kernel_log]" not in extra:
            extra += f'\n[sources.kernel_log]\npath = "{self.kmsg}"\nbackend = "kmsg"\n'
        if kernel_log and "[sources.postmortem]" not in extra:  # nor crash records, journal
            extra += postmortem_section(self.base / "crash-records")
        self.config.write_text(
            f'[agent]\nstate_dir = "{self.state}"\nrun_dir = "{self.run}"\n'
            f'probes_dir = "{self.probes_d}"\nnode_name = "testnode"\n' + extra
        )

    def env(self, plugins: bool = False) -> dict[str, str]:
        """Environment for running hma against this installation."""
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["HMA_CONFIG"] = str(self.config)
        if plugins:
            env["PYTHONPATH"] = str(PLUGINS) + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def hma(
        self,
        *args: str,
        timeout: float = 60,
        plugins: bool = False,
        env: Optional[dict[str, str]] = None,
    ) -> subprocess.CompletedProcess:
        """Run the real command line."""
        return subprocess.run(
            [sys.executable, "-m", "hma", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or self.env(plugins),
            check=False,
        )

    def status(self) -> dict[str, Any]:
        """The daemon's status.json."""
        return json.loads((self.run / "status.json").read_text())

    def exec_probe(self, name: str, body: str, mode: int = 0o755) -> Path:
        """Write an executable probe script into probes.d."""
        path = self.probes_d / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        os.chmod(path, mode)
        return path


TRUSTED_ROOT = "/run"  # root-owned and writable by root alone, unlike /tmp


@pytest.fixture
def trusted_dir(tmp_path: Path) -> Iterator[Path]:
    """As root, a fresh folder under /run whose every path component is root's and writable by
    root alone (executable probes run only from such a path; removed after the test); tmp_path
    otherwise."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    for old in Path(TRUSTED_ROOT).glob("hma-test-*-*"):  # left by killed runs
        pid = old.name.split("-")[2]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"hma-test-{os.getpid()}-", dir=TRUSTED_ROOT))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _hermetic_kernel_log() -> Iterator[None]:
    """Fail a test that opened the real /dev/kmsg (in this process or one it started)."""
    before = KMSG_LOG.stat().st_size
    yield
    with open(KMSG_LOG, encoding="utf-8") as fh:
        fh.seek(before)
        opened = fh.read()
    if opened:
        pytest.fail(
            f"the test opened the real {sitecustomize.DEVICE} (point sources.kernel_log at a "
            f"stand-in, tests/standin/kmsg.py):\n{opened}"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this session's log of refused /dev/kmsg opens."""
    KMSG_LOG.unlink(missing_ok=True)


@pytest.fixture
def hma_env(tmp_path: Path, trusted_dir: Path) -> Env:
    """An isolated agent installation; its probes.d lies in ``trusted_dir``."""
    return Env(tmp_path, trusted_dir)


# --- a private, namespaced systemd-journald for the whole session -------------------------------
# `systemd-journald hmat<pid>` listens on /run/systemd/journal.hmat<pid>/socket and is read with
# `journalctl --namespace`: it neither needs nor disturbs a host journald or other test runs. It is
# stopped by PID and its files removed; leftovers of killed runs are swept at the start.

JOURNALD = "/lib/systemd/systemd-journald"
PREFIX = "hmat"
PIDFILES = Path("/tmp")


def _machine_id() -> str:
    try:
        return Path("/etc/machine-id").read_text().strip()
    except OSError:
        return ""


def _remove_files(ns: str) -> None:
    shutil.rmtree(f"/run/systemd/journal.{ns}", ignore_errors=True)
    mid = _machine_id()
    if mid:
        for base in ("/var/log/journal", "/run/log/journal"):
            shutil.rmtree(f"{base}/{mid}.{ns}", ignore_errors=True)


def _stop(pid: int, ns: str) -> None:
    """SIGTERM (then SIGKILL) the journald we started, if that PID still is it."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if not (cmdline and cmdline[0].endswith(b"systemd-journald") and ns.encode() in cmdline):
        return  # the PID was reused by something else
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


def _sweep() -> None:
    """Stop and remove journalds of earlier runs whose pytest process is gone."""
    for pidfile in PIDFILES.glob(f"hma-test-journald-{PREFIX}*.pid"):
        ns = pidfile.name[len("hma-test-journald-") : -len(".pid")]
        owner = ns[len(PREFIX) :]
        if owner.isdigit() and pid_alive(int(owner)):
            continue  # another run in progress
        text = pidfile.read_text().strip()
        if text.isdigit():
            _stop(int(text), ns)
        _remove_files(ns)
        pidfile.unlink()


@pytest.fixture
def journald() -> Iterator[tuple[str, str]]:
    """(namespace, socket path) of a private journald for one test.

    Per test, not per session: a namespaced journald exits by itself after 30 s without
    clients, which left a stale socket for tests that ran later in a long session."""
    _sweep()
    ns = f"{PREFIX}{os.getpid()}"
    pidfile = PIDFILES / f"hma-test-journald-{ns}.pid"
    _remove_files(ns)
    proc = subprocess.Popen(
        [JOURNALD, ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    pidfile.write_text(str(proc.pid))
    sock = f"/run/systemd/journal.{ns}/socket"
    try:
        deadline = time.monotonic() + 15
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"systemd-journald {ns} did not create {sock} (rc {proc.poll()})")
            time.sleep(0.05)
        _wait_ready(ns, sock)
        yield ns, sock
    finally:
        _stop(proc.pid, ns)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        _remove_files(ns)
        pidfile.unlink(missing_ok=True)


def _wait_ready(ns: str, sock: str) -> None:
    """Round-trip one entry: the socket exists before journald reads it and writes its files."""
    import socket as socket_mod

    from hma.reporters.journal import encode

    marker = f"ready-{os.getpid()}-{time.monotonic_ns()}"
    with socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_DGRAM) as client:
        client.sendto(encode([("MESSAGE", "hma test journald ready"), ("HMA_READY", marker)]), sock)
    if not read_back(ns, f"HMA_READY={marker}", timeout=60):
        pytest.fail(f"systemd-journald {ns} accepted no entry within 60 s")


def read_back(ns: str, *matches: str, count: int = 1, timeout: float = 30) -> list[dict]:
    """Entries matching every ``FIELD=value``, polled until ``count`` arrived (async)."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["journalctl", f"--namespace={ns}", "-o", "json", "--no-pager", *matches],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout
        entries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if len(entries) >= count or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)


def journald_usable() -> bool:
    """Root, systemd-journald and journalctl present."""
    return os.geteuid() == 0 and os.access(JOURNALD, os.X_OK) and bool(shutil.which("journalctl"))


# --- an ordinary (non-root) user, for tests of what such a user can and cannot do ----------------


class User:
    """A system user created for one test: name, uid, gid, and ``argv`` to run a command as it."""

    def __init__(self, name: str) -> None:
        import pwd

        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid

    def argv(self, *command: str) -> list[str]:
        """``command`` run as this user (no supplementary groups)."""
        ids = ["--reuid", str(self.uid), "--regid", str(self.gid), "--clear-groups"]
        return ["setpriv", *ids, "--", *command]

    def run(self, *command: str) -> None:
        """Run ``command`` as this user; it must succeed."""
        done = subprocess.run(
            self.argv(*command), capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"


USER_PREFIX = "hmau"  # + the pytest process id


def users_usable() -> bool:
    """Root with useradd, userdel and setpriv."""
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("useradd", "userdel", "setpriv"))


@pytest.fixture
def ordinary_user() -> Iterator[User]:
    """A fresh user without a home or login shell, deleted after the test."""
    import pwd

    for entry in pwd.getpwall():  # users left by killed runs
        pid = entry.pw_name[len(USER_PREFIX) :]
        if entry.pw_name.startswith(USER_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
            subprocess.run(["userdel", entry.pw_name], capture_output=True, timeout=30, check=False)
    name = f"{USER_PREFIX}{os.getpid()}"
    subprocess.run(["userdel", name], capture_output=True, timeout=30, check=False)  # leftover
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        yield User(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30, check=False)


# --- Slurm 24.11 root (tests/slurmchroot.py): built, or found in its cache, once after collection
# when a collected test needs it, so that its first build (about 45 s) is not charged to one
# test's timeout; the summary says whether it was built and how long that took. (Here, not in
# tests/integration/conftest.py: a second module named conftest would shadow this one for the
# tests that import helpers from it.)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Build the 24.11 root when a selected test runs on Slurm 24.11 and it can be built here
    (a failure is remembered: those tests then fail with its message)."""
    if not any("slurm24.11" in item.nodeid for item in items) or slurmchroot.why_not():
        return
    try:
        slurmchroot.image()
    except RuntimeError:
        pass  # kept in slurmchroot.BUILD_ERROR; each 24.11 cluster fails with it


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Say how the Slurm 24.11 root was obtained (the first build's time, for the CI budget)."""
    line = slurmchroot.describe()
    if line:
        terminalreporter.write_sep("-", "Slurm 24.11 root")
        terminalreporter.write_line(line)
