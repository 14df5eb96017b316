"""The Xid catalogue (generated data) and the shared Xid -> finding mapping."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Action, Clears, Severity
from hma.health.model import HealthModel
from hma.probes.nvidia import xid

ROOT = Path(__file__).resolve().parents[2]
# Every Xid named in the Xid table of REFERENCE.md section 2 (ranges expanded).
REFERENCE_XIDS = [8, 13, 31, 32, 43, 45, 46, 48, 54, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95]
REFERENCE_XIDS += [109, 110, 119, 120, 121, 136, 137, 140, 143, *range(144, 151), 151, 154]
REFERENCE_XIDS += [155, 156, 157, 158, 159, 162, 163, 164, 165, 167, 168, 171, 172]
# Application Xids: the k8s device plugin's list plus the 45-alone rule (REFERENCE 1.4 and 2).
APPLICATION_XIDS = [13, 31, 43, 45, 68]
HARDWARE = {48: Action.REBOOT, 79: Action.REBOOT, 95: Action.REBOOT, 64: Action.REBOOT}
HARDWARE.update({119: Action.REBOOT, 151: Action.REBOOT, 61: Action.REPLACE, 54: Action.REPLACE})


def table_xids() -> list[int]:
    lines = (ROOT / "scripts" / "xid-table.tsv").read_text().splitlines()
    return [int(ln.split("\t")[0]) for ln in lines if ln[:1].isdigit()]


def test_generated_catalogue_is_up_to_date() -> None:
    script = ROOT / "scripts" / "gen-xid-catalogue"
    proc = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()


def test_every_reference_and_table_xid_has_its_own_code() -> None:
    cat = load_builtin()
    assert set(REFERENCE_XIDS) <= set(table_xids())
    for n in table_xids():
        entry = cat.get(f"GPU_XID_{n}")
        assert entry is not None, n
        assert entry.fatal and entry.fail_after == 1
    assert xid.catalogued_xids() == frozenset(table_xids())


@pytest.mark.parametrize("n", APPLICATION_XIDS)
def test_application_xids_never_drain_at_one_occurrence(n: int) -> None:
    cat = load_builtin()
    entry = cat.get(f"GPU_XID_{n}")
    assert entry is not None
    model = HealthModel(cat, "b")
    finding = cat.resolve(xid.xid_finding(n, "0000:3b:00", {}, "kernel_log", 1.0))
    verdict = model.observe_event(finding, 1.0)
    (fault,) = verdict.faults
    assert fault.severity is Severity.WARNING and fault.action is Action.NONE
    assert verdict.draining == () and verdict.action is Action.NONE
    if entry.drains:  # counted: only a repeat on one GPU drains (docs/policy.md)
        assert entry.counted and entry.after >= 5 and entry.within >= 86400


def table_rows() -> list[dict[str, str]]:
    lines = (ROOT / "scripts" / "xid-table.tsv").read_text().splitlines()
    body = [ln for ln in lines if not ln.startswith("#")]
    return list(csv.DictReader(body, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_the_catalogue_has_every_xid_nvidia_publishes() -> None:
    """NVIDIA's Xid catalogue numbers its Xids 1-172 (catalog_generated.go, 2025-10-29)."""
    assert set(range(1, 173)) <= xid.catalogued_xids()
    assert [int(r["xid"]) for r in table_rows()] == list(range(1, 173))


def test_counted_xids_follow_the_investigatory_bucket() -> None:
    counted = sorted(int(e.code[8:]) for e in load_builtin() if e.code[8:].isdigit() and e.counted)
    expected = [
        int(r["xid"])
        for r in table_rows()
        if not r["override"]
        and r["immediate"] in ("RESTART_APP", "IGNORE")
        and r["investigatory"] in ("CONTACT_SUPPORT", "WORKFLOW_XID_13", "WORKFLOW_XID_31")
    ]
    assert counted == expected and {8, 13, 31, 43, 68, 92, 121, 157} <= set(counted)
    for n in counted:
        entry = load_builtin().get(f"GPU_XID_{n}")
        assert entry is not None and entry.after in (5, 10) and entry.within == 86400


# One row per NVIDIA immediate bucket: (bucket, an Xid of it, severity, action, drains,
# reset_gpu, counted). The rule is scripts/gen-xid-catalogue's docstring (docs/gpu.md).
BUCKETS = [
    ("RESET_GPU", 46, Severity.CRITICAL, Action.REBOOT, True, True, False),
    ("RESTART_BM", 79, Severity.CRITICAL, Action.REBOOT, True, False, False),
    ("RESTART_VM", 151, Severity.CRITICAL, Action.REBOOT, True, False, False),
    ("WORKFLOW_XID_48", 48, Severity.CRITICAL, Action.REBOOT, True, False, False),
    ("WORKFLOW_NVLINK_ERR", 74, Severity.CRITICAL, Action.REBOOT, True, False, False),
    ("WORKFLOW_NVLINK5_ERR", 149, Severity.CRITICAL, Action.REBOOT, True, False, False),
    ("CONTACT_SUPPORT", 1, Severity.CRITICAL, Action.REPLACE, True, False, False),
    ("CONTACT_SUPPORT", 142, Severity.CRITICAL, Action.REPLACE, True, False, False),
    ("CHECK_MECHANICALS", 54, Severity.CRITICAL, Action.REPLACE, True, False, False),
    ("RESTART_APP", 39, Severity.CRITICAL, Action.REBOOT, True, False, True),
    ("RESTART_APP", 11, Severity.WARNING, Action.NONE, False, False, False),
    ("IGNORE", 93, Severity.CRITICAL, Action.REBOOT, True, False, True),
    ("IGNORE", 106, Severity.WARNING, Action.NONE, False, False, False),
    ("RESTART_APP", 80, Severity.WARNING, Action.NONE, False, False, False),  # CHECK_APP/CUDA
    ("CHECK_UVM", 159, Severity.WARNING, Action.NONE, False, False, False),
    ("WORKFLOW_XID_45", 45, Severity.WARNING, Action.NONE, False, False, False),
    ("UPDATE_SWFW", 78, Severity.WARNING, Action.NONE, False, False, False),
    ("XID_154", 154, Severity.WARNING, Action.NONE, True, False, False),
]


@pytest.mark.parametrize(
    ("bucket", "n", "severity", "action", "drains", "reset", "counted"), BUCKETS
)
def test_each_bucket_maps_to_one_severity_and_action(
    bucket: str,
    n: int,
    severity: Severity,
    action: Action,
    drains: bool,
    reset: bool,
    counted: bool,
) -> None:
    (row,) = [r for r in table_rows() if r["xid"] == str(n)]
    assert row["immediate"] == bucket and not row["override"]
    entry = load_builtin().get(f"GPU_XID_{n}")
    assert entry is not None
    assert (entry.severity, entry.action, entry.drains) == (severity, action, drains)
    assert (entry.reset_gpu, entry.counted) == (reset, counted)


def test_every_bucket_of_the_table_has_a_row_above() -> None:
    assert {r["immediate"] for r in table_rows() if not r["override"]} == {b[0] for b in BUCKETS}


@pytest.mark.parametrize(
    ("n", "severity"), [(162, Severity.WARNING), (166, Severity.WARNING), (169, Severity.CRITICAL)]
)
def test_xids_without_a_bucket_name_their_class(n: int, severity: Severity) -> None:
    (row,) = [r for r in table_rows() if r["xid"] == str(n)]
    entry = load_builtin().get(f"GPU_XID_{n}")
    assert row["immediate"] == "-" and row["override"] and entry is not None
    assert entry.severity is severity


def test_no_warning_xid_drains_and_hardware_xids_clear_with_a_reboot() -> None:
    for entry in load_builtin():
        if not entry.code.startswith("GPU_XID_"):
            continue
        if entry.drains and entry.code != "GPU_XID_154":
            assert entry.severity is Severity.CRITICAL, entry.code
            assert entry.clears is Clears.REBOOT, entry.code
        if entry.severity is Severity.WARNING and entry.code != "GPU_XID_154":
            assert not entry.drains, entry.code


@pytest.mark.parametrize(("n", "action"), sorted(HARDWARE.items()))
def test_nvidia_buckets_map_to_actions(n: int, action: Action) -> None:
    entry = load_builtin().get(f"GPU_XID_{n}")
    assert entry is not None and entry.action is action and entry.drains


def test_kernel_and_nvml_sightings_of_one_xid_are_one_fault_key() -> None:
    line = xid.parse_xid_line("NVRM: Xid (PCI:0000:8a:00): 79, GPU has fallen off the bus.")
    assert line is not None
    from_log = xid.line_finding(line, {"line": "..."}, "kernel_log", 1.0)
    from_nvml = xid.xid_finding(79, "00000000:8A:00.0", {"event_type": 8}, "nvml", 2.0)
    assert (from_log.component, from_log.code) == (from_nvml.component, from_nvml.code)
    assert from_nvml.component == "gpu:0000:8a:00" and from_nvml.code == "GPU_XID_79"


def test_uncatalogued_xid_is_other_with_the_number() -> None:
    f = xid.xid_finding(999, "0000:01:00", source="nvml")
    assert f.code == "GPU_XID_OTHER" and f.details["xid"] == 999
    entry = load_builtin().get("GPU_XID_OTHER")
    assert entry is not None and not entry.drains


def test_unreadable_pci_falls_back_to_node() -> None:
    assert xid.xid_finding(79, "zz:zz").component == "node"


def test_nvlink5_nonfatal_is_a_warning_fatal_takes_the_catalogue() -> None:
    nonfatal = xid.parse_xid_line(
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x8)"
    )
    fatal = xid.parse_xid_line(
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)"
    )
    assert nonfatal is not None and fatal is not None
    f1 = xid.line_finding(nonfatal, {}, "kernel_log", 0)
    f2 = xid.line_finding(fatal, {}, "kernel_log", 0)
    assert f1.severity is Severity.WARNING and f1.details["nvlink_link"] == 13
    assert f2.severity is None and f2.details["nvlink_unit"] == "NETIR"


@pytest.mark.parametrize(("to", "severity"), [("0x0 (None)", None), ("0x2 (Node Reboot)", "c")])
def test_xid_154_follows_the_new_recovery_action(to: str, severity: object) -> None:
    text = f"NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to {to}"
    line = xid.parse_xid_line(text)
    assert line is not None
    f = xid.line_finding(line, {}, "kernel_log", 0)
    if severity:
        assert f.severity is Severity.CRITICAL and f.action is Action.REBOOT
    else:
        assert f.severity is None  # catalogue: warning, no action


def test_format_xid_line_round_trips() -> None:
    text = xid.format_xid_line("00000000:3B:00.0", 79, "GPU has fallen off the bus.")
    line = xid.parse_xid_line(text)
    assert line is not None and (line.xid, line.pci, line.pid) == (79, "0000:3b:00", "<unknown>")


def test_dedup_counts_repeats_within_the_window() -> None:
    dedup = xid.Dedup(window_s=10)
    f = xid.xid_finding(13, "0000:01:00")
    first = dedup.admit(f, 100.0)
    assert first is not None and first.details["count"] == 1
    assert dedup.admit(f, 101.0) is None
    assert dedup.admit(f, 105.0) is None
    other_gpu = dedup.admit(xid.xid_finding(13, "0000:02:00"), 105.0)
    assert other_gpu is not None  # another component is another fault
    later = dedup.admit(f, 111.0)
    assert later is not None and later.details["count"] == 3


def test_one_xid_through_nvml_and_the_kernel_log_is_one_fault_in_the_health_model() -> None:
    from hma.health.model import HealthModel

    cat = load_builtin()
    model = HealthModel(cat, "boot-1")
    line = xid.parse_xid_line("NVRM: Xid (PCI:0000:3b:00): 48, pid=77, name=python3, DBE")
    assert line is not None
    from_log = xid.line_finding(line, {"line": "..."}, "kernel_log", 1.0)
    from_nvml = xid.xid_finding(48, "00000000:3B:00.0", {"event_type": 8}, "nvml", 1.1)
    model.observe_event(cat.resolve_all([from_log])[0], 1.0)
    verdict = model.observe_event(cat.resolve_all([from_nvml])[0], 1.1)
    (fault,) = verdict.faults
    assert (fault.code, fault.component, fault.count) == ("GPU_XID_48", "gpu:0000:3b:00", 2)
    assert fault.draining and fault.action is Action.REBOOT
    cleared = model.new_boot("boot-2", 100.0)
    assert cleared.faults == ()  # Xid faults clear with a reboot


def test_dedup_keeps_distinct_uncatalogued_xids_apart() -> None:
    dedup = xid.Dedup(window_s=10)
    assert dedup.admit(xid.xid_finding(998, "0000:01:00"), 1.0) is not None
    assert dedup.admit(xid.xid_finding(999, "0000:01:00"), 1.0) is not None
    assert dedup.admit(xid.xid_finding(999, "0000:01:00"), 2.0) is None
