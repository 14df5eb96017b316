"""`hma check infiniband` on a generated 8-GPU HGX H100 node (tests/fixtures/gen_sysfs.py
``hgx_node``): the compute ports are expected from the GPU product (PCI device id), the odd one
out is flagged, configuration wins and an unknown product infers nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget
from trn_support import FIXTURES, gen_sysfs, make_ctx

from hma.adapters.files import RootReader
from hma.contracts.model import Severity
from hma.probes.infiniband.expect import FABRICS, fabric_of, odd_ports
from hma.probes.infiniband.ports import InfinibandProbe

pytestmark = pytest.mark.timeout(60)


def check(tmp_path: Path, root: Path, extra: str = "") -> tuple[int, list[dict[str, Any]]]:
    config = tmp_path / "hma.toml"
    config.write_text(
        f'[paths]\nsysfs = "{root}"\n[probes.infiniband]\noneshot_sample_s = 0.05\n' + extra
    )
    proc = subprocess.run(
        [sys.executable, "-m", "hma", "--config", str(config), "check", "--json", "infiniband"],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.stderr == "" or "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    return proc.returncode, [f for p in doc["probes"] for f in p["findings"]]


def port(root: Path, dev: str, name: str, text: str) -> None:
    (root / "class" / "infiniband" / dev / "ports" / "1" / name).write_text(text + "\n")


def found(findings: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(f["code"], f["component"], f["severity"]) for f in findings}


def test_healthy_hgx_h100_finds_nothing(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys")
    rc, findings = check(tmp_path, root)
    assert (rc, findings) == (0, [])


def test_a_disabled_compute_port_is_down(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys")
    port(root, "mlx5_3", "state", "1: DOWN")
    port(root, "mlx5_3", "phys_state", "3: Disabled")
    port(root, "mlx5_8", "state", "1: DOWN")  # the management NIC: not a compute port
    rc, findings = check(tmp_path, root)
    assert found(findings) == {("IB_PORT_DOWN", "ib:mlx5_3/1", "critical")}
    assert "H100" in findings[0]["message"] and "Disabled" in findings[0]["message"]
    assert rc != 0


def test_a_compute_port_at_200_is_degraded(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys")
    port(root, "mlx5_5", "rate", "200 Gb/sec (4X HDR)")
    _rc, findings = check(tmp_path, root)
    assert found(findings) == {("IB_RATE_DEGRADED", "ib:mlx5_5/1", "critical")}


def test_fewer_compute_ports_than_the_board_has(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys", hcas=7)
    _rc, findings = check(tmp_path, root)
    assert found(findings) == {("IB_PORT_MISSING", "node", "warning")}
    assert findings[0]["details"]["expected_ports"] == 8


def test_an_unreadable_port_is_unknown_not_missing(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys")
    port(root, "mlx5_2", "state", "garbage")
    _rc, findings = check(tmp_path, root)
    assert {f["code"] for f in findings} == {"IB_READ_FAILED"}


def test_unknown_gpu_product_infers_nothing(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys", gpu_device="0x1db6")  # V100: not in the table
    port(root, "mlx5_3", "state", "1: DOWN")
    port(root, "mlx5_5", "rate", "200 Gb/sec (4X HDR)")
    rc, findings = check(tmp_path, root)
    assert (rc, findings) == (0, [])


def test_a_board_with_efa_infers_nothing(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys", hcas=1)  # p5.48xlarge: 8 H100, 32 EFA
    gen_sysfs.rdma_device(root, "rdmap79s0", 0x4F, "0x1d0f", "0xefa1", "efa", "100 Gb/sec (4X EDR)")
    rc, findings = check(tmp_path, root)
    assert (rc, findings) == (0, [])


def test_configuration_wins(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys")
    port(root, "mlx5_3", "state", "1: DOWN")
    port(root, "mlx5_5", "rate", "200 Gb/sec (4X HDR)")
    _rc, findings = check(tmp_path, root, "expected_rate_gbps = 100\n")
    assert findings == []
    _rc, findings = check(tmp_path, root, "expect_from_gpus = false\n")
    assert findings == []


def test_fabric_table_and_reader(tmp_path: Path) -> None:
    assert {(f.ports, f.rate_gbps) for f in FABRICS.values()} == {(8, 400.0)}
    root = gen_sysfs.hgx_node(tmp_path / "sys")
    assert fabric_of(RootReader(str(root))) == FABRICS[0x2330]
    gpu = root / "bus" / "pci" / "devices" / "0000:18:00.0"
    (gpu / "device").write_text("0x2335\n")
    assert fabric_of(RootReader(str(root))) is None  # mixed products: no inference
    (gpu / "device").write_text("0x2330\n")
    (gpu / "class").write_text("0x068000\n")  # 7 GPUs: not the 8-GPU board
    assert fabric_of(RootReader(str(root))) is None
    (gpu / "class").write_text("0x030200\n")
    (gpu / "device").write_text("garbage\n")
    assert fabric_of(RootReader(str(root))) is None  # unknown


def test_fabrics_follow_gpud_s_table() -> None:
    go = (FIXTURES / "gpud" / "threshold_default.go").read_text()
    rows = dict(
        (name, (int(ports), float(rate)))
        for name, ports, rate in re.findall(
            r'"([a-z0-9]+)": \{AtLeastPorts: (\d+), AtLeastRate: (\d+)\}', go
        )
    )
    named = {"H100": "h100", "H200": "h200", "B200": "b200"}
    for fabric in FABRICS.values():
        key = named[fabric.product.split()[0]]
        assert rows[key] == (fabric.ports, fabric.rate_gbps), key


def test_a_learned_down_port_is_reported_once(tmp_path: Path) -> None:
    root = gen_sysfs.hgx_node(tmp_path / "sys")
    probe = InfinibandProbe()
    ctx = make_ctx(InfinibandProbe, root, clock=lambda: 1000.0)
    first = probe.collect(ctx)
    assert probe.evaluate(first, ctx) == []
    port(root, "mlx5_3", "state", "1: DOWN")
    ctx = make_ctx(InfinibandProbe, root, previous=first, clock=lambda: 1030.0)
    later = probe.evaluate(probe.collect(ctx), ctx)
    assert [(f.code, f.component) for f in later] == [("IB_PORT_DOWN", "ib:mlx5_3/1")]
    assert later[0].details["expected_from"] == "H100 SXM5 80GB"


PORT = st.fixed_dictionaries(
    {
        "state": st.sampled_from([None, "ACTIVE", "DOWN", "INIT", "POLLING"]),
        "rate_gbps": st.sampled_from([None, 100.0, 200.0, 400.0, 800.0]),
        "link_layer": st.sampled_from(["InfiniBand", "Ethernet", None]),
    }
)


@given(st.dictionaries(st.sampled_from([f"mlx5_{n}/1" for n in range(10)]), PORT, max_size=10))
@budget(200)
def test_odd_ports_flags_only_infiniband_ports_off_the_rate(ports: dict[str, Any]) -> None:
    for info in ports.values():
        if info["state"] != "ACTIVE":
            info["rate_gbps"] = None  # the rate is read only on an ACTIVE port
    fabric = FABRICS[0x2330]
    out = odd_ports(ports, fabric, listed=True)
    at_rate = sum(1 for p in ports.values() if (p["rate_gbps"] or 0) >= 400)
    unknown = {k for k, p in ports.items() if p["state"] is None}
    unknown |= {k for k, p in ports.items() if p["state"] == "ACTIVE" and p["rate_gbps"] is None}
    odd = {
        k
        for k, p in ports.items()
        if k not in unknown and p["link_layer"] == "InfiniBand" and (p["rate_gbps"] or 0) < 400
    }
    if at_rate >= fabric.ports:
        assert out == []
        return
    flagged = {f.component[3:]: f.code for f in out if f.component != "node"}
    assert set(flagged) == odd
    for key, code in flagged.items():
        assert code == ("IB_PORT_DOWN" if ports[key]["state"] != "ACTIVE" else "IB_RATE_DEGRADED")
    missing = [f for f in out if f.component == "node"]
    assert bool(missing) == (at_rate + len(odd) + len(unknown) < fabric.ports)
    assert all(f.code == "IB_PORT_MISSING" and f.severity == Severity.WARNING for f in missing)
