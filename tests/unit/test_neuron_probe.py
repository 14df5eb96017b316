"""The neuron probe over generated sysfs trees (healthy and fault variants)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trn_support import codes, gen_sysfs, make_ctx

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.probes.neuron.probe import EXPECTED_DEVICES, NeuronProbe, trn2_topology

pytestmark = pytest.mark.timeout(60)

PROBE = NeuronProbe()


def run(root: Path, instance: str, **kw):  # type: ignore[no-untyped-def]
    ctx = make_ctx(NeuronProbe, root, instance, **kw)
    snap = PROBE.collect(ctx)
    return snap, PROBE.evaluate(snap, ctx)


@pytest.mark.parametrize("instance", ["trn1.32xlarge", "trn2.48xlarge", "inf2.48xlarge"])
def test_healthy_trees_have_no_findings(tmp_path: Path, instance: str) -> None:
    root = gen_sysfs.build(tmp_path, instance)
    snap, findings = run(root, instance)
    assert findings == []
    assert len(snap["devices"]) == EXPECTED_DEVICES[instance]


FAULTS = {
    "neuron_missing_device": {("NEURON_DEVICE_COUNT", "node")},
    "neuron_core_count": {("NEURON_CORE_COUNT", "neuron:3")},
    "neuron_mem_ecc": {("NEURON_MEM_ECC_UNCORRECTED", "neuron:2")},
    "neuron_sram_ecc": {("NEURON_SRAM_ECC_UNCORRECTED", "neuron:5")},
    "neuron_mem_ecc_repairable": {("NEURON_MEM_ECC_REPAIRABLE", "neuron:1")},
    "neuron_topology": {("NEURON_TOPOLOGY", "neuron:0")},
    "neuron_unreadable": {("NEURON_READ_FAILED", "neuron:4")},
    "neuron_missing_file": {("NEURON_READ_FAILED", "neuron:6")},
    "neuron_garbage": {("NEURON_READ_FAILED", "neuron:7")},
    "neuron_doc_layout": set(),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_variants_on_trn2(tmp_path: Path, fault: str) -> None:
    root = gen_sysfs.build(tmp_path, "trn2.48xlarge", [fault])
    _snap, findings = run(root, "trn2.48xlarge")
    assert codes(findings) == FAULTS[fault]
    cat = load_builtin()
    for f in findings:
        assert f.code in cat


def test_missing_device_details_and_severity(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge", ["neuron_missing_device"])
    _snap, findings = run(root, "trn1.32xlarge")
    (f,) = findings
    assert f.details["missing"] == [15] and f.details["found"] == 15
    assert load_builtin().resolve(f).severity is Severity.CRITICAL


def test_read_failure_names_the_path_and_other_checks_go_on(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge", ["neuron_unreadable", "neuron_mem_ecc"])
    _snap, findings = run(root, "trn1.32xlarge")
    unread = [f for f in findings if f.code == "NEURON_READ_FAILED"]
    assert len(unread) == 1 and unread[0].severity is Severity.UNKNOWN
    assert unread[0].details["path"].endswith("neuron4/stats/hardware/mem_ecc_uncorrected")
    assert str(tmp_path) in unread[0].message
    assert ("NEURON_MEM_ECC_UNCORRECTED", "neuron:2") in codes(findings)


def test_core_count_without_trailing_newline_is_read(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn2.48xlarge")
    raw = (gen_sysfs.neuron_dev(root, 0) / "core_count").read_bytes()
    assert raw == b"4"
    snap, _ = run(root, "trn2.48xlarge")
    assert snap["devices"]["0"]["core_count"] == 4


def test_expected_core_count_option(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "inf2.48xlarge")
    _snap, findings = run(root, "inf2.48xlarge", expected_core_count=4)
    assert len(findings) == 12 and {f.code for f in findings} == {"NEURON_CORE_COUNT"}


def test_expected_devices_option_overrides_the_table(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "inf2.48xlarge")
    _snap, findings = run(root, "inf2.48xlarge", expected_devices=16)
    assert codes(findings) == {("NEURON_DEVICE_COUNT", "node")}
    assert findings[0].details["missing"] == [12, 13, 14, 15]
    _snap, findings = run(root, "inf2.48xlarge", expected_devices=8)
    assert findings[0].severity is Severity.WARNING  # more than expected: not a drain


def test_symmetry_check_without_documented_topology(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge", ["neuron_topology"])
    _snap, findings = run(root, "trn1.32xlarge")
    # neuron0 now lists 9 (which does not list 0) and no longer lists 12 (which lists 0)
    assert codes(findings) == {("NEURON_TOPOLOGY", "neuron:0"), ("NEURON_TOPOLOGY", "neuron:12")}


def test_expected_topology_option(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn2.48xlarge")
    topo = trn2_topology()
    topo["5"] = [1, 4, 9, 7]
    _snap, findings = run(root, "trn2.48xlarge", expected_topology=topo)
    assert codes(findings) == {("NEURON_TOPOLOGY", "neuron:5")}
    _snap, findings = run(root, "trn2.48xlarge", expected_topology=topo, check_topology=False)
    assert findings == []


def test_absent_devices_apply_only_when_expected(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    assert PROBE.applies(make_ctx(NeuronProbe, tmp_path)) is not None
    ctx = make_ctx(NeuronProbe, tmp_path, "trn1.32xlarge")
    assert PROBE.applies(ctx) is None
    findings = PROBE.evaluate(PROBE.collect(ctx), ctx)
    assert codes(findings) == {("NEURON_DEVICE_COUNT", "node")}
    assert findings[0].details["found"] == 0


# --- growth of totals ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "group,counter,code",
    [
        ("status", "hw_error", "NEURON_CORE_HW_ERROR"),
        ("status", "hw_dma_abort_error", "NEURON_CORE_HW_ERROR"),
        ("status", "hw_collectives_error", "NEURON_CORE_HW_ERROR"),
        ("status", "hw_hbm_ue_error", "NEURON_CORE_UE_ERROR"),
        ("status", "hw_nc_ue_error", "NEURON_CORE_UE_ERROR"),
        ("other_info", "reset_fail_count", "NEURON_RESET_FAILED"),
    ],
)
def test_growing_totals_are_faults(tmp_path: Path, group: str, counter: str, code: str) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    first, findings = run(root, "trn1.32xlarge")
    assert findings == []
    gen_sysfs.set_neuron_counter(root, 3, 1, group, counter, 2)
    second, findings = run(root, "trn1.32xlarge", previous=first)
    assert codes(findings) == {(code, "neuron:3")}
    (item,) = findings[0].details["counters"]
    assert item == {"core": 1, "counter": counter, "total": 2, "grown": 2}
    # steady afterwards: no growth, no finding
    _third, findings = run(root, "trn1.32xlarge", previous=second)
    assert findings == []


def test_totals_going_down_are_a_reset_not_a_fault(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    gen_sysfs.set_neuron_counter(root, 0, 0, "status", "hw_error", 9)
    first, _ = run(root, "trn1.32xlarge")
    gen_sysfs.set_neuron_counter(root, 0, 0, "status", "hw_error", 1)
    _second, findings = run(root, "trn1.32xlarge", previous=first)
    assert findings == []


def test_first_run_has_no_baseline(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    gen_sysfs.set_neuron_counter(root, 0, 0, "status", "hw_error", 9)
    _snap, findings = run(root, "trn1.32xlarge")
    assert findings == []


def test_after_a_reboot_the_baseline_is_zero(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    gen_sysfs.set_neuron_counter(root, 2, 0, "status", "hw_error", 50)
    before, _ = run(root, "trn1.32xlarge", boot_id="boot-1")
    gen_sysfs.set_neuron_counter(root, 2, 0, "status", "hw_error", 3)  # since the new boot
    _snap, findings = run(root, "trn1.32xlarge", previous=before, boot_id="boot-2")
    assert codes(findings) == {("NEURON_CORE_HW_ERROR", "neuron:2")}
    assert findings[0].details["counters"][0]["grown"] == 3


def test_doc_layout_and_names_are_read(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge", ["neuron_doc_layout"])
    status = gen_sysfs.neuron_dev(root, 1) / "neuron_core0" / "status"
    assert (status / "infer_failed_to_queue").is_dir()
    wanted = ["hw_error", "execute_failed_to_queue"]
    first, _ = run(root, "trn1.32xlarge", status_counters=wanted)
    assert first["devices"]["1"]["cores"]["0"]["status"] == {
        "hw_error": 0,
        "execute_failed_to_queue": 0,
    }
    (status / "hw_error" / "total").write_text("4\n")
    (status / "infer_failed_to_queue" / "total").write_text("1\n")
    _snap, findings = run(root, "trn1.32xlarge", previous=first, status_counters=wanted)
    assert codes(findings) == {("NEURON_CORE_HW_ERROR", "neuron:1")}
    grown = {i["counter"] for i in findings[0].details["counters"]}
    assert grown == {"hw_error", "execute_failed_to_queue"}


def test_oneshot_takes_two_samples(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    gen_sysfs.set_neuron_counter(root, 0, 0, "status", "hw_error", 9)
    snap, findings = run(root, "trn1.32xlarge", oneshot=True, oneshot_sample_s=0.01)
    assert "baseline" in snap and findings == []
    # evaluate is pure: a baseline that differs from the current sample is growth
    snap["baseline"]["devices"]["0"]["cores"]["0"]["status"]["hw_error"] = 5
    ctx = make_ctx(NeuronProbe, root, "trn1.32xlarge", oneshot=True)
    assert codes(PROBE.evaluate(snap, ctx)) == {("NEURON_CORE_HW_ERROR", "neuron:0")}


def test_generator_makes_real_sysfs_symlinks(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn2.48xlarge")
    link = root / "class" / "neuron_device" / "neuron3"
    assert link.is_symlink() and link.resolve() == gen_sysfs.neuron_dev(root, 3).resolve()
    sub = gen_sysfs.neuron_dev(root, 3) / "subsystem"
    assert sub.is_symlink() and sub.resolve() == (root / "class" / "neuron_device").resolve()


@pytest.mark.parametrize("value", ["-1", "9" * 30, "\u0663", "1_0", "1e3", " 0x", "\xff"])
def test_garbage_counters_are_unknown_not_faults(tmp_path: Path, value: str) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    dev = gen_sysfs.neuron_dev(root, 2)
    (dev / "stats/hardware/mem_ecc_uncorrected").write_text(value + "\n")
    (dev / "neuron_core0/stats/status/hw_error/total").write_text(value + "\n")
    (dev / "core_count").write_text(value)
    (dev / "connected_devices").write_text(f"1, {value}\n")
    _snap, findings = run(root, "trn1.32xlarge", previous={"devices": {}, "boot_id": "boot-1"})
    assert {(f.code, f.component, f.severity) for f in findings} == {
        ("NEURON_READ_FAILED", "neuron:2", Severity.UNKNOWN)
    }
    assert len(findings) == 4


@pytest.mark.parametrize("shape", ["file", "fifo", "loop", "dangling"])
def test_unreadable_device_folder_is_unknown_not_zero_devices(tmp_path: Path, shape: str) -> None:
    from mutate import break_folder

    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    base = root / "devices/virtual/neuron_device"
    break_folder(base, shape)
    ctx = make_ctx(NeuronProbe, root, "trn1.32xlarge")
    assert PROBE.applies(ctx) is None
    snap = PROBE.collect(ctx)
    (f,) = PROBE.evaluate(snap, ctx)
    assert (f.code, f.component, f.severity) == ("NEURON_READ_FAILED", "node", Severity.UNKNOWN)


def test_unreadable_core_folders_are_unknown(tmp_path: Path) -> None:
    from mutate import break_folder

    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    dev = gen_sysfs.neuron_dev(root, 5)
    break_folder(dev / "neuron_core1/stats/status", "loop")
    break_folder(dev / "neuron_core0/stats/other_info/reset_fail_count", "fifo")
    _snap, findings = run(root, "trn1.32xlarge")
    assert {(f.code, f.component) for f in findings} == {("NEURON_READ_FAILED", "neuron:5")}


def test_fifo_in_place_of_a_counter_is_unknown_not_a_hang(tmp_path: Path) -> None:
    import os

    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    counter = gen_sysfs.neuron_dev(root, 3) / "stats/hardware/sram_ecc_uncorrected"
    counter.unlink()
    os.mkfifo(counter)  # opening a FIFO for reading blocks until a writer comes: never here
    _snap, findings = run(root, "trn1.32xlarge")
    (f,) = findings
    assert (f.code, f.component, f.severity) == ("NEURON_READ_FAILED", "neuron:3", Severity.UNKNOWN)
    assert "not a regular file" in f.message


def test_a_total_unread_last_run_is_not_growth(tmp_path: Path) -> None:
    """Last run could not read a total (None): this run's value is not "growth from zero"."""
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    gen_sysfs.set_neuron_counter(root, 1, 0, "status", "hw_error", 7)
    ctx = make_ctx(NeuronProbe, root, "trn1.32xlarge")
    previous = PROBE.collect(ctx)
    previous["devices"]["1"]["cores"]["0"]["status"]["hw_error"] = None
    _snap, findings = run(root, "trn1.32xlarge", previous=previous)
    assert findings == []
    previous["devices"] = ["not", "a", "mapping"]  # a stored snapshot of another shape
    _snap, findings = run(root, "trn1.32xlarge", previous=previous)
    assert findings == []


@pytest.mark.parametrize(
    "value", ["\u200812", "12\u3000", "\u00a01", "0x10", str(2**64 - 1), str(2**32 - 1)]
)
def test_unicode_spaces_hex_and_unsigned_minus_one_are_unknown(tmp_path: Path, value: str) -> None:
    """Decimal sysfs files: a Unicode space, ``0x10`` (not 16 errors) or -1 written unsigned ("not
    available") is a read failure, never a count, a mismatch or growth."""
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    first, _ = run(root, "trn1.32xlarge")
    dev = gen_sysfs.neuron_dev(root, 2)
    (dev / "stats/hardware/mem_ecc_uncorrected").write_text(value + "\n")
    (dev / "neuron_core0/stats/status/hw_error/total").write_text(value + "\n")
    (dev / "neuron_core1/stats/other_info/reset_fail_count/total").write_text(value + "\n")
    (dev / "core_count").write_text(value)
    (dev / "connected_devices").write_text(f"1,{value}\n")
    _snap, findings = run(root, "trn1.32xlarge", previous=first)
    assert {(f.code, f.component, f.severity) for f in findings} == {
        ("NEURON_READ_FAILED", "neuron:2", Severity.UNKNOWN)
    }
    assert len(findings) == 5


def test_a_status_folder_unreadable_in_the_first_sample_is_not_growth(tmp_path: Path) -> None:
    """Issue 23 (6): a total with no baseline (its folder unreadable, or the total absent, in the
    previous snapshot) establishes one; only what it grows by afterwards is a fault."""
    from mutate import broken

    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    gen_sysfs.set_neuron_counter(root, 4, 1, "status", "hw_hbm_ue_error", 40)
    gen_sysfs.set_neuron_counter(root, 4, 1, "other_info", "reset_fail_count", 3)
    core = gen_sysfs.neuron_dev(root, 4) / "neuron_core1/stats"
    with broken(core / "status", "loop"), broken(core / "other_info/reset_fail_count", "fifo"):
        first, findings = run(root, "trn1.32xlarge")
    assert codes(findings) == {("NEURON_READ_FAILED", "neuron:4")}
    second, findings = run(root, "trn1.32xlarge", previous=first)
    assert findings == []  # the lifetime totals are the baseline, not new errors
    gen_sysfs.set_neuron_counter(root, 4, 1, "status", "hw_hbm_ue_error", 41)
    _third, findings = run(root, "trn1.32xlarge", previous=second)
    assert codes(findings) == {("NEURON_CORE_UE_ERROR", "neuron:4")}
    assert findings[0].details["counters"][0]["grown"] == 1


def test_oneshot_first_sample_without_a_total_is_not_growth(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    gen_sysfs.set_neuron_counter(root, 0, 0, "status", "hw_error", 9)
    gen_sysfs.set_neuron_counter(root, 0, 0, "other_info", "reset_fail_count", 2)
    snap, _ = run(root, "trn1.32xlarge", oneshot=True, oneshot_sample_s=0.01)
    first_core = snap["baseline"]["devices"]["0"]["cores"]["0"]
    first_core["status"], first_core["other"] = {}, {}  # the folders were unreadable then
    snap["baseline"]["devices"]["1"] = {"cores": {}}  # and the core folders not listed
    ctx = make_ctx(NeuronProbe, root, "trn1.32xlarge", oneshot=True)
    assert PROBE.evaluate(snap, ctx) == []
