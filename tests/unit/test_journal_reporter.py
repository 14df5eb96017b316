"""journald reporter: fields, native protocol over a real datagram socket, fallback, catalog."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from hma.contracts.alert import ALERT_KINDS, Alert
from hma.contracts.model import Action, Severity
from hma.reporters import journal as j

pytestmark = pytest.mark.timeout(30)

XID = Alert(
    kind="raised",
    code="GPU_XID_79",
    component="gpu:0000:3b:00",
    severity=Severity.CRITICAL,
    message="GPU has fallen off the bus",
    action=Action.REBOOT,
    probe="kernel_log",
    details={"line": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234\nsecond line", "xid": 79},
    ts=1764410040.25,
)


@pytest.fixture()
def listener(tmp_path: Path):
    """A bound datagram socket standing in for journald (a real socket, not a mock)."""
    path = tmp_path / "journal.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    try:
        yield path, sock
    finally:
        sock.close()


def test_message_ids_are_fixed_and_distinct() -> None:
    # Pinned: changing the derivation would break every operator's journalctl query.
    assert j.message_id("GPU", "raised") == "13416b3d979b5241a465a8c970d060e5"
    assert j.message_id("HMA", "agent") == j.message_id("HMA", "agent")
    ids = j.all_message_ids()
    assert len(ids) == len(j.ALL_FAMILIES) * len(ALERT_KINDS)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


@pytest.mark.parametrize(
    ("code", "fam"),
    [
        ("GPU_XID_79", "GPU"),
        ("NEURON_X", "NEURON"),
        ("SITE_PROBE_CRITICAL", "SITE"),
        ("HMA_STATE_RESET", "HMA"),
        ("ACME_THING", "OTHER"),
        ("", "HMA"),
    ],
)
def test_family_from_code_prefix(code: str, fam: str) -> None:
    assert j.family(code) == fam


@pytest.mark.parametrize(
    ("kind", "severity", "prio"),
    [
        ("raised", Severity.CRITICAL, 2),
        ("raised", Severity.WARNING, 4),
        ("raised", Severity.UNKNOWN, 5),
        ("escalated", Severity.CRITICAL, 2),
        ("agent", Severity.OK, 6),
        ("cleared", Severity.CRITICAL, 6),
        ("action_requested", Severity.CRITICAL, 5),
        ("action_applied", Severity.CRITICAL, 5),
        ("action_held", Severity.CRITICAL, 4),
        ("action_failed", Severity.CRITICAL, 4),
        ("acknowledged", Severity.WARNING, 5),
    ],
)
def test_priority_mapping(kind: str, severity: Severity, prio: int) -> None:
    assert j.priority(Alert(kind, "GPU_X", "node", severity, "m")) == prio


def test_entry_round_trips_through_a_datagram_socket(listener) -> None:
    path, sock = listener
    err = io.StringIO()
    rep = j.JournalReporter({"socket": str(path)}, stderr=err)
    rep.alert(XID)
    got = j.decode(sock.recv(65536))
    rep.close()
    assert got["MESSAGE"] == "GPU_XID_79 raised (gpu:0000:3b:00): GPU has fallen off the bus"
    assert got["MESSAGE_ID"] == j.message_id("GPU", "raised")
    assert got["PRIORITY"] == "2"
    assert got["SYSLOG_IDENTIFIER"] == "hma"
    assert got["HMA_CODE"] == "GPU_XID_79"
    assert got["HMA_COMPONENT"] == "gpu:0000:3b:00"
    assert got["HMA_SEVERITY"] == "critical"
    assert got["HMA_ACTION"] == "reboot"
    assert got["HMA_PROBE"] == "kernel_log"
    assert got["HMA_KIND"] == "raised"
    assert got["HMA_TS"] == "1764410040.250000"
    assert json.loads(got["HMA_DETAILS"]) == dict(XID.details)
    assert err.getvalue() == "" and rep.sent == 1 and rep.fallbacks == 0


def test_multiline_values_use_the_binary_form() -> None:
    data = j.encode([("MESSAGE", "a\nb"), ("EMPTY", ""), ("X", "y")])
    assert data == b"MESSAGE\n" + (3).to_bytes(8, "little") + b"a\nb\nX=y\n"
    assert j.decode(data) == {"MESSAGE": "a\nb", "X": "y"}


def test_huge_details_are_summarised_as_valid_json() -> None:
    alert = Alert("raised", "SYS_X", "node", Severity.WARNING, "m", details={"out": "x" * 100000})
    value = dict(j.fields(alert))["HMA_DETAILS"]
    assert len(value) < j.DETAILS_CAP + 200
    summary = json.loads(value)
    assert summary["truncated"] is True and summary["size"] > 100000


def test_missing_socket_falls_back_to_stderr(tmp_path: Path) -> None:
    err = io.StringIO()
    rep = j.JournalReporter({"socket": str(tmp_path / "absent.sock")}, stderr=err)
    rep.alert(XID)
    rep.alert(XID)
    lines = err.getvalue().splitlines()
    assert "cannot send to journald" in lines[0] and "FileNotFoundError" in lines[0]
    assert len(lines) == 3  # one notice, then one line per alert
    assert lines[1].startswith("hma: <2> GPU_XID_79 raised (gpu:0000:3b:00): GPU has fallen")
    assert "HMA_SEVERITY=critical" in lines[1] and "details={" in lines[1]
    assert rep.fallbacks == 2 and rep.sent == 0


def test_stale_socket_falls_back_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(path))
    dead.close()  # the path stays, nobody listens: sendto gives ECONNREFUSED
    err = io.StringIO()
    rep = j.JournalReporter({"socket": str(path)}, stderr=err)
    rep.alert(XID)
    assert "ConnectionRefusedError" in err.getvalue() and rep.fallbacks == 1
    os.unlink(path)
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(path))
    live.settimeout(5)
    try:
        rep.alert(XID)
        assert j.decode(live.recv(65536))["HMA_CODE"] == "GPU_XID_79"
    finally:
        live.close()
        rep.close()
    assert "journald reachable again" in err.getvalue().splitlines()[-1]
    assert rep.sent == 1


def test_every_kind_and_family_has_a_catalog_entry() -> None:
    shipped = resources.files("hma.reporters").joinpath("hma.catalog").read_text("utf-8")
    if os.environ.get("HMA_UPDATE_GOLDEN") == "1":
        Path(j.__file__).with_name("hma.catalog").write_text(j.catalog_text(), "utf-8")
        shipped = j.catalog_text()
    assert shipped == j.catalog_text(), "stale hma.catalog: rerun with HMA_UPDATE_GOLDEN=1"
    entries = parse_catalog(shipped)
    assert set(entries) == set(j.all_message_ids())
    for headers in entries.values():
        assert headers["Defined-By"] == "hma" and headers["Subject"]


def parse_catalog(text: str) -> dict[str, dict[str, str]]:
    """The systemd catalog format: ``-- <32 hex> [lang]``, header lines, blank line, body."""
    entries: dict[str, dict[str, str]] = {}
    current = None
    in_headers = False
    for line in text.splitlines():
        if line.startswith("-- "):
            ident = line[3:].split()[0]
            assert re.fullmatch(r"[0-9a-f]{32}", ident), line
            assert ident not in entries, f"duplicate {ident}"
            current = entries[ident] = {}
            in_headers = True
        elif current is None:
            assert line == "" or line.startswith("#"), f"text before the first entry: {line!r}"
        elif in_headers and line == "":
            in_headers = False
        elif in_headers:
            key, sep, value = line.partition(": ")
            assert sep and re.fullmatch(r"[A-Za-z-]+", key), f"bad header {line!r}"
            current[key] = value
    return entries


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="journalctl not installed")
def test_journalctl_compiles_the_catalog(tmp_path: Path) -> None:
    folder = tmp_path / "usr/lib/systemd/catalog"
    folder.mkdir(parents=True)
    (folder / "hma.catalog").write_text(j.catalog_text(), "utf-8")
    root = str(tmp_path)
    subprocess.run(["journalctl", f"--root={root}", "--update-catalog"], check=True, timeout=20)
    listed = subprocess.run(
        ["journalctl", f"--root={root}", "--list-catalog"],
        check=True,
        timeout=20,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    ids = {line.split()[0] for line in listed}
    assert ids == set(j.all_message_ids())
    assert any(line.endswith("hma: @HMA_CODE@ raised on @HMA_COMPONENT@") for line in listed)


def test_docs_list_every_message_id() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "alerting.md"
    text = docs.read_text("utf-8")
    for ident, (fam, kind) in j.all_message_ids().items():
        assert f"| {fam} | {kind} | `{ident}` |" in text
