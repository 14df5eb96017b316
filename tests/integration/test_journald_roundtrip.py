"""journald reporter against a real, standalone systemd-journald.

The journald runs in its own namespace (``systemd-journald hmat<pid>``: socket
/run/systemd/journal.hmat<pid>/socket, read with ``journalctl --namespace``), so it neither needs
nor disturbs a host journald or other test runs. One journald per module, stopped by PID, its files
removed; leftovers of killed runs are swept at the start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from hma.model import Action, Severity
from hma.reporters import Alert
from hma.reporters import journal as j

JOURNALD = "/lib/systemd/systemd-journald"
PREFIX = "hmat"
PIDFILES = Path("/tmp")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="standalone journald needs root"),
    pytest.mark.skipif(
        not os.access(JOURNALD, os.X_OK) or shutil.which("journalctl") is None,
        reason="systemd-journald or journalctl not installed",
    ),
]


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        if owner.isdigit() and _alive(int(owner)):
            continue  # another run in progress
        text = pidfile.read_text().strip()
        if text.isdigit():
            _stop(int(text), ns)
        _remove_files(ns)
        pidfile.unlink()


@pytest.fixture(scope="module")
def journald() -> Iterator[tuple[str, str]]:
    """(namespace, socket path) of a private journald for this module."""
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


def read_back(ns: str, match: str, count: int) -> list[dict]:
    """Entries matching ``FIELD=value``, polled until ``count`` arrived (journald is async)."""
    deadline = time.monotonic() + 10
    while True:
        out = subprocess.run(
            ["journalctl", f"--namespace={ns}", "-o", "json", "--no-pager", match],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout
        entries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if len(entries) >= count or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)


def test_alerts_round_trip_with_their_fields(journald) -> None:
    ns, sock = journald
    rep = j.JournalReporter({"socket": sock})
    raised = Alert(
        "raised",
        "GPU_XID_79",
        "gpu:0000:3b:00",
        Severity.CRITICAL,
        "GPU has fallen off the bus\nsecond line",
        Action.REBOOT,
        "kernel_log",
        {"line": "NVRM: Xid (PCI:0000:3b:00): 79", "xid": 79},
        1764410040.0,
    )
    rep.alert(raised)
    rep.alert(
        Alert(
            "action_held",
            "GPU_XID_79",
            "gpu:0000:3b:00",
            Severity.CRITICAL,
            "reboot held: circuit breaker open",
            Action.REBOOT,
            "kernel_log",
            {"why": "breaker"},
        )
    )
    rep.alert(
        Alert(
            "cleared",
            "GPU_XID_79",
            "gpu:0000:3b:00",
            Severity.CRITICAL,
            "cleared by reboot",
            Action.REBOOT,
            "kernel_log",
        )
    )
    rep.alert(Alert("agent", "HMA_STATE_RESET", "node", Severity.WARNING, "state reset"))
    rep.close()
    assert rep.sent == 4 and rep.fallbacks == 0

    entries = read_back(ns, "HMA_CODE=GPU_XID_79", 3)
    by_kind = {e["HMA_KIND"]: e for e in entries}
    assert set(by_kind) == {"raised", "action_held", "cleared"}
    first = by_kind["raised"]
    assert first["MESSAGE"] == (
        "GPU_XID_79 raised (gpu:0000:3b:00): GPU has fallen off the bus\nsecond line"
    )
    assert first["PRIORITY"] == "2"
    assert first["MESSAGE_ID"] == j.message_id("GPU", "raised")
    assert first["SYSLOG_IDENTIFIER"] == "hma"
    assert (first["HMA_COMPONENT"], first["HMA_SEVERITY"]) == ("gpu:0000:3b:00", "critical")
    assert (first["HMA_ACTION"], first["HMA_PROBE"]) == ("reboot", "kernel_log")
    assert json.loads(first["HMA_DETAILS"])["xid"] == 79
    assert by_kind["action_held"]["PRIORITY"] == "4"
    assert by_kind["action_held"]["MESSAGE_ID"] == j.message_id("GPU", "action_held")
    assert by_kind["cleared"]["PRIORITY"] == "6"

    # the documented queries work: by severity, by MESSAGE_ID
    agent = read_back(ns, f"MESSAGE_ID={j.message_id('HMA', 'agent')}", 1)
    assert [e["HMA_CODE"] for e in agent] == ["HMA_STATE_RESET"]
    crit = read_back(ns, "HMA_SEVERITY=warning", 1)
    assert [e["MESSAGE"] for e in crit] == ["HMA_STATE_RESET (node): state reset"]


def test_every_message_id_is_accepted(journald) -> None:
    ns, sock = journald
    rep = j.JournalReporter({"socket": sock})
    for fam in j.ALL_FAMILIES:
        code = "ACME_ROUNDTRIP" if fam == j.OTHER_FAMILY else f"{fam}_ROUNDTRIP"
        for kind in j.ALERT_KINDS:
            rep.alert(Alert(kind, code, "node", Severity.OK, kind))
    rep.close()
    n = len(j.all_message_ids())
    entries = read_back(ns, "SYSLOG_IDENTIFIER=hma", n)
    got = {e["MESSAGE_ID"] for e in entries if e["HMA_CODE"].endswith("_ROUNDTRIP")}
    assert got == set(j.all_message_ids())
