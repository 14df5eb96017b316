"""``efa`` probe: Elastic Fabric Adapters through ``class/infiniband`` and ``bus/pci`` in sysfs.

EFA devices are the RDMA devices whose PCI function has vendor 0x1d0f (Amazon); their names are
``efa_N`` or ``rdmap<bus>s<slot>``, and other RDMA devices (mlx5, rxe, ...) are left to the
``infiniband`` probe. Port state is not read: the efa driver's ``efa_query_port`` every port
as ACTIVE / LinkUp unconditionally (drivers/infiniband/hw/efa/efa_verbs.c), so the port state
cannot carry a fault. Checks, on what does change: adapter count against the instance type (or
``expected_adapters``); EFA PCI functions (vendor 0x1d0f, device 0xefa0-0xefa3, the efa driver's
``efa_pci_tbl``) without an RDMA device (the driver is not bound, or its probe failed);
``hw_counters`` as rates between two reads against thresholds; growth of the device-level admin
command counters (``no_completion_cmds``, ``cmds_err``) and verbs error counters; and link
(carrier) of the ENA network interfaces (``class/net``, driver ``ena``) of the instance. The first
read is the previous run's snapshot (``ctx.previous``, kept by the daemon) or, under ``hma
check``, a sample taken ``oneshot_sample_s`` earlier. A counter that goes down is a reset (or a
64-bit wrap), never a fault. What cannot be read or parsed strictly (a counter in hex, or -1
written unsigned: "not available") is ``EFA_READ_FAILED`` (unknown), never a missing adapter or
growth. Discovery is cached per boot until a device event (``Layout``); a run reads the judged
counters and the ENA link files only. docs/neuron-efa.md has the details.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Mapping, Optional

from hma.adapters.files import ReadError, RootReader, reason
from hma.adapters.strict import ParseError, parse_word
from hma.contracts.model import Finding, Severity
from hma.contracts.options import Option, pci_ids, rate_limits
from hma.contracts.probe import Probe, ProbeContext
from hma.probes.support import counters
from hma.probes.support.discovery import Discovery
from hma.probes.support.findings import read_failures

IB = "class/infiniband"
NET = "class/net"
PCI = "bus/pci/devices"
NODE = "node"
AMAZON = "0x1d0f"
U64 = 1 << 64
# PCI device ids the efa driver binds (efa_pci_tbl, drivers/infiniband/hw/efa/efa_main.c).
EFA_DEVICE_IDS = frozenset({0xEFA0, 0xEFA1, 0xEFA2, 0xEFA3})
ENA_DRIVER = "ena"
IFF_UP = 0x1
# A PCI function's name on the bus (domain:bus:device.function, as the kernel writes it).
BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z", re.ASCII)
# operstate words (Documentation/ABI/testing/sysfs-class-net); "down"-like ones with carrier.
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")


@dataclass(frozen=True)
class Expected:
    """EFA adapters expected on an instance type; ``verified`` against a primary source."""

    count: int
    verified: bool


# REFERENCE 5.3. Unverified counts only warn: a wrong table entry must not drain a fleet.
EXPECTED_ADAPTERS: dict[str, Expected] = {
    "p5.48xlarge": Expected(32, True),
    "p5e.48xlarge": Expected(32, True),
    "trn1.32xlarge": Expected(8, True),
    "trn1n.32xlarge": Expected(16, True),
    "p5en.48xlarge": Expected(16, False),
    "p4d.24xlarge": Expected(4, False),
    "p4de.24xlarge": Expected(4, False),
    "p6-b200.48xlarge": Expected(8, False),
    "trn2.48xlarge": Expected(16, False),
    "trn2u.48xlarge": Expected(16, False),
}

DEFAULT_RATE_LIMITS: dict[str, float] = {
    "rx_drops": 100.0,
    "rdma_read_wr_err": 100.0,
    "rdma_write_wr_err": 100.0,
    "retrans_timeout_events": 100.0,
    "unresponsive_remote_events": 100.0,
    "impaired_remote_conn_events": 100.0,
    "retrans_pkts": 1000.0,
    "retrans_bytes": 1e6,
}
# Device-level counters (efa_device_stats_descs, efa_verbs.c) whose growth is a finding, and its
# code: admin commands that timed out or failed, and failed verbs (resource allocation).
GROWTH_CODES = {
    "no_completion_cmds": "EFA_CMD_TIMEOUT",
    "cmds_err": "EFA_CMD_ERRORS",
    "alloc_pd_err": "EFA_VERBS_ERRORS",
    "create_qp_err": "EFA_VERBS_ERRORS",
    "create_cq_err": "EFA_VERBS_ERRORS",
    "reg_mr_err": "EFA_VERBS_ERRORS",
    "alloc_ucontext_err": "EFA_VERBS_ERRORS",
    "create_ah_err": "EFA_VERBS_ERRORS",
    "mmap_err": "EFA_VERBS_ERRORS",
}


class EfaProbe(Probe):
    """EFA adapter count, PCI binding, error/retransmission rates, admin commands, ENA link."""

    name = "efa"
    description = "EFA adapters: count, PCI binding, error rates, admin commands, ENA link"
    default_interval = 30.0
    default_timeout = 20.0
    subsystems = ("infiniband", "pci")
    unsupported_stands = True  # no devices (or no driver) until a device event
    options: ClassVar[Mapping[str, Option]] = {
        "expected_adapters": Option(
            "int",
            None,
            "EFA adapters expected; unset: the table by instance type (docs/neuron-efa.md).",
            minimum=0,
        ),
        "vendor_ids": Option(
            "strlist",
            [AMAZON],
            "PCI vendor ids that mark an RDMA device as EFA.",
            check=pci_ids,
        ),
        "rate_limits": Option(
            "table",
            DEFAULT_RATE_LIMITS,
            "Per-second warning limit per hw counter (port or device level).",
            check=rate_limits,
        ),
        "critical_factor": counters.CRITICAL_FACTOR,
        "oneshot_sample_s": counters.ONESHOT_SAMPLE,
    }

    def __init__(self) -> None:
        self._layout: Discovery[Layout] = Discovery(IB)
        self._ena: Optional[tuple[tuple[str, ...], dict[str, str]]] = None

    def ena(self, ctx: ProbeContext) -> dict[str, str]:
        """The ENA netdevs, found again only when the listing of ``class/net`` changes (a run
        lists one folder; interfaces come and go apart from the RDMA devices)."""
        key = (str(ctx.sysfs.root), ctx.boot_id, *ctx.sysfs.listdir(NET))
        if self._ena is None or self._ena[0] != key:
            self._ena = (key, ena_netdevs(ctx.sysfs))
        return self._ena[1]

    def layout(self, ctx: ProbeContext) -> Layout:
        """What ``discover_adapters`` finds, kept (``Discovery``) while the sysfs root, the boot,
        the device events and the list of RDMA devices stay the same, unless it has errors."""
        vendor_ids = list(ctx.options["vendor_ids"])
        wanted = wanted_counters(ctx.options)
        return self._layout.get(
            ctx,
            (tuple(vendor_ids), wanted),
            lambda: discover_adapters(ctx.sysfs, vendor_ids, wanted),
            lambda layout: not layout.unresolved and layout.pci_error is None,
        )

    def applies(self, ctx: ProbeContext) -> Optional[str]:
        try:
            layout = self.layout(ctx)
        except ReadError:
            return None  # collect reports the unreadable folder (unknown), never "unsupported"
        if layout.adapters or layout.unresolved:
            return None
        if expected_adapters(ctx.options, ctx.instance_type) is not None:
            return None
        return "no EFA adapters"

    def collect(self, ctx: ProbeContext) -> Any:
        return counters.sampled(ctx, lambda: self._read(ctx), "adapters")

    def _read(self, ctx: ProbeContext) -> dict[str, Any]:
        try:
            ena, ena_error = self.ena(ctx), None
        except ReadError as exc:
            ena, ena_error = {}, ctx.sysfs.failure(NET, exc, adapter=None)
        try:
            snap = read_adapters(ctx.sysfs, self.layout(ctx), ena)
        except ReadError as exc:
            error = ctx.sysfs.failure(IB, exc, adapter=None)
            snap = {"adapters": {}, "ignored": [], "errors": [error], "listed": False}
        finally:
            self._layout.done()
        if ena_error is not None:
            snap["errors"].append(ena_error)
        snap["ts"], snap["boot_id"] = ctx.clock(), ctx.boot_id
        return snap

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        opts = ctx.options
        adapters: dict[str, Any] = snapshot.get("adapters", {})
        out = read_failures("EFA_READ_FAILED", snapshot.get("errors", []), _error_component)
        if snapshot.get("listed", True):
            unresolved = len(snapshot.get("unresolved", []))
            out += _eval_count(adapters, unresolved, opts, ctx.instance_type)
            if not unresolved and snapshot.get("functions") is not None:
                out += _eval_unbound(adapters, snapshot["functions"])
        out += _eval_ena(snapshot.get("ena", {}), adapters)
        base, base_ts = counters.baseline(snapshot, ctx, "adapters", strict_boot=False)
        if base is not None:
            dt = float(snapshot.get("ts", 0.0)) - base_ts
            if dt > 0:
                codes = ("EFA_COUNTER_RATE_WARN", "EFA_COUNTER_RATE_CRIT")
                out += counters.rate_findings(
                    codes, "efa", adapters, base, dt, opts, counters=_flat, grow=_delta
                )
            out += _eval_growth(adapters, base)
        return out

    def expectations(self, snapshot: Any) -> dict[str, Any]:
        """The adapters found as ``expected_adapters`` (fewer is critical), when every RDMA
        device could be classified."""
        if not isinstance(snapshot, dict) or not snapshot.get("listed", True):
            return {}
        if snapshot.get("unresolved") or not snapshot.get("adapters"):
            return {}
        return {"expected_adapters": len(snapshot["adapters"])}


def _error_component(error: Mapping[str, Any]) -> str:
    if error.get("adapter"):
        return f"efa:{error['adapter']}"
    return f"net:{error['net']}" if error.get("net") else NODE


def expected_adapters(opts: Mapping[str, Any], instance_type: Optional[str]) -> Optional[Expected]:
    """The expected count: ``expected_adapters`` (verified by definition) or the table."""
    if opts.get("expected_adapters") is not None:
        return Expected(int(opts["expected_adapters"]), True)
    return EXPECTED_ADAPTERS.get((instance_type or "").strip().lower())


# --- collect ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What discovery found; static until a device event or a reboot.

    ``adapters``: EFA adapter -> PCI address; ``ignored``: other RDMA devices; ``unresolved``:
    read errors of devices that could not be classified (they may be EFA adapters);
    ``counters``: adapter -> {hw_counters folder: names present there}; ``functions``: EFA PCI
    functions (address -> device id and bound driver), None when ``bus/pci/devices`` cannot be
    listed (``pci_error`` says why).
    """

    adapters: dict[str, str]
    ignored: list[str]
    unresolved: list[dict[str, Any]]
    ports: dict[str, list[str]]
    counters: dict[str, dict[str, list[str]]]
    functions: Optional[dict[str, dict[str, Any]]]
    pci_error: Optional[dict[str, Any]] = None


def discover_adapters(
    sysfs: RootReader, vendor_ids: list[str], wanted: Collection[str] = ()
) -> Layout:
    """Classify every RDMA device: EFA when ``device/vendor`` is one of ``vendor_ids``.

    A device without a ``device`` link (soft RoCE) or of another vendor is ignored. A device whose
    link is there but whose vendor cannot be read or parsed is unresolved (unknown), never
    counted as missing. For EFA adapters, the ports and which of the ``wanted`` hw counters
    exist are listed too; then the EFA PCI functions. Raises ReadError when
    ``class/infiniband`` cannot be listed.
    """
    vendors = {int(v, 16) for v in vendor_ids}
    found: dict[str, str] = {}
    ignored: list[str] = []
    unresolved: list[dict[str, Any]] = []
    ports: dict[str, list[str]] = {}
    counters: dict[str, dict[str, list[str]]] = {}
    for name in sysfs.listdir(IB):
        link = f"{IB}/{name}/device"
        try:
            if not _has_pci_function(sysfs, f"{IB}/{name}"):
                ignored.append(name)
                continue
            vendor = sysfs.pci_id(f"{link}/vendor")
            if vendor not in vendors:
                ignored.append(name)
                continue
            found[name] = pci_function(sysfs, link)
            ports[name] = sysfs.listdir(f"{IB}/{name}/ports")
            folders = [f"{IB}/{name}/ports/{port}/hw_counters" for port in ports[name]]
            counters[name] = {
                rel: [c for c in sysfs.listdir(rel) if c in wanted]
                for rel in [*folders, f"{IB}/{name}/hw_counters"]
            }
        except ReadError as exc:
            found.pop(name, None)
            unresolved.append(sysfs.failure(link, exc, adapter=name))
    try:
        return Layout(found, ignored, unresolved, ports, counters, efa_functions(sysfs, vendors))
    except ReadError as exc:
        error = sysfs.failure(PCI, exc, adapter=None)
        return Layout(found, ignored, unresolved, ports, counters, None, error)


def pci_function(sysfs: RootReader, link: str) -> str:
    """The PCI function (``0000:10:00.0``) a device's ``device`` link points to; ReadError when
    the link leads to something that is not named as one (a folder in its place, a virtual
    device): no function is known, so none can be unbound."""
    name = sysfs.realname(link)
    if not BDF.match(name):
        raise ReadError(f"{sysfs.path(link)}: not a link to a PCI function ({name[:40]!r})")
    return name


def efa_functions(sysfs: RootReader, vendors: Collection[int]) -> dict[str, dict[str, Any]]:
    """EFA PCI functions on the bus (vendor in ``vendors``, an efa device id) and the driver each
    is bound to (None: unbound). A function whose ids cannot be read, or an entry not named as
    a function, is left out: it is no evidence either way. ReadError when ``bus/pci/devices``
    cannot be listed."""
    out: dict[str, dict[str, Any]] = {}
    for bdf in sysfs.listdir(PCI):
        if not BDF.match(bdf):
            continue  # not a function's name: no evidence either way
        try:
            if sysfs.pci_id(f"{PCI}/{bdf}/vendor") not in vendors:
                continue
            device = sysfs.pci_id(f"{PCI}/{bdf}/device")
        except ReadError:
            continue
        if device in EFA_DEVICE_IDS:
            driver = f"{PCI}/{bdf}/driver"
            bound = sysfs.realname(driver) if os.path.lexists(sysfs.path(driver)) else None
            out[bdf] = {"device": f"0x{device:04x}", "driver": bound}
    return out


def ena_netdevs(sysfs: RootReader) -> dict[str, str]:
    """Network interfaces driven by ``ena`` (``class/net/<if>/device/driver``) -> PCI address."""
    out: dict[str, str] = {}
    for ifname in sysfs.listdir(NET):
        driver = f"{NET}/{ifname}/device/driver"
        if os.path.lexists(sysfs.path(driver)) and sysfs.realname(driver) == ENA_DRIVER:
            out[ifname] = sysfs.realname(f"{NET}/{ifname}/device")
    return out


def _has_pci_function(sysfs: RootReader, rel: str) -> bool:
    """Whether the listed device ``rel`` has a ``device`` link; False only when its folder
    positively has none (soft RoCE). ReadError when ``rel`` is not a readable folder."""
    try:
        if not stat.S_ISDIR(os.stat(sysfs.path(rel)).st_mode):
            raise ReadError(f"{sysfs.path(rel)}: not a device folder")
        os.lstat(sysfs.path(f"{rel}/device"))
        return True
    except FileNotFoundError as exc:
        if exc.filename == str(sysfs.path(rel)):  # listed, yet gone or a dangling link
            raise ReadError(f"{sysfs.path(rel)}: {exc.strerror}") from None
        return False
    except OSError as exc:
        raise ReadError(f"{sysfs.path(rel)}: {exc.strerror or exc}") from None


def wanted_counters(opts: Mapping[str, Any]) -> frozenset[str]:
    """The hw counters that evaluate judges: those with a rate limit and the growth ones."""
    return frozenset(opts["rate_limits"]) | frozenset(GROWTH_CODES)


def read_adapters(sysfs: RootReader, layout: Layout, ena: Mapping[str, str]) -> dict[str, Any]:
    """Read what changes: the judged counters of the adapters in ``layout`` and the link of the
    ``ena`` interfaces; errors are recorded in the snapshot, never raised."""
    errors = list(layout.unresolved)
    if layout.pci_error is not None:
        errors.append(layout.pci_error)
    adapters: dict[str, Any] = {}
    for name, pci in layout.adapters.items():
        base = f"{IB}/{name}"
        folders = layout.counters.get(name, {})
        ports: dict[str, Any] = {}
        for port in layout.ports.get(name, []):
            rel = f"{base}/ports/{port}/hw_counters"
            ports[port] = {"counters": _counters(sysfs, rel, folders.get(rel, ()), name, errors)}
        rel = f"{base}/hw_counters"
        adapters[name] = {
            "pci": pci,
            "ports": ports,
            "counters": _counters(sysfs, rel, folders.get(rel, ()), name, errors),
        }
    unresolved = [e["adapter"] for e in layout.unresolved]
    return {
        "adapters": adapters,
        "ignored": layout.ignored,
        "unresolved": unresolved,
        "functions": layout.functions,
        "ena": {i: read_link(sysfs, i, pci, errors) for i, pci in ena.items()},
        "errors": errors,
    }


def read_link(sysfs: RootReader, ifname: str, pci: str, errors: list[dict[str, Any]]) -> dict:
    """An interface's ``flags`` and, when it is administratively up, ``carrier`` and
    ``operstate`` (``carrier`` of a down interface is EINVAL). Errors go to ``errors``."""
    base = f"{NET}/{ifname}"
    info: dict[str, Any] = {"pci": pci, "up": None, "carrier": None, "operstate": None}
    try:
        info["up"] = bool(sysfs.integer(f"{base}/flags", limit=0xFFFFFFFF) & IFF_UP)
        if info["up"]:
            info["carrier"] = sysfs.integer(f"{base}/carrier", hex_ok=False, limit=1)
            try:
                info["operstate"] = parse_word(sysfs.text(f"{base}/operstate"), OPERSTATES)
            except ParseError:
                info["operstate"] = None  # it only explains the carrier
    except ReadError as exc:
        errors.append({"path": _path_of(str(exc)), "error": reason(exc), "net": ifname})
    return info


def _path_of(message: str) -> str:
    return message.rsplit(": ", 1)[0] if ": " in message else message


def _counters(
    sysfs: RootReader,
    rel: str,
    names: Collection[str],
    adapter: str,
    errors: list[dict[str, Any]],
) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in names:
        try:
            out[name] = sysfs.counter(f"{rel}/{name}")
        except ReadError as exc:
            errors.append(sysfs.failure(f"{rel}/{name}", exc, adapter=adapter))
    return out


# --- evaluate (pure) -------------------------------------------------------------------------


def _eval_count(
    adapters: Mapping[str, Any],
    unresolved: int,
    opts: Mapping[str, Any],
    instance_type: Optional[str],
) -> list[Finding]:
    """Count against the expectation. Devices that could not be classified (unresolved) may be
    adapters: "fewer" only when even counting them there are fewer (their READ_FAILED says the
    rest)."""
    expected = expected_adapters(opts, instance_type)
    found = len(adapters)
    if expected is None or found == expected.count:
        return []
    if found < expected.count <= found + unresolved:
        return []
    source = "expected_adapters" if opts.get("expected_adapters") is not None else instance_type
    details = {
        "found": found,
        "expected": expected.count,
        "expected_from": source,
        "verified": expected.verified,
        "adapters": sorted(adapters),
    }
    fewer = found < expected.count
    severity = None if fewer and expected.verified else Severity.WARNING
    note = "" if expected.verified else " (table entry unverified: set expected_adapters)"
    what = "" if fewer else "more than "
    return [
        Finding(
            "EFA_ADAPTER_COUNT",
            NODE,
            f"{found} EFA adapters found, {what}{expected.count} expected ({source}){note}",
            details,
            severity=severity,
        )
    ]


def _eval_unbound(adapters: Mapping[str, Any], functions: Mapping[str, Any]) -> list[Finding]:
    """EFA PCI functions without an RDMA device: the driver is not bound, or it is bound but its
    probe or ``ib_register_device`` failed (efa_main.c ``efa_probe``)."""
    registered = {info.get("pci") for info in adapters.values()}
    out = []
    for bdf, info in sorted(functions.items()):
        if bdf in registered:
            continue
        driver = info.get("driver")
        how = f"bound to {driver} but has" if driver else "bound to no driver and has"
        out.append(
            Finding(
                "EFA_PCI_UNBOUND",
                f"pci:{bdf}",
                f"EFA PCI function {bdf} ({info.get('device')}) is {how} no RDMA device",
                {"pci": bdf, "device": info.get("device"), "driver": driver},
            )
        )
    return out


def _eval_ena(ena: Mapping[str, Any], adapters: Mapping[str, Any]) -> list[Finding]:
    """ENA interfaces that are administratively up without carrier. The EFA adapters on the same
    PCI bus are named in the details (the pairing is by bus number, not documented by AWS)."""
    out = []
    for ifname, info in sorted(ena.items()):
        if not info.get("up") or info.get("carrier") != 0:
            continue
        bus = str(info.get("pci", "")).rsplit(":", 1)[0]
        same_bus = sorted(
            n for n, a in adapters.items() if str(a.get("pci", "")).rsplit(":", 1)[0] == bus
        )
        out.append(
            Finding(
                "EFA_ENA_LINK_DOWN",
                f"net:{ifname}",
                f"ENA interface {ifname} is up without carrier (operstate {info.get('operstate')})",
                {
                    "pci": info.get("pci"),
                    "operstate": info.get("operstate"),
                    "efa_same_bus": same_bus,
                },
            )
        )
    return out


def delta(now: Optional[int], before: Optional[int]) -> Optional[int]:
    """Growth of a counter between reads: None when it was reset (went down, no wrap)."""
    return counters.growth(now, before, wraps_at=U64)


def _flat(info: Mapping[str, Any]) -> dict[str, int]:
    """Port-1 (first port) counters, then device-level ones."""
    out: dict[str, int] = {}
    for _port, pinfo in sorted(info.get("ports", {}).items()):
        for key, value in pinfo.get("counters", {}).items():
            out.setdefault(key, value)
    for key, value in info.get("counters", {}).items():
        out.setdefault(key, value)
    return out


def _delta(_counter: str, now: Optional[int], before: Optional[int]) -> Optional[int]:
    return delta(now, before)


def _eval_growth(adapters: Mapping[str, Any], base: Mapping[str, Any]) -> list[Finding]:
    out = []
    for name, info in sorted(adapters.items()):
        before = (base.get(name) or {}).get("counters", {})
        grew: dict[str, dict[str, dict[str, int]]] = {}
        for counter, code in GROWTH_CODES.items():
            now = info.get("counters", {}).get(counter)
            if now is None:
                continue
            grown = delta(now, before.get(counter))
            if grown:
                grew.setdefault(code, {})[counter] = {"grown": grown, "total": now}
        for code, items in sorted(grew.items()):
            what = ", ".join(f"{c} +{v['grown']} (now {v['total']})" for c, v in items.items())
            out.append(Finding(code, f"efa:{name}", f"{name}: {what}", {"counters": items}))
    return out
