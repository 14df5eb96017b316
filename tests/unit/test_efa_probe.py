"""The efa probe over generated sysfs trees: discovery, count, PCI binding, ENA link, rates,
resets, wraps, and a property suite over mutated trees (hypothesis)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import apply_file, budget
from trn_support import codes, gen_sysfs, make_ctx

from hma.adapters.strict import ParseError, parse_uint
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.probes.efa.adapters import (
    DEFAULT_RATE_LIMITS,
    GROWTH_CODES,
    IB,
    U64,
    EfaProbe,
    delta,
)

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
    assert len(snap["functions"]) == 32 and snap["functions"]["0000:10:00.0"]["driver"] == "efa"
    assert snap["ena"]["ens5"] == {
        "pci": "0000:00:05.0",
        "up": True,
        "carrier": 1,
        "operstate": "up",
    }


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


def test_unbound_pci_function(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge", ["efa_unbound_function"])
    _snap, findings = run(root)
    assert codes(findings) == {
        ("EFA_ADAPTER_COUNT", "node"),
        ("EFA_PCI_UNBOUND", "pci:0000:14:00.0"),
    }
    unbound = next(f for f in findings if f.code == "EFA_PCI_UNBOUND")
    assert unbound.details == {"pci": "0000:14:00.0", "device": "0xefa1", "driver": None}
    assert load_builtin().resolve(unbound).severity is Severity.CRITICAL


def test_bound_function_without_rdma_device(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    name = gen_sysfs.efa_names(root)[0]
    (root / IB / name).unlink()  # ib_register_device failed; the driver stays bound
    _snap, findings = run(root, "trn1.32xlarge")
    unbound = [f for f in findings if f.code == "EFA_PCI_UNBOUND"]
    assert len(unbound) == 1 and unbound[0].details["driver"] == "efa"


def test_unlistable_pci_bus_is_unknown_not_unbound(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    devices = root / "bus" / "pci" / "devices"
    shutil.rmtree(devices)
    devices.symlink_to("nowhere")
    snap, findings = run(root, "trn1.32xlarge")
    assert codes(findings) == {("EFA_READ_FAILED", "node")}
    assert findings[0].details["path"].endswith("bus/pci/devices")
    assert snap["functions"] is None and len(snap["adapters"]) == 8


def test_port_state_is_not_read(tmp_path: Path) -> None:
    """efa_query_port reports ACTIVE unconditionally: a DOWN here is a made-up tree."""
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    name = gen_sysfs.efa_names(root)[0]
    (gen_sysfs.efa_dev(root, name) / "ports" / "1" / "state").write_text("1: DOWN\n")
    _snap, findings = run(root, "trn1.32xlarge")
    assert findings == []


def test_unreadable_counter_names_the_path(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge", ["efa_unreadable_counter"])
    _snap, findings = run(root)
    name = gen_sysfs.adapter_name(2, 32)
    assert codes(findings) == {("EFA_READ_FAILED", f"efa:{name}")}
    assert findings[0].severity is Severity.UNKNOWN
    assert findings[0].details["path"].endswith(f"{name}/ports/1/hw_counters/rx_drops")


def test_ena_without_carrier(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge", ["efa_ena_no_carrier"])
    _snap, findings = run(root)
    assert codes(findings) == {("EFA_ENA_LINK_DOWN", "net:ens5")}
    assert findings[0].details["operstate"] == "down"
    assert load_builtin().resolve(findings[0]).severity is Severity.CRITICAL


def test_ena_administratively_down_is_not_a_fault(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    net = root / "class" / "net" / "ens5"
    (net / "flags").write_text("0x1002\n")
    (net / "carrier").write_text("garbage: not read when down\n")
    snap, findings = run(root)
    assert findings == [] and snap["ena"]["ens5"]["up"] is False


@pytest.mark.parametrize("rel,text", [("carrier", "2\n"), ("flags", "up\n"), ("carrier", "")])
def test_unreadable_ena_link_is_unknown(tmp_path: Path, rel: str, text: str) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    (root / "class" / "net" / "ens5" / rel).write_text(text)
    _snap, findings = run(root)
    assert codes(findings) == {("EFA_READ_FAILED", "net:ens5")}


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
    assert findings[0].details["counters"] == {counter: {"grown": 2, "total": 2}}


def test_verbs_errors_grow_into_one_warning(tmp_path: Path) -> None:
    name, findings = rates(tmp_path, {"reg_mr_err": 3, "create_qp_err": 1}, port=False)
    assert codes(findings) == {("EFA_VERBS_ERRORS", f"efa:{name}")}
    assert set(findings[0].details["counters"]) == {"reg_mr_err", "create_qp_err"}
    assert load_builtin().resolve(findings[0]).severity is Severity.WARNING


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


def _break_vendor(root: Path, name: str, how: str) -> None:
    pci = gen_sysfs.efa_dev(root, name) / "device"
    vendor = pci / "vendor"
    if how == "garbage":
        vendor.write_text("abc\n")
    elif how == "folder":
        vendor.unlink()
        vendor.mkdir()
    elif how == "nul":
        vendor.write_bytes(b"0x1d0f\0")
    elif how == "broken_link":
        pci.unlink()
        pci.symlink_to("../../nowhere")
    elif how == "link_loop":
        pci.unlink()
        pci.symlink_to("device")


@pytest.mark.parametrize("how", ["garbage", "folder", "nul", "broken_link", "link_loop"])
def test_unreadable_vendor_is_unknown_not_a_missing_adapter(tmp_path: Path, how: str) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    name = gen_sysfs.adapter_name(5, 32)
    _break_vendor(root, name, how)
    snap, findings = run(root)
    assert codes(findings) == {("EFA_READ_FAILED", f"efa:{name}")}
    assert findings[0].severity is Severity.UNKNOWN
    assert snap["unresolved"] == [name] and len(snap["adapters"]) == 31


def test_unreadable_vendor_does_not_hide_an_adapter_really_missing(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge", ["efa_missing_adapter"])
    _break_vendor(root, gen_sysfs.adapter_name(5, 32), "garbage")
    _snap, findings = run(root)  # 30 found + 1 unknown: fewer than 32 whatever that one is
    assert {c for c, _ in codes(findings)} == {"EFA_READ_FAILED", "EFA_ADAPTER_COUNT"}
    _snap, findings = run(root, expected_adapters=31)  # the unknown one may be the 31st
    assert {c for c, _ in codes(findings)} == {"EFA_READ_FAILED"}


def test_discovery_is_cached_until_a_device_event(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    probe = EfaProbe()
    name = gen_sysfs.adapter_name(5, 32)
    ctx = make_ctx(EfaProbe, root, "p5.48xlarge")
    assert probe.applies(ctx) is None and len(probe.collect(ctx)["adapters"]) == 32
    _break_vendor(root, name, "garbage")  # static attributes are not read again...
    ctx = make_ctx(EfaProbe, root, "p5.48xlarge")
    assert probe.applies(ctx) is None and len(probe.collect(ctx)["adapters"]) == 32
    ctx = make_ctx(EfaProbe, root, "p5.48xlarge")
    ctx.device_events = 1  # ...until a device event says the hardware may have changed
    snap = probe.collect(ctx)
    assert len(snap["adapters"]) == 31 and snap["unresolved"] == [name]


def test_discovery_sees_a_removed_adapter_without_an_event(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    probe = EfaProbe()
    assert len(probe.collect(make_ctx(EfaProbe, root, "p5.48xlarge"))["adapters"]) == 32
    (root / "class" / "infiniband" / gen_sysfs.adapter_name(7, 32)).unlink()
    ctx = make_ctx(EfaProbe, root, "p5.48xlarge")
    found = codes(probe.evaluate(probe.collect(ctx), ctx))
    assert found == {("EFA_ADAPTER_COUNT", "node"), ("EFA_PCI_UNBOUND", "pci:0000:2c:00.0")}


def test_unlistable_class_folder_is_unknown_not_unsupported(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "p5.48xlarge")
    ib = root / "class" / "infiniband"
    ib.rename(root / "class" / "ib.old")
    ib.write_text("not a folder")
    ctx = make_ctx(EfaProbe, root, "p5.48xlarge")
    assert PROBE.applies(ctx) is None
    findings = PROBE.evaluate(PROBE.collect(ctx), ctx)
    assert codes(findings) == {("EFA_READ_FAILED", "node")}


def test_only_judged_counters_are_read(tmp_path: Path) -> None:
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    snap, _ = run(root, "trn1.32xlarge")
    info = snap["adapters"][gen_sysfs.efa_names(root)[0]]
    judged = set(DEFAULT_RATE_LIMITS) | set(GROWTH_CODES)
    assert "rx_drops" in info["ports"]["1"]["counters"] and "cmds_err" in info["counters"]
    assert set(info["ports"]["1"]["counters"]) | set(info["counters"]) <= judged


# --- property: mutated sysfs trees never give a critical that the mutation does not signal ----

N_PROPERTY = 4  # adapters in the mutated trees (small: every example copies the tree)
TARGETS = (
    "",  # the class/infiniband link itself
    "device",
    "device/vendor",
    "ports",
    "ports/1",
    "ports/1/state",
    "ports/1/phys_state",
    "ports/1/hw_counters",
    "ports/1/hw_counters/rx_drops",
    "ports/1/hw_counters/retrans_timeout_events",
    "ports/1/hw_counters/tx_bytes",
    "hw_counters/no_completion_cmds",
    "hw_counters/cmds_err",
)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["1_0", "\u0663", "1e3", " 7 ", "0x10", "+5", "", "9" * 400]),
)
CONTENT = st.one_of(
    st.binary(max_size=48),
    st.sampled_from(["0x1d0f\n", "0x15b3\n", "0x1D0F", "0x01d0f\n", "7439\n"]).map(str.encode),
    NUMBERS.map(lambda n: (n + "\n").encode()),
    st.sampled_from(("DOWN", "INIT", "ACTIVE", "BROKEN", "active", "")).flatmap(
        lambda w: st.integers(0, 300).map(lambda i: f"{i}: {w}\n".encode())
    ),
)
MUTATION = st.tuples(
    st.integers(0, N_PROPERTY - 1),
    st.sampled_from(TARGETS),
    st.sampled_from(["write", "missing", "folder", "loop", "dangling"]),
    CONTENT,
)


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gen_sysfs.build(
        tmp_path_factory.mktemp("efa") / "sys", "p5.48xlarge", efa_adapters=N_PROPERTY
    )


def _mutate(root: Path, name: str, target: str, op: str, content: bytes) -> bool:
    """Replace the adapter's ``target`` by ``content`` (op "write") or a shape; False when an
    earlier mutation left no place for it."""
    path = root / IB / name / target if target else root / IB / name
    try:
        apply_file(path, ("bytes", content) if op == "write" else ("shape", op))
    except OSError:
        return False
    return True


def _signalled(target: str, op: str, content: bytes) -> set[str]:
    """Critical codes that the mutation itself is a catalogued fault signal for."""
    if (target, op) in (("", "missing"), ("", "folder"), ("device", "missing")):
        # the adapter is positively gone (unlisted, or listed without a PCI function, as rxe)
        # while its PCI function stays
        return {"EFA_ADAPTER_COUNT", "EFA_PCI_UNBOUND"}
    if target == "device/vendor" and op == "write" and b"\0" not in content:
        try:
            text = content.decode("ascii")
            if text.startswith("0x") and parse_uint(text, limit=0xFFFF) != 0x1D0F:
                return {"EFA_ADAPTER_COUNT"}  # readable, and another vendor's device
        except (UnicodeDecodeError, ParseError):
            return set()
    if "hw_counters/" in target and op == "write" and b"\0" not in content:
        try:
            if parse_uint(content.decode("utf-8")) > 0:  # the counter grew from 0
                return {"EFA_COUNTER_RATE_CRIT", "EFA_CMD_TIMEOUT"}
        except (UnicodeDecodeError, ParseError):
            return set()
    return set()


@budget(50)
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_tree_gives_no_unsignalled_critical(
    small_tree: Path, tmp_path: Path, mutations: list
) -> None:
    catalogue = load_builtin()
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        root = Path(tmp) / "sys"
        shutil.copytree(small_tree, root, symlinks=True)
        names = gen_sysfs.efa_names(root)
        probe = EfaProbe()
        ctx = make_ctx(EfaProbe, root, "p5.48xlarge", expected_adapters=N_PROPERTY)
        assert probe.applies(ctx) is None
        first = probe.collect(ctx)
        allowed: set[str] = set()
        for index, target, op, content in mutations:
            if _mutate(root, names[index], target, op, content):
                allowed |= _signalled(target, op, content)
        ctx = make_ctx(EfaProbe, root, "p5.48xlarge", previous=first, expected_adapters=4)
        ctx.device_events = 1  # the mutation may be a hardware change: discover again
        ctx.clock = lambda: first["ts"] + 1.0
        snap = probe.collect(ctx) if probe.applies(ctx) is None else {"adapters": {}}
        json.dumps(snap)  # a snapshot must stay JSON (the worker protocol, the state store)
        for finding in probe.evaluate(snap, ctx):
            resolved = catalogue.resolve(finding)
            if resolved.severity is Severity.CRITICAL:
                assert finding.code in allowed, (mutations, finding)


@pytest.mark.parametrize(
    "port, counter, value",
    [
        (True, "rx_drops", "0x10"),
        (True, "rdma_write_wr_err", str(2**64 - 1)),
        (True, "rdma_read_wr_err", str(2**32 - 1)),
        (True, "retrans_pkts", "\u20085000"),
        (False, "cmds_err", str(2**64 - 1)),
        (False, "no_completion_cmds", "9\u3000"),
    ],
)
def test_hex_unicode_space_or_unsigned_minus_one_counter_is_unknown(
    tmp_path: Path, port: bool, counter: str, value: str
) -> None:
    """hw_counters are decimal: hex, a Unicode space or -1 written unsigned ("not available") is
    EFA_READ_FAILED, never a rate or growth."""
    root = gen_sysfs.build(tmp_path, "trn1.32xlarge")
    name = gen_sysfs.efa_names(root)[0]
    clock = Clock()
    first, _ = run(root, "trn1.32xlarge", clock=clock)
    base = gen_sysfs.efa_dev(root, name)
    folder = base / "ports" / "1" / "hw_counters" if port else base / "hw_counters"
    (folder / counter).write_text(value + "\n")
    clock.now += 1
    _snap, findings = run(root, "trn1.32xlarge", previous=first, clock=clock)
    assert {(f.code, f.component, f.severity) for f in findings} == {
        ("EFA_READ_FAILED", f"efa:{name}", Severity.UNKNOWN)
    }
