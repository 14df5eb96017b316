"""The efa probe over generated sysfs trees: discovery, count, ports, rates, resets, wraps."""

from __future__ import annotations

from pathlib import Path

import pytest
from trn_support import codes, gen_sysfs, make_ctx

from hma.catalogue import load_builtin
from hma.model import Severity
from hma.probes.efa import U64, EfaProbe, delta

pytestmark = pytest.mark.timeout(60)

PROBE = EfaProbe()


class Clock:
    """A settable clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(root: Path, instance: str = "p5.48xlarge", **kw):  # type: ignore[no-untyped-def]
    ctx = make_ctx(EfaProbe, root, instance, **kw)
    snap = PROBE.collect(ctx)
    return snap, PROBE.evaluate(snap, ctx)


def test_p5_healthy_finds_32_adapters_and_ignores_mlx5(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    snap, findings = run(root)
    assert findings == []
    assert len(snap["adapters"]) == 32 and snap["ignored"] == ["mlx5_0"]
    name = "rdmap16s0"
    assert snap["adapters"][name]["pci"] == "0000:10:00.0"
    assert snap["adapters"][name]["ports"]["1"]["state"] == "ACTIVE"


def test_trn1_healthy(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    snap, findings = run(root, "trn1.32xlarge")
    assert findings == [] and len(snap["adapters"]) == 8


def test_legacy_efa_names(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge", ["efa_legacy_names"])
    snap, findings = run(root, "trn1.32xlarge")
    assert findings == [] and sorted(snap["adapters"]) == [f"efa_{i}" for i in range(8)]


def test_missing_adapter_is_critical_on_a_verified_count(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge", ["efa_missing_adapter"])
    _snap, findings = run(root)
    assert codes(findings) == {("EFA_ADAPTER_COUNT", "node")}
    assert findings[0].severity is None  # catalogue: critical
    assert load_builtin().resolve(findings[0]).severity is Severity.CRITICAL
    assert findings[0].details["found"] == 31


def test_unverified_table_entry_only_warns(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn2.48xlarge", ["efa_missing_adapter"])
    _snap, findings = run(root, "trn2.48xlarge")
    assert codes(findings) == {("EFA_ADAPTER_COUNT", "node")}
    assert findings[0].severity is Severity.WARNING and not findings[0].details["verified"]
    _snap, findings = run(root, "trn2.48xlarge", expected_adapters=16)
    assert findings[0].severity is None


def test_port_down(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge", ["efa_port_down"])
    _snap, findings = run(root)
    assert codes(findings) == {("EFA_PORT_DOWN", f"efa:{gen_sysfs.adapter_name(1, 32)}")}
    assert findings[0].details["state"] == "DOWN"


def test_unreadable_port_state_names_the_path(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge", ["efa_unreadable_state"])
    _snap, findings = run(root)
    name = gen_sysfs.adapter_name(2, 32)
    assert codes(findings) == {("EFA_READ_FAILED", f"efa:{name}")}
    assert findings[0].severity is Severity.UNKNOWN
    assert findings[0].details["path"].endswith(f"{name}/ports/1/state")


def test_no_adapters_and_no_expectation_is_unsupported(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "inf2.48xlarge")
    assert PROBE.applies(make_ctx(EfaProbe, root, "inf2.48xlarge")) == "no EFA adapters"
    assert PROBE.applies(make_ctx(EfaProbe, root, "inf2.48xlarge", expected_adapters=2)) is None


def rates(tmp_path: Path, changes: dict, dt: float = 1.0, port: bool = True):  # type: ignore[no-untyped-def]
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    name = gen_sysfs.efa_names(root)[0]
    clock = Clock()
    first, _ = run(root, "trn1.32xlarge", clock=clock)
    for counter, value in changes.items():
        gen_sysfs.set_efa_counter(root, name, counter, value, port=port)
    clock.now += dt
    _snap, findings = run(root, "trn1.32xlarge", previous=first, clock=clock)
    return name, findings


def test_error_rate_over_limit_warns(tmp_path: Path) -> None:
    name, findings = rates(tmp_path, {"rx_drops": 1000}, dt=5.0)  # 200/s, limit 100/s
    assert codes(findings) == {("EFA_COUNTER_RATE_WARN", f"efa:{name}")}
    (item,) = findings[0].details["counters"]
    assert item["counter"] == "rx_drops" and item["rate_per_s"] == 200.0


def test_error_rate_far_over_limit_is_critical(tmp_path: Path) -> None:
    name, findings = rates(tmp_path, {"rdma_write_wr_err": 5000}, dt=1.0)
    assert codes(findings) == {("EFA_COUNTER_RATE_CRIT", f"efa:{name}")}


def test_retrans_limits(tmp_path: Path) -> None:
    name, findings = rates(tmp_path, {"retrans_pkts": 999, "retrans_bytes": 2_000_000})
    assert codes(findings) == {("EFA_COUNTER_RATE_WARN", f"efa:{name}")}
    assert [i["counter"] for i in findings[0].details["counters"]] == ["retrans_bytes"]


def test_rates_below_limits_are_fine(tmp_path: Path) -> None:
    _name, findings = rates(tmp_path, {"rx_drops": 50, "tx_bytes": 10**12})
    assert findings == []


def test_counter_reset_is_not_a_fault(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    name = gen_sysfs.efa_names(root)[0]
    gen_sysfs.set_efa_counter(root, name, "rx_drops", 10**9)
    clock = Clock()
    first, _ = run(root, "trn1.32xlarge", clock=clock)
    gen_sysfs.set_efa_counter(root, name, "rx_drops", 5)
    clock.now += 1
    _snap, findings = run(root, "trn1.32xlarge", previous=first, clock=clock)
    assert findings == []


def test_delta_handles_wrap_and_reset() -> None:
    assert delta(15, 10) == 5
    assert delta(5, U64 - 10) == 15  # a u64 wrap
    assert delta(5, 1000) is None  # a reset
    assert delta(5, None) is None


def test_wrapped_counter_rate(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    name = gen_sysfs.efa_names(root)[0]
    gen_sysfs.set_efa_counter(root, name, "rx_drops", U64 - 100)
    clock = Clock()
    first, _ = run(root, "trn1.32xlarge", clock=clock)
    gen_sysfs.set_efa_counter(root, name, "rx_drops", 400)
    clock.now += 1
    _snap, findings = run(root, "trn1.32xlarge", previous=first, clock=clock)
    assert codes(findings) == {("EFA_COUNTER_RATE_WARN", f"efa:{name}")}
    assert findings[0].details["counters"][0]["rate_per_s"] == 500.0


@pytest.mark.parametrize(
    "counter,code", [("no_completion_cmds", "EFA_CMD_TIMEOUT"), ("cmds_err", "EFA_CMD_ERRORS")]
)
def test_admin_command_counter_growth(tmp_path: Path, counter: str, code: str) -> None:
    name, findings = rates(tmp_path, {counter: 2}, port=False)
    assert codes(findings) == {(code, f"efa:{name}")}
    assert findings[0].details["grown"] == 2


def test_no_rates_across_a_reboot(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    name = gen_sysfs.efa_names(root)[0]
    clock = Clock()
    first, _ = run(root, "trn1.32xlarge", clock=clock, boot_id="a")
    gen_sysfs.set_efa_counter(root, name, "rx_drops", 10**6)
    clock.now += 1
    _snap, findings = run(root, "trn1.32xlarge", previous=first, clock=clock, boot_id="b")
    assert findings == []


def test_oneshot_samples_twice(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    snap, findings = run(root, "trn1.32xlarge", oneshot=True, oneshot_sample_s=0.01)
    assert findings == [] and snap["baseline"]["ts"] <= snap["ts"]
    name = gen_sysfs.efa_names(root)[0]
    snap["baseline"]["adapters"][name]["ports"]["1"]["counters"]["rx_drops"] = 0
    snap["adapters"][name]["ports"]["1"]["counters"]["rx_drops"] = 10**6
    ctx = make_ctx(EfaProbe, root, "trn1.32xlarge", oneshot=True)
    assert codes(PROBE.evaluate(snap, ctx)) == {("EFA_COUNTER_RATE_CRIT", f"efa:{name}")}


def test_generator_makes_real_sysfs_symlinks(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    link = root / "class" / "infiniband" / "rdmap16s0"
    assert link.is_symlink()
    pci = (link / "device").resolve()
    assert (pci / "driver").resolve().name == "efa"
    assert (root / "bus" / "pci" / "devices" / "0000:10:00.0").resolve() == pci
