"""``infiniband`` probe: InfiniBand and RoCE ports under ``class/infiniband`` in sysfs.

Every RDMA device except those of ``exclude_vendor_ids`` (EFA, PCI vendor 0x1d0f, has its own
probe) is read: mlx5, mlx4, hfi1, irdma, and devices without a PCI function (soft RoCE). Per
port (component ``ib:<device>/<port>``), as the kernel's ``drivers/infiniband/core/sysfs.c``
writes them: ``state`` ("4: ACTIVE"), ``rate`` ("400 Gb/sec (4X NDR)", read only on an ACTIVE
port), ``phys_state`` (read only to explain a port that is not ACTIVE), ``link_layer`` and the
PMA error counters under ``counters/`` as rates against ``rate_limits``; ``link_downed``
increments in ``flap_window_s`` are link flaps. A port that is not ACTIVE on a node that should
have it (``expected_ports``, or a port this node has seen ACTIVE before: the learned baseline
kept in the snapshot) is ``IB_PORT_DOWN``, which drains. On an 8-GPU board of a known product
(``expect.FABRICS``) with nothing configured, the compute ports are expected from the GPUs: the
odd one out is flagged (``expect.odd_ports``). What cannot be read or parsed strictly
is ``IB_READ_FAILED`` (unknown), never a down port or growth. docs/infiniband.md.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Mapping, Optional

from hma.adapters.files import ReadError, RootReader
from hma.adapters.strict import U64_MAX, ParseError, parse_uint, parse_word
from hma.contracts.model import Finding, Severity
from hma.contracts.options import Option, pci_ids, rate_limits
from hma.contracts.probe import Probe, ProbeContext
from hma.probes.infiniband import expect
from hma.probes.support import counters
from hma.probes.support.discovery import Discovery
from hma.probes.support.findings import read_failures

IB = "class/infiniband"
NODE = "node"

# IB port states (``ib_port_state``). A file that does not read "<number>: <word>" with one of
# these words is unknown, never "down".
PORT_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")

# Widths in bits of the PMA PortCounters fields the kernel shows under ``ports/N/counters``
# (``PORT_PMA_ATTR`` in drivers/infiniband/core/sysfs.c). These counters stop at their maximum
# (IBA 16.1.3.5): a saturated counter cannot show growth, so it is not judged; a file showing more
# than its field can hold is unknown (IB_READ_FAILED), never a saturated count.
PMA_WIDTHS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
FLAP_COUNTER = "link_downed"
# What older kernels' show_pma_counter writes for a device without a PMA (i40iw, soft RoCE).
NO_PMA = "N/A (no PMA)"

# infiniband-diags' default error thresholds (rdma-core infiniband-diags/etc/error_thresholds:
# SymbolErrorCounter=10, PortXmitDiscards=100, ...), counts that ibqueryerrors reports a port
# past; here spread over the default 30 s interval as a per-second warning limit.
ERROR_THRESHOLDS: dict[str, int] = {
    "symbol_error": 10,
    "link_error_recovery": 10,
    "port_rcv_errors": 10,
    "port_rcv_remote_physical_errors": 100,
    "local_link_integrity_errors": 10,
    "excessive_buffer_overrun_errors": 10,
    "port_xmit_discards": 100,
}
DEFAULT_RATE_LIMITS: dict[str, float] = {k: round(v / 30.0, 3) for k, v in ERROR_THRESHOLDS.items()}

# "%d%s Gb/sec (%dX%s)" (sysfs.c rate_show): "2.5 Gb/sec (1X SDR)", "10 Gb/sec (4X)".
_RATE = re.compile(
    r"([0-9]{1,6}(?:\.[0-9]{1,3})?) Gb/sec \(([0-9]{1,2})X(?: ([A-Za-z0-9]{1,12}))?\)\Z", re.ASCII
)
_PORT_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}/[0-9]{1,3}\Z", re.ASCII)


def _port_keys(value: Any) -> Optional[str]:
    for item in value:
        if not _PORT_KEY.match(item):
            return f"expected '<device>/<port>' (mlx5_0/1), got {item[:40]!r}"
    return None


class InfinibandProbe(Probe):
    """Port state, rate, error-counter rates and link flaps of InfiniBand/RoCE ports."""

    name = "infiniband"
    description = "InfiniBand/RoCE ports: state, rate, error counter rates, link flaps"
    default_interval = 30.0
    default_timeout = 20.0
    subsystems = ("infiniband", "pci")
    unsupported_stands = True  # no devices until a device event
    options: ClassVar[Mapping[str, Option]] = {
        "expected_ports": Option(
            "strlist",
            [],
            "Ports that must be ACTIVE ('mlx5_0/1'); a missing device or a down port is critical.",
            check=_port_keys,
        ),
        "learn_ports": Option(
            "bool",
            True,
            "Ports seen ACTIVE once are expected from then on (kept in the probe's snapshot).",
        ),
        "expected_rate_gbps": Option(
            "float",
            None,
            "Rate every ACTIVE port must reach; unset: the best rate the port has shown.",
            minimum=0,
        ),
        "expect_from_gpus": Option(
            "bool",
            True,
            "Without expected_ports and expected_rate_gbps: expect the compute ports of a known"
            " 8-GPU board (from the GPUs' PCI device id).",
        ),
        "exclude_vendor_ids": Option(
            "strlist",
            ["0x1d0f"],
            "PCI vendors whose RDMA devices this probe leaves alone (EFA: the efa probe).",
            check=pci_ids,
        ),
        "rate_limits": Option(
            "table",
            DEFAULT_RATE_LIMITS,
            "Per-second warning limit per counter under ports/N/counters.",
            check=rate_limits,
        ),
        "critical_factor": counters.CRITICAL_FACTOR,
        "flap_window_s": Option(
            "float", 3600.0, "Window in which link_downed increments are counted.", minimum=1
        ),
        "flap_limit": Option(
            "int", 3, "Link-down events in the window that make a port flapping.", minimum=1
        ),
        "oneshot_sample_s": counters.ONESHOT_SAMPLE,
    }

    def __init__(self) -> None:
        self._layout: Discovery[Layout] = Discovery(IB)

    def layout(self, ctx: ProbeContext) -> Layout:
        """What ``discover`` finds, kept (``Discovery``) while the sysfs root, the boot, the device
        events and the listing of ``class/infiniband`` stay the same, unless it has errors."""
        excluded = tuple(ctx.options["exclude_vendor_ids"])
        wanted = frozenset(ctx.options["rate_limits"]) | {FLAP_COUNTER}
        return self._layout.get(
            ctx,
            (excluded, wanted),
            lambda: discover(ctx.sysfs, excluded, wanted),
            lambda layout: not layout.errors,
        )

    def applies(self, ctx: ProbeContext) -> Optional[str]:
        try:
            layout = self.layout(ctx)
        except ReadError:
            return None  # collect reports the unreadable folder (unknown)
        if layout.ports or layout.errors or ctx.options["expected_ports"]:
            return None
        return "no InfiniBand/RoCE ports"

    def collect(self, ctx: ProbeContext) -> Any:
        snap = counters.sampled(ctx, lambda: self._read(ctx), "ports")
        remember(snap, ctx)
        return snap

    def _read(self, ctx: ProbeContext) -> dict[str, Any]:
        try:
            snap = read_ports(ctx.sysfs, self.layout(ctx))
        except ReadError as exc:
            error = ctx.sysfs.failure(IB, exc, port=None)
            snap = {"ports": {}, "excluded": [], "errors": [error], "listed": False}
        finally:
            self._layout.done()
        snap["ts"], snap["boot_id"] = ctx.clock(), ctx.boot_id
        return snap

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        opts = ctx.options
        ports: dict[str, Any] = snapshot.get("ports", {})
        out = read_failures(
            "IB_READ_FAILED",
            snapshot.get("errors", []),
            lambda e: f"ib:{e['port']}" if e.get("port") else NODE,
        )
        out += _eval_states(snapshot, opts)
        out += _eval_rate(ports, snapshot.get("best_rate", {}), opts)
        base, base_ts = counters.baseline(snapshot, ctx, "ports", strict_boot=True)
        dt = float(snapshot.get("ts", 0.0)) - base_ts
        if base is not None and dt > 0:
            codes = ("IB_COUNTER_RATE_WARN", "IB_COUNTER_RATE_CRIT")
            out += counters.rate_findings(
                codes, "ib", ports, base, dt, opts, counters=_counters, grow=growth
            )
        out += _eval_flaps(snapshot, opts)
        return _with_fabric(out, snapshot, opts)

    def summary(self, snapshot: Any) -> Optional[dict]:
        ports = snapshot.get("ports", {}) if isinstance(snapshot, dict) else {}
        return {
            key: {k: p.get(k) for k in ("state", "rate", "link_layer")}
            for key, p in sorted(ports.items())
        } or None

    def expectations(self, snapshot: Any) -> dict[str, Any]:
        """The ACTIVE ports as ``expected_ports`` (a port that goes down or away is critical),
        and their rate as ``expected_rate_gbps`` when they all run at one rate."""
        if not isinstance(snapshot, dict) or not snapshot.get("listed", True):
            return {}
        ports = snapshot.get("ports", {})
        active = sorted(k for k, p in ports.items() if p.get("state") == "ACTIVE")
        if not active:
            return {}
        out: dict[str, Any] = {"expected_ports": active}
        rates = {ports[k].get("rate_gbps") for k in active}
        if len(rates) == 1 and isinstance(next(iter(rates)), float):
            out["expected_rate_gbps"] = rates.pop()
        return out


# --- collect ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What discovery found; static until a device event or a reboot.

    ``ports``: "<device>/<port>" -> {"link_layer", "counters": names present and judged};
    ``excluded``: devices of excluded vendors; ``errors``: devices that could not be classified
    (unknown: they may be ports this node should have).
    """

    ports: dict[str, dict[str, Any]]
    excluded: list[str]
    errors: list[dict[str, Any]]
    fabric: Optional[expect.Fabric] = None


def discover(sysfs: RootReader, excluded: tuple[str, ...], wanted: frozenset[str]) -> Layout:
    """Every port of every RDMA device not of an ``excluded`` PCI vendor, with its link layer
    and which of the ``wanted`` counters exist, and the board's compute fabric (``expect``)
    unless an excluded device (EFA) is there. A device without ``device/vendor`` (no PCI
    function: soft RoCE, siw) is read; one whose vendor cannot be read or parsed is an error.
    Raises ReadError when ``class/infiniband`` cannot be listed."""
    vendors = {int(v, 16) for v in excluded}
    ports: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    errors: list[dict[str, Any]] = []
    for dev in sysfs.listdir(IB):
        base = f"{IB}/{dev}"
        try:
            if sysfs.text_or_none(f"{base}/device/vendor") is not None:
                if sysfs.pci_id(f"{base}/device/vendor") in vendors:
                    skipped.append(dev)
                    continue
            found = sysfs.listdir(f"{base}/ports")
            if not found:
                raise ReadError(f"{sysfs.path(base)}/ports: no ports listed")
            for port in found:
                rel = f"{base}/ports/{port}"
                names = [c for c in sysfs.listdir(f"{rel}/counters") if c in wanted]
                ports[f"{dev}/{port}"] = {
                    "link_layer": sysfs.text_or_none(f"{rel}/link_layer"),
                    "counters": names,
                }
        except ReadError as exc:
            for key in [k for k in ports if k.startswith(f"{dev}/")]:
                del ports[key]
            errors.append(sysfs.failure(base, exc, port=dev))
    fabric = None if skipped else expect.fabric_of(sysfs)  # EFA's fabric is the efa probe's
    return Layout(ports, skipped, errors, fabric)


def port_state(sysfs: RootReader, rel: str) -> str:
    """The state word of a port's ``state`` file ("4: ACTIVE" -> "ACTIVE"), strictly; ReadError
    for a file that is not "<number>: <word>" with an IB port state word."""
    raw = sysfs.text(rel)
    number, sep, word = raw.partition(":")
    try:
        if not sep:
            raise ParseError(f"not '<number>: <state>': {raw[:40]!r}")
        parse_uint(number, hex_ok=False, limit=255)
        return parse_word(word, PORT_STATES, fold_case=False)
    except ParseError as exc:
        raise ReadError(f"{sysfs.path(rel)}: {exc}") from None


def parse_rate(raw: str) -> float:
    """Gb/s of a ``rate`` file ("400 Gb/sec (4X NDR)" -> 400.0); ParseError otherwise."""
    match = _RATE.match(raw)
    if match is None:
        raise ParseError(f"not '<N> Gb/sec (<W>X <SPEED>)': {raw[:40]!r}")
    return float(match.group(1))


def read_ports(sysfs: RootReader, layout: Layout) -> dict[str, Any]:
    """Read what changes (state, rate or phys_state, judged counters) of the ports in ``layout``;
    errors are recorded in the snapshot, never raised."""
    errors = list(layout.errors)
    ports: dict[str, Any] = {}
    for key, static in layout.ports.items():
        dev, port = key.split("/")
        rel = f"{IB}/{dev}/ports/{port}"
        info: dict[str, Any] = {"state": None, "link_layer": static["link_layer"]}
        try:
            info["state"] = port_state(sysfs, f"{rel}/state")
        except ReadError as exc:
            errors.append(sysfs.failure(f"{rel}/state", exc, port=key))
        if info["state"] == "ACTIVE":
            try:
                raw = sysfs.text(f"{rel}/rate")
                info["rate"], info["rate_gbps"] = raw, parse_rate(raw)
            except (ReadError, ParseError) as exc:
                errors.append(sysfs.failure(f"{rel}/rate", exc, port=key))
        elif info["state"] is not None:
            try:
                info["phys_state"] = sysfs.text(f"{rel}/phys_state")[:40]
            except ReadError:
                info["phys_state"] = None  # it only explains the state
        counters: dict[str, int] = {}
        for name in static["counters"]:
            path = f"{rel}/counters/{name}"
            try:
                raw = sysfs.text(path)
                if raw == NO_PMA:
                    info["no_pma"] = True  # the device answers no PMA query: nothing to judge
                    continue
                counters[name] = parse_uint(raw, hex_ok=False, limit=counter_max(name))
            except (ReadError, ParseError) as exc:
                errors.append(sysfs.failure(path, exc, port=key))
        info["counters"] = counters
        ports[key] = info
    fabric = asdict(layout.fabric) if layout.fabric is not None else None
    return {"ports": ports, "excluded": layout.excluded, "errors": errors, "fabric": fabric}


def remember(snap: dict[str, Any], ctx: ProbeContext) -> None:
    """Carry the probe's memory into ``snap``: ports seen ACTIVE (``learned``, across boots),
    the best rate each port has shown this boot, and link_downed increments (``flaps``: port ->
    [[ts, count], ...] within ``flap_window_s``)."""
    prev = ctx.previous if isinstance(ctx.previous, dict) else {}
    same_boot = prev.get("boot_id") == snap["boot_id"]
    ports = snap["ports"]
    learned = set(prev.get("learned", [])) if ctx.options["learn_ports"] else set()
    if ctx.options["learn_ports"]:
        learned |= {k for k, p in ports.items() if p.get("state") == "ACTIVE"}
    snap["learned"] = sorted(learned)
    best = dict(prev.get("best_rate", {})) if same_boot else {}
    for key, info in ports.items():
        if info.get("rate_gbps") is not None:
            best[key] = max(float(best.get(key, 0.0)), info["rate_gbps"])
    snap["best_rate"] = best
    horizon = snap["ts"] - float(ctx.options["flap_window_s"])
    flaps: dict[str, list[list[float]]] = {}
    for key, events in (prev.get("flaps", {}) if same_boot else {}).items():
        kept = [e for e in events if e[0] > horizon]
        if kept:
            flaps[key] = kept
    base, _ts = counters.baseline(snap, ctx, "ports", strict_boot=True)
    for key, info in ports.items():
        now = info.get("counters", {}).get(FLAP_COUNTER)
        before = ((base or {}).get(key) or {}).get("counters", {}).get(FLAP_COUNTER)
        grown = growth(FLAP_COUNTER, now, before)
        if grown:
            flaps.setdefault(key, []).append([snap["ts"], grown])
    snap["flaps"] = flaps


# --- evaluate (pure) -------------------------------------------------------------------------


def counter_max(counter: str) -> int:
    """The largest value ``counter`` can hold: its PMA field's maximum (where it saturates), or
    2^64-1 for the 64-bit extended counters. A file showing more is unknown, never a count."""
    width = PMA_WIDTHS.get(counter)
    return U64_MAX if width is None else (1 << width) - 1


def growth(counter: str, now: Optional[int], before: Optional[int]) -> Optional[int]:
    """Growth of a PMA counter between reads; None when unknown: a value missing, a reset (it
    went down) or a saturated counter (at its maximum it no longer counts)."""
    limit = counter_max(counter)
    return counters.growth(now, before, saturates_at=None if limit == U64_MAX else limit)


def _counters(info: Mapping[str, Any]) -> Mapping[str, int]:
    return info.get("counters", {})


def _eval_states(snapshot: Mapping[str, Any], opts: Mapping[str, Any]) -> list[Finding]:
    ports: Mapping[str, Any] = snapshot.get("ports", {})
    configured = set(opts["expected_ports"])
    learned = set(snapshot.get("learned", []))
    unresolved = {e["port"] for e in snapshot.get("errors", []) if e.get("port")}
    out = []
    for key, info in sorted(ports.items()):
        state = info.get("state")
        if state is None or state == "ACTIVE" or key not in configured | learned:
            continue
        why = "expected_ports" if key in configured else "seen ACTIVE before"
        out.append(
            Finding(
                "IB_PORT_DOWN",
                f"ib:{key}",
                f"{key} is {state} (phys {info.get('phys_state')}); expected ACTIVE ({why})",
                {"state": state, "phys_state": info.get("phys_state"), "expected_from": why},
            )
        )
    if snapshot.get("listed", True):
        for key in sorted((configured | learned) - set(ports)):
            if key.split("/")[0] in unresolved:
                continue  # its device could not be read: IB_READ_FAILED says so
            out.append(
                Finding(
                    "IB_PORT_MISSING",
                    f"ib:{key}",
                    f"{key} is not in {IB}"
                    + ("" if key in configured else " (seen ACTIVE before, not configured)"),
                    {"expected_from": "expected_ports" if key in configured else "learned"},
                    severity=None if key in configured else Severity.WARNING,
                )
            )
    return out


def _eval_rate(
    ports: Mapping[str, Any], best: Mapping[str, float], opts: Mapping[str, Any]
) -> list[Finding]:
    expected = opts.get("expected_rate_gbps")
    out = []
    for key, info in sorted(ports.items()):
        rate = info.get("rate_gbps")
        if rate is None:
            continue
        want = float(expected) if expected is not None else float(best.get(key, rate))
        if rate >= want:
            continue
        source = "expected_rate_gbps" if expected is not None else "best rate this boot"
        out.append(
            Finding(
                "IB_RATE_DEGRADED",
                f"ib:{key}",
                f"{key} runs at {info.get('rate')}, below {want:g} Gb/sec ({source})",
                {"rate_gbps": rate, "expected_gbps": want, "expected_from": source},
                severity=None if expected is not None else Severity.WARNING,
            )
        )
    return out


def _with_fabric(
    out: list[Finding], snapshot: Mapping[str, Any], opts: Mapping[str, Any]
) -> list[Finding]:
    """``out`` with the odd compute ports of the board's fabric (``snapshot["fabric"]``), only
    when ``expect_from_gpus`` and neither ``expected_ports`` nor ``expected_rate_gbps`` is set;
    they replace a learned finding of the same code on the same port."""
    fabric = snapshot.get("fabric")
    if not fabric or not opts["expect_from_gpus"]:
        return out
    if opts["expected_ports"] or opts.get("expected_rate_gbps") is not None:
        return out
    listed = bool(snapshot.get("listed", True))
    odd = expect.odd_ports(snapshot.get("ports", {}), expect.Fabric(**fabric), listed)
    seen = {(f.code, f.component) for f in odd}
    return [f for f in out if (f.code, f.component) not in seen] + odd


def _eval_flaps(snapshot: Mapping[str, Any], opts: Mapping[str, Any]) -> list[Finding]:
    limit = int(opts["flap_limit"])
    window = float(opts["flap_window_s"])
    out = []
    for key, events in sorted(snapshot.get("flaps", {}).items()):
        count = sum(int(e[1]) for e in events)
        if count <= 0:
            continue
        flapping = count >= limit
        out.append(
            Finding(
                "IB_LINK_FLAPPING",
                f"ib:{key}",
                f"{key}: link went down {count} time(s) in the last {window:g} s"
                + ("" if flapping else f" (flapping from {limit})"),
                {"link_downed": count, "window_s": window, "limit": limit},
                severity=None if flapping else Severity.WARNING,
            )
        )
    return out
