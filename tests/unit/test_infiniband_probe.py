"""The infiniband probe over real captured class/infiniband trees (prometheus/procfs and
node_exporter test data, tests/fixtures/roots/ib-*.src.txt) and mutations of them: a downed port,
a counter storm between two samples, link flaps, a slower rate, unreadable files."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import apply_file, break_folder, budget, file_mutation, folder_mutation
from trn_support import FIXTURES, codes, gen_sysfs, make_ctx

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.probes.infiniband.ports import (
    IB,
    PMA_WIDTHS,
    InfinibandProbe,
    growth,
    parse_rate,
)

pytestmark = pytest.mark.timeout(60)

PROCFS = FIXTURES / "roots" / "ib-procfs"
NODE_EXPORTER = FIXTURES / "roots" / "ib-node-exporter"
PORTS = {"hfi1_0/1": 100.0, "mlx4_0/1": 40.0, "mlx4_0/2": 40.0, "mlx5_0/1": 25.0}


def run(root: Path, previous: Any = None, now: float = 1000.0, **options: Any):  # type: ignore[no-untyped-def]
    probe = InfinibandProbe()
    ctx = make_ctx(InfinibandProbe, root, previous=previous, clock=lambda: now, **options)
    snap = probe.collect(ctx)
    return snap, probe.evaluate(snap, ctx)


def copy(tree: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "root"
    shutil.copytree(tree, dest, symlinks=True)
    return dest


def port_file(root: Path, port: str, name: str) -> Path:
    dev, num = port.split("/")
    return root / IB / dev / "ports" / num / name


def bump(root: Path, port: str, counter: str, by: int) -> None:
    path = port_file(root, port, f"counters/{counter}")
    path.write_text(f"{int(path.read_text()) + by}\n")


def test_real_procfs_capture_reads_without_a_finding() -> None:
    snap, findings = run(PROCFS)
    assert findings == []
    assert {k: p["rate_gbps"] for k, p in snap["ports"].items()} == PORTS
    assert all(p["state"] == "ACTIVE" for p in snap["ports"].values())
    # every judged counter the capture has is read (hfi1 and mlx4 lack none of them)
    assert set(snap["ports"]["mlx5_0/1"]["counters"]) >= {"symbol_error", "link_downed"}
    assert snap["learned"] == sorted(PORTS)


def test_real_node_exporter_capture_reads_without_a_finding() -> None:
    snap, findings = run(NODE_EXPORTER)
    assert findings == []
    i40iw = snap["ports"]["i40iw0/1"]
    assert i40iw["rate_gbps"] == 10.0  # "10 Gb/sec (4X)": no speed name
    assert i40iw["no_pma"] and i40iw["counters"] == {}  # "N/A (no PMA)": not judged, not unknown


def test_a_second_run_on_the_unchanged_capture_finds_nothing() -> None:
    first, _ = run(PROCFS, now=1000.0)
    _snap, findings = run(PROCFS, previous=first, now=1030.0)
    assert findings == []


def test_oneshot_samples_twice(tmp_path: Path) -> None:
    probe = InfinibandProbe()
    ctx = make_ctx(InfinibandProbe, PROCFS, oneshot=True, oneshot_sample_s=0.01)
    snap = probe.collect(ctx)
    assert "baseline" in snap and probe.evaluate(snap, ctx) == []


def test_downed_port_that_was_active_is_critical(tmp_path: Path) -> None:
    root = copy(PROCFS, tmp_path)
    healthy, _ = run(root)
    port_file(root, "mlx4_0/2", "state").write_text("1: DOWN\n")
    port_file(root, "mlx4_0/2", "phys_state").write_text("2: Polling\n")
    snap, findings = run(root, previous=healthy, now=1030.0)
    assert codes(findings) == {("IB_PORT_DOWN", "ib:mlx4_0/2")}
    assert findings[0].severity is None  # the catalogue's: critical, drains
    assert load_builtin().resolve(findings[0]).severity is Severity.CRITICAL
    assert load_builtin().entry("IB_PORT_DOWN").drains
    assert findings[0].details["phys_state"] == "2: Polling"
    assert "rate_gbps" not in snap["ports"]["mlx4_0/2"]  # rate is not read on a down port


def test_down_port_never_seen_active_is_not_a_fault_unless_expected(tmp_path: Path) -> None:
    root = copy(PROCFS, tmp_path)
    port_file(root, "mlx4_0/2", "state").write_text("1: DOWN\n")
    _snap, findings = run(root)
    assert findings == []  # an unused second port
    _snap, findings = run(root, expected_ports=["mlx4_0/2"])
    assert codes(findings) == {("IB_PORT_DOWN", "ib:mlx4_0/2")}
    _snap, findings = run(root, previous=None, learn_ports=False)
    assert findings == []


def test_learned_ports_survive_a_reboot(tmp_path: Path) -> None:
    root = copy(PROCFS, tmp_path)
    healthy, _ = run(root)
    port_file(root, "mlx5_0/1", "state").write_text("2: INIT\n")
    probe = InfinibandProbe()
    ctx = make_ctx(InfinibandProbe, root, previous=healthy, boot_id="boot-2")
    findings = probe.evaluate(probe.collect(ctx), ctx)
    assert codes(findings) == {("IB_PORT_DOWN", "ib:mlx5_0/1")}


def test_missing_device(tmp_path: Path) -> None:
    root = copy(PROCFS, tmp_path)
    healthy, _ = run(root)
    shutil.rmtree(root / IB / "hfi1_0")
    _snap, findings = run(root, previous=healthy, now=1030.0, expected_ports=["mlx5_0/1"])
    assert codes(findings) == {("IB_PORT_MISSING", "ib:hfi1_0/1")}
    assert findings[0].severity is Severity.WARNING  # learned, not configured
    _snap, findings = run(root, expected_ports=["hfi1_0/1"])
    assert codes(findings) == {("IB_PORT_MISSING", "ib:hfi1_0/1")}
    assert findings[0].severity is None  # configured: the catalogue's critical


@pytest.mark.parametrize(
    ("added", "code"),
    [(60, "IB_COUNTER_RATE_WARN"), (600, "IB_COUNTER_RATE_CRIT"), (5, None)],
)
def test_symbol_error_storm_between_two_samples(
    tmp_path: Path, added: int, code: str | None
) -> None:
    root = copy(PROCFS, tmp_path)
    before, _ = run(root, now=1000.0)
    bump(root, "mlx5_0/1", "symbol_error", added)
    _snap, findings = run(root, previous=before, now=1030.0)
    if code is None:
        assert findings == []  # 0.17/s: under the limit (10 in 30 s, infiniband-diags)
    else:
        assert codes(findings) == {(code, "ib:mlx5_0/1")}
        item = findings[0].details["counters"][0]
        assert item["counter"] == "symbol_error" and item["rate_per_s"] == added / 30


def test_counter_reset_or_saturation_is_not_growth(tmp_path: Path) -> None:
    root = copy(PROCFS, tmp_path)
    port_file(root, "mlx4_0/1", "counters/port_rcv_errors").write_text("65535\n")
    before, _ = run(root, now=1000.0)
    _snap, findings = run(root, previous=before, now=1030.0)
    assert findings == []
    bump(root, "mlx4_0/1", "port_rcv_errors", -65000)  # perfquery -R: reset
    _snap, findings = run(root, previous=before, now=1030.0)
    assert findings == []
    assert growth("port_rcv_errors", 65535, 100) is None
    assert growth("link_downed", 255, 254) is None and growth("link_downed", 3, 1) == 2
    assert PMA_WIDTHS["local_link_integrity_errors"] == 4


@pytest.mark.parametrize(
    ("counter", "text"),
    [
        ("port_rcv_errors", f"{2**64 - 1}\n"),  # wider than the 16-bit field
        ("port_rcv_errors", "65536\n"),
        ("symbol_error", f"{2**32 - 1}\n"),
        ("link_downed", "256\n"),  # 8 bits
        ("local_link_integrity_errors", "16\n"),  # 4 bits
        ("port_rcv_errors", "-1\n"),
        ("port_rcv_errors", "12abc\n"),
    ],
)
def test_a_value_beyond_the_counter_s_width_is_unknown(
    tmp_path: Path, counter: str, text: str
) -> None:
    root = copy(PROCFS, tmp_path)
    healthy, _ = run(root)
    port_file(root, "mlx5_0/1", f"counters/{counter}").write_text(text)
    _snap, findings = run(root, previous=healthy, now=1030.0)
    assert codes(findings) == {("IB_READ_FAILED", "ib:mlx5_0/1")}
    assert findings[0].severity is Severity.UNKNOWN
    width = PMA_WIDTHS[counter]
    port_file(root, "mlx5_0/1", f"counters/{counter}").write_text(f"{(1 << width) - 1}\n")
    _snap, findings = run(root, previous=healthy, now=1030.0)
    assert findings == []  # at the width's maximum: saturated, not judged


def test_link_flaps_in_a_window(tmp_path: Path) -> None:
    root = copy(PROCFS, tmp_path)
    snap, _ = run(root, now=1000.0)
    bump(root, "mlx5_0/1", "link_downed", 1)
    snap, findings = run(root, previous=snap, now=1030.0)
    assert codes(findings) == {("IB_LINK_FLAPPING", "ib:mlx5_0/1")}
    assert findings[0].severity is Severity.WARNING and findings[0].details["link_downed"] == 1
    bump(root, "mlx5_0/1", "link_downed", 2)
    snap, findings = run(root, previous=snap, now=1060.0)
    assert findings[0].severity is None and findings[0].details["link_downed"] == 3
    snap, findings = run(root, previous=snap, now=1090.0)
    assert codes(findings) == {("IB_LINK_FLAPPING", "ib:mlx5_0/1")}  # still in the hour
    _snap, findings = run(root, previous=snap, now=1060.0 + 3601)
    assert findings == []  # the window passed without a flap


def test_rate_below_best_or_expected(tmp_path: Path) -> None:
    root = copy(PROCFS, tmp_path)
    healthy, _ = run(root)
    port_file(root, "mlx4_0/1", "rate").write_text("10 Gb/sec (1X QDR)\n")
    _snap, findings = run(root, previous=healthy, now=1030.0)
    assert codes(findings) == {("IB_RATE_DEGRADED", "ib:mlx4_0/1")}
    assert findings[0].severity is Severity.WARNING
    _snap, findings = run(PROCFS, expected_rate_gbps=40)
    assert codes(findings) == {("IB_RATE_DEGRADED", "ib:mlx5_0/1")}  # 25 Gb/sec (1X EDR)
    assert findings[0].severity is None


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("state", "abc\n"),
        ("state", "4: ACTIVE\u2008\n"),
        ("state", "9: BROKEN\n"),
        ("rate", "fast\n"),
        ("counters/symbol_error", "N/A\n"),
        ("counters/symbol_error", "0x10\n"),
    ],
)
def test_unreadable_is_unknown_never_a_fault(tmp_path: Path, rel: str, text: str) -> None:
    root = copy(PROCFS, tmp_path)
    healthy, _ = run(root)
    port_file(root, "mlx5_0/1", rel).write_text(text)
    _snap, findings = run(root, previous=healthy, now=1030.0)
    assert codes(findings) == {("IB_READ_FAILED", "ib:mlx5_0/1")}
    assert findings[0].severity is Severity.UNKNOWN


def test_unreadable_device_is_unknown_and_not_missing(tmp_path: Path) -> None:
    root = copy(PROCFS, tmp_path)
    healthy, _ = run(root)
    ports = root / IB / "hfi1_0" / "ports"
    shutil.rmtree(ports)
    ports.symlink_to("nowhere")
    _snap, findings = run(root, previous=healthy, now=1030.0)
    assert codes(findings) == {("IB_READ_FAILED", "ib:hfi1_0")}


def test_efa_devices_are_left_to_the_efa_probe(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    snap, findings = run(root)
    assert findings == []
    assert list(snap["ports"]) == ["mlx5_0/1"] and len(snap["excluded"]) == 32


def test_no_rdma_device_is_unsupported(tmp_path: Path) -> None:
    probe = InfinibandProbe()
    assert probe.applies(make_ctx(InfinibandProbe, tmp_path)) == "no InfiniBand/RoCE ports"
    ctx = make_ctx(InfinibandProbe, tmp_path, expected_ports=["mlx5_0/1"])
    assert probe.applies(ctx) is None
    findings = probe.evaluate(probe.collect(ctx), ctx)
    assert codes(findings) == {("IB_PORT_MISSING", "ib:mlx5_0/1")}


def test_rate_parser() -> None:
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("10 Gb/sec (4X)") == 10.0
    for bad in ("400 Gb/sec", "400Gb/sec (4X NDR)", "-1 Gb/sec (4X)", "1e3 Gb/sec (4X)"):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_options_are_checked() -> None:
    opts = InfinibandProbe.options
    assert opts["expected_ports"].validate(["mlx5_0/1", "ibp3s0/2"]) is None
    assert opts["expected_ports"].validate(["mlx5_0"]) is not None
    assert opts["expected_ports"].validate(["../x/1"]) is not None
    assert opts["rate_limits"].validate({"symbol_error": 0}) is not None
    assert opts["exclude_vendor_ids"].validate(["0x1d0f"]) is None


# --- property: garbage in the real capture is unknown, never a fault ---------------------------

TARGETS = (
    "hfi1_0/ports/1/state",
    "mlx4_0/ports/2/state",
    "mlx4_0/ports/1/rate",
    "mlx5_0/ports/1/rate",
    "mlx5_0/ports/1/phys_state",
    "mlx5_0/ports/1/link_layer",
    "mlx5_0/ports/1/counters/symbol_error",
    "mlx5_0/ports/1/counters/link_downed",
    "mlx4_0/ports/1/counters/port_rcv_errors",
    "hfi1_0/ports/1/counters/port_xmit_discards",
)
FOLDERS = ("mlx4_0", "mlx4_0/ports", "hfi1_0/ports/1", "mlx5_0/ports/1/counters")


@budget(40)
@given(
    files=st.lists(st.tuples(st.sampled_from(TARGETS), file_mutation()), max_size=3),
    folders=st.lists(st.tuples(st.sampled_from(FOLDERS), folder_mutation()), max_size=1),
)
def test_garbage_in_the_capture_is_unknown(tmp_path: Path, files: list, folders: list) -> None:
    catalogue = load_builtin()
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        root = copy(PROCFS, Path(tmp))
        healthy, _ = run(root)
        for rel, mutation in files:
            with contextlib.suppress(OSError):  # an earlier folder mutation took its place
                apply_file(root / IB / rel, mutation)
        for rel, shape in folders:
            with contextlib.suppress(OSError):
                break_folder(root / IB / rel, shape)
        probe = InfinibandProbe()
        ctx = make_ctx(InfinibandProbe, root, previous=healthy, clock=lambda: 1030.0)
        snap = probe.collect(ctx)
        json.dumps(snap)  # the snapshot stays JSON (the state store)
        for finding in probe.evaluate(snap, ctx):
            severity = catalogue.resolve(finding).severity
            assert severity is Severity.UNKNOWN, (files, folders, finding)
