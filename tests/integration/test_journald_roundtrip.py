"""journald reporter against a real, standalone systemd-journald (fixture in tests/conftest.py)."""

from __future__ import annotations

import json

import pytest
from conftest import journald_usable, read_back

from hma.contracts.alert import Alert
from hma.contracts.model import Action, Severity
from hma.reporters import journal as j

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not journald_usable(), reason="needs root, systemd-journald, journalctl"),
]


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

    entries = read_back(ns, "HMA_CODE=GPU_XID_79", count=3)
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
    agent = read_back(ns, f"MESSAGE_ID={j.message_id('HMA', 'agent')}", "HMA_CODE=HMA_STATE_RESET")
    assert [e["HMA_CODE"] for e in agent] == ["HMA_STATE_RESET"]
    crit = read_back(ns, "HMA_SEVERITY=warning", "SYSLOG_IDENTIFIER=hma")
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
    entries = read_back(ns, "HMA_KIND=agent", "HMA_CODE=ACME_ROUNDTRIP")
    assert entries  # the last one sent arrived; earlier ones precede it
    entries = read_back(ns, "SYSLOG_IDENTIFIER=hma", count=n)
    got = {e["MESSAGE_ID"] for e in entries if e.get("HMA_CODE", "").endswith("_ROUNDTRIP")}
    assert got == set(j.all_message_ids())
