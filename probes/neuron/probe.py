"""``neuron`` probe: AWS Neuron devices (Trainium, Inferentia) through the driver's sysfs.

Reads ``devices/virtual/neuron_device/neuron*`` under the sysfs root (docs/neuron-efa.md has the
layout, the codes and the tables by instance type). Device ``stats/hardware`` values are current
readings (non-zero is a fault); core ``stats/status/*/total`` and ``other_info/reset_fail_count``
are totals since the driver loaded, so only their growth is a fault: the baseline is the previous
run's snapshot (``ctx.previous``), a second sample taken ``oneshot_sample_s`` later under
``hma check``, or zero right after a reboot (new boot id: the driver reloaded). A total that goes
down is a reset, never a fault; a total the baseline has no value for (unreadable or absent then)
establishes one, never growth. Counters are decimal: hex, or -1 written unsigned ("not
available"), is a read failure (unknown).
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar, Iterable, Mapping, Optional

from hma.adapters.files import ReadError, RootReader
from hma.adapters.strict import ASCII_SPACE, ParseError, parse_uint
from hma.contracts.model import Finding, Severity
from hma.contracts.options import Option
from hma.contracts.probe import Probe, ProbeContext
from hma.probes.support import counters
from hma.probes.support.findings import read_failures

BASE = "devices/virtual/neuron_device"
MAX_DEVICES = 1024  # a connected_devices entry above this is not a device number
MAX_CORES = 1024  # a core_count above this is not a count (-1 written unsigned, garbage)
NODE = "node"

# Devices (chips) per instance type (REFERENCE 4.2; all from the Neuron architecture docs).
EXPECTED_DEVICES: dict[str, int] = {
    "trn1.2xlarge": 1,
    "trn1.32xlarge": 16,
    "trn1n.32xlarge": 16,
    "trn2.48xlarge": 16,
    "trn2u.48xlarge": 16,
    "inf2.xlarge": 1,
    "inf2.8xlarge": 1,
    "inf2.24xlarge": 6,
    "inf2.48xlarge": 12,
}


def trn2_topology() -> dict[str, list[int]]:
    """trn2 4x4 torus as ``neuron-ls`` prints it (REFERENCE 4.2): up, left, down, right."""
    out = {}
    for d in range(16):
        r, c = divmod(d, 4)
        out[str(d)] = [(d - 4) % 16, 4 * r + (c - 1) % 4, (d + 4) % 16, 4 * r + (c + 1) % 4]
    return out


# connected_devices by instance type; only documented (verified) topologies are listed.
TOPOLOGIES: dict[str, dict[str, list[int]]] = {
    "trn2.48xlarge": trn2_topology(),
    "trn2u.48xlarge": trn2_topology(),
}

HARDWARE = {
    "mem_ecc_uncorrected": "NEURON_MEM_ECC_UNCORRECTED",
    "sram_ecc_uncorrected": "NEURON_SRAM_ECC_UNCORRECTED",
    "mem_ecc_repairable_uncorrected": "NEURON_MEM_ECC_REPAIRABLE",
}
# Status counters whose growth is a hardware fault, and their code; others in
# ``status_counters`` map to NEURON_CORE_HW_ERROR.
UE_COUNTERS = ("hw_hbm_ue_error", "hw_nc_ue_error")
DEFAULT_STATUS = [
    "hw_error",
    "hw_hbm_ue_error",
    "hw_nc_ue_error",
    "hw_dma_abort_error",
    "hw_collectives_error",
    "hw_repairable_hbm_ue_error",
]
# The Neuron sysfs guide's names for counters the 2025 driver renamed (REFERENCE 4.1).
DOC_ALIASES = {
    "execute_completed_with_error": "infer_completed_with_error",
    "execute_completed_with_num_error": "infer_completed_with_num_error",
    "execute_failed_to_queue": "infer_failed_to_queue",
}
_DEVICE_RE = re.compile(r"^neuron(\d+)$")
_CORE_RE = re.compile(r"^neuron_core(\d+)$")


def _topology_check(value: Any) -> Optional[str]:
    for key, neighbours in value.items():
        if not str(key).isdigit():
            return f"keys must be device numbers, got {key!r}"
        if not isinstance(neighbours, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in neighbours
        ):
            return f"device {key}: expected a list of device numbers"
    return None


def normalise_instance(instance_type: Optional[str]) -> str:
    """Lower-case instance type without surrounding blanks ('' when unknown)."""
    return (instance_type or "").strip().lower()


class NeuronProbe(Probe):
    """Neuron device count, core counts, ECC, hardware error counters, resets and topology."""

    name = "neuron"
    description = "AWS Neuron devices: count, cores, ECC, hardware errors, resets, topology"
    default_interval = 30.0
    default_timeout = 20.0
    subsystems = ("neuron_device", "pci")
    unsupported_stands = True  # no devices (or no driver) until a device event
    options: ClassVar[Mapping[str, Option]] = {
        "expected_devices": Option(
            "int",
            None,
            "Neuron devices expected; unset: the table by instance type (docs/neuron-efa.md).",
            minimum=0,
        ),
        "expected_core_count": Option(
            "int",
            None,
            "core_count every device must show; unset: only checks that all devices agree.",
            minimum=1,
        ),
        "expected_topology": Option(
            "table",
            None,
            'connected_devices per device, e.g. { "0" = [12, 3, 4, 1] }; unset: built-in table.',
            check=_topology_check,
        ),
        "check_topology": Option("bool", True, "Compare connected_devices (warning only)."),
        "status_counters": Option(
            "strlist",
            DEFAULT_STATUS,
            "Per-core stats/status counters whose growth is a hardware fault (driver names).",
        ),
        "oneshot_sample_s": Option(
            "float",
            1.0,
            "Under `hma check`: seconds between the two samples for growth (0: not evaluated).",
            minimum=0,
        ),
    }

    def applies(self, ctx: ProbeContext) -> Optional[str]:
        if _present(ctx.sysfs, BASE):
            return None
        if _expected_devices(ctx.options, ctx.instance_type):
            return None  # expected but absent: the count check reports it
        return f"no Neuron devices ({ctx.sysfs.path(BASE)} does not exist)"

    def collect(self, ctx: ProbeContext) -> Any:
        names = list(ctx.options["status_counters"])

        def read() -> dict[str, Any]:
            snap = read_tree(ctx.sysfs, names)
            snap["boot_id"], snap["ts"] = ctx.boot_id, ctx.clock()
            return snap

        return counters.sampled(ctx, read, "devices")

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        opts = ctx.options
        devices: dict[str, Any] = snapshot.get("devices", {})
        out = read_failures(
            "NEURON_READ_FAILED",
            snapshot.get("errors", []),
            lambda e: f"neuron:{e['device']}" if e.get("device") is not None else NODE,
        )
        if snapshot.get("listed", True):  # "missing" only when the folder lists without it
            out += _eval_count(devices, opts, ctx.instance_type)
        out += _eval_cores(devices, opts)
        out += _eval_hardware(devices)
        base, zero = _baseline(snapshot, ctx)
        if base is not None:
            out += _eval_growth(devices, base, list(opts["status_counters"]), zero)
        if opts["check_topology"]:
            out += _eval_topology(devices, opts, ctx.instance_type)
        return out


def _expected_devices(opts: Mapping[str, Any], instance_type: Optional[str]) -> Optional[int]:
    if opts.get("expected_devices") is not None:
        return int(opts["expected_devices"])
    return EXPECTED_DEVICES.get(normalise_instance(instance_type))


# --- collect ---------------------------------------------------------------------------------


def read_tree(sysfs: RootReader, status_counters: Iterable[str]) -> dict[str, Any]:
    """Read every device; read errors are recorded (path + error), never raised.

    ``listed`` is False when the device folder itself could not be listed: then no device is
    known to be missing.
    """
    errors: list[dict[str, Any]] = []
    devices: dict[str, Any] = {}
    entries = _listdir(sysfs, BASE, None, errors)
    if entries is None:
        return {"devices": {}, "errors": errors, "listed": False}
    wanted = list(status_counters)
    for entry in entries:
        match = _DEVICE_RE.match(entry)
        if match:
            devices[match.group(1)] = _read_device(
                sysfs, f"{BASE}/{entry}", match.group(1), wanted, errors
            )
    return {"devices": devices, "errors": errors}


def _read(
    errors: list[dict[str, Any]], device: str, sysfs: RootReader, rel: str, kind: str = "counter"
) -> Any:
    try:
        if kind == "counter":
            return sysfs.counter(rel)
        if kind == "cores":
            return sysfs.integer(rel, hex_ok=False, limit=MAX_CORES)
        return sysfs.text(rel)
    except ReadError as exc:
        errors.append(sysfs.failure(rel, exc, device=device))
        return None


def _present(sysfs: RootReader, rel: str) -> bool:
    """Whether ``rel`` exists, even as a broken link or a loop (then reading it fails: unknown)."""
    return os.path.lexists(sysfs.path(rel))


def _listdir(
    sysfs: RootReader, rel: str, device: Optional[str], errors: list[dict[str, Any]]
) -> Optional[list[str]]:
    """Entries of a folder (empty when absent); None, with the error recorded, when unreadable."""
    try:
        return sysfs.listdir(rel)
    except ReadError as exc:
        errors.append(sysfs.failure(rel, exc, device=device))
        return None


def _read_device(
    sysfs: RootReader, dev: str, index: str, wanted: list[str], errors: list[dict[str, Any]]
) -> dict[str, Any]:
    out: dict[str, Any] = {"core_count": _read(errors, index, sysfs, f"{dev}/core_count", "cores")}
    text = _read(errors, index, sysfs, f"{dev}/connected_devices", kind="text")
    out["connected"] = _parse_connected(
        text, str(sysfs.path(f"{dev}/connected_devices")), index, errors
    )
    out["hardware"] = {
        name: _read(errors, index, sysfs, f"{dev}/stats/hardware/{name}") for name in HARDWARE
    }
    cores: dict[str, Any] = {}
    for entry in _listdir(sysfs, dev, index, errors) or []:
        match = _CORE_RE.match(entry)
        if match:
            cores[match.group(1)] = _read_core(sysfs, f"{dev}/{entry}", index, wanted, errors)
    out["cores"] = cores
    return out


def _parse_connected(
    text: Optional[str], rel: str, device: str, errors: list[dict[str, Any]]
) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [
            parse_uint(p, limit=MAX_DEVICES, hex_ok=False)
            for p in text.split(",")
            if p.strip(ASCII_SPACE)
        ]
    except ParseError:
        errors.append({"path": rel, "error": f"not a device list: {text[:40]!r}", "device": device})
        return None


def _read_core(
    sysfs: RootReader, core: str, device: str, wanted: list[str], errors: list[dict[str, Any]]
) -> dict[str, Any]:
    # The driver's path is stats/status; the sysfs guide's examples show status/ directly.
    status_dir = f"{core}/stats/status"
    if not _present(sysfs, status_dir) and _present(sysfs, f"{core}/status"):
        status_dir = f"{core}/status"
    present = set(_listdir(sysfs, status_dir, device, errors) or [])
    status: dict[str, Any] = {}
    for name in wanted:
        label = name if name in present else DOC_ALIASES.get(name, "")
        if label in present:  # absent on older drivers: not an error
            status[name] = _read(errors, device, sysfs, f"{status_dir}/{label}/total")
    other: dict[str, Any] = {}
    reset_fail = f"{core}/stats/other_info/reset_fail_count"
    if _present(sysfs, reset_fail):
        other["reset_fail_count"] = _read(errors, device, sysfs, f"{reset_fail}/total")
    return {"status": status, "other": other}


# --- evaluate (pure) -------------------------------------------------------------------------


def _eval_count(
    devices: Mapping[str, Any], opts: Mapping[str, Any], instance_type: Optional[str]
) -> list[Finding]:
    expected = _expected_devices(opts, instance_type)
    if expected is None:
        return []
    found = len(devices)
    if found == expected:
        return []
    source = "expected_devices" if opts.get("expected_devices") is not None else instance_type
    details = {
        "found": found,
        "expected": expected,
        "expected_from": source,
        "devices": sorted(int(d) for d in devices),
        "missing": [d for d in range(expected) if str(d) not in devices],
    }
    if found < expected:
        return [
            Finding(
                "NEURON_DEVICE_COUNT",
                NODE,
                f"{found} Neuron devices found, {expected} expected ({source})",
                details,
            )
        ]
    return [
        Finding(
            "NEURON_DEVICE_COUNT",
            NODE,
            f"{found} Neuron devices found, more than the {expected} expected ({source})",
            details,
            severity=Severity.WARNING,
        )
    ]


def _eval_cores(devices: Mapping[str, Any], opts: Mapping[str, Any]) -> list[Finding]:
    counts = {d: v["core_count"] for d, v in devices.items() if v.get("core_count") is not None}
    if not counts:
        return []
    expected = opts.get("expected_core_count")
    if expected is None:
        values = sorted(counts.values())
        # the most common value, ties broken by the larger one (a lost core lowers the count)
        expected = max(set(values), key=lambda v: (values.count(v), v))
    out = []
    for dev, count in sorted(counts.items(), key=lambda kv: int(kv[0])):
        if count != expected:
            out.append(
                Finding(
                    "NEURON_CORE_COUNT",
                    f"neuron:{dev}",
                    f"neuron{dev} reports core_count {count}, {expected} expected",
                    {"core_count": count, "expected": expected},
                )
            )
    return out


def _eval_hardware(devices: Mapping[str, Any]) -> list[Finding]:
    out = []
    for dev, info in sorted(devices.items(), key=lambda kv: int(kv[0])):
        for name, code in HARDWARE.items():
            value = (info.get("hardware") or {}).get(name)
            if value:
                out.append(
                    Finding(
                        code,
                        f"neuron:{dev}",
                        f"neuron{dev} stats/hardware/{name} = {value}",
                        {"counter": name, "value": value},
                    )
                )
    return out


def _baseline(
    snapshot: Mapping[str, Any], ctx: ProbeContext
) -> tuple[Optional[Mapping[str, Any]], bool]:
    """Devices to compare against (the oneshot first sample, the previous run), and whether a
    total absent there counts from zero (True only after a reboot: the driver reloaded)."""
    if isinstance(snapshot.get("baseline"), dict):
        return dict(snapshot["baseline"].get("devices", {})), False
    prev = ctx.previous
    if not isinstance(prev, dict):
        return None, False
    if counters.rebooted(prev, snapshot, strict=False):
        return {}, True  # rebooted: the driver's totals started from zero at this boot
    devices = prev.get("devices", {})
    if not isinstance(devices, dict):
        return None, False  # a stored snapshot of another shape
    return devices, False


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _grown(now: Any, before: Mapping[str, Any], key: str, zero: bool) -> int:
    """Growth of a total since ``before[key]``; none when either side was not read or the key is
    absent (no baseline: this value becomes it), unless ``zero`` (a new boot: absent is zero);
    none when it went down (a reset)."""
    was = before.get(key, 0 if zero else None)
    if not isinstance(now, int) or not isinstance(was, int):
        return 0
    return counters.growth(now, was) or 0


def _eval_growth(
    devices: Mapping[str, Any], base: Mapping[str, Any], counters: list[str], zero: bool
) -> list[Finding]:
    out = []
    for dev, info in sorted(devices.items(), key=lambda kv: int(kv[0])):
        before_dev = _dict(base.get(dev))
        by_code: dict[str, list[dict[str, Any]]] = {}
        for core, cinfo in sorted((info.get("cores") or {}).items(), key=lambda kv: int(kv[0])):
            before_core = _dict(_dict(before_dev.get("cores")).get(core))
            for name in counters:
                now = (cinfo.get("status") or {}).get(name)
                grown = _grown(now, _dict(before_core.get("status")), name, zero)
                if grown:
                    code = "NEURON_CORE_UE_ERROR" if name in UE_COUNTERS else "NEURON_CORE_HW_ERROR"
                    by_code.setdefault(code, []).append(
                        {"core": int(core), "counter": name, "total": now, "grown": grown}
                    )
            now = (cinfo.get("other") or {}).get("reset_fail_count")
            grown = _grown(now, _dict(before_core.get("other")), "reset_fail_count", zero)
            if grown:
                by_code.setdefault("NEURON_RESET_FAILED", []).append(
                    {"core": int(core), "counter": "reset_fail_count", "total": now, "grown": grown}
                )
        for code, items in sorted(by_code.items()):
            what = ", ".join(f"nc{i['core']} {i['counter']} +{i['grown']}" for i in items)
            out.append(Finding(code, f"neuron:{dev}", f"neuron{dev}: {what}", {"counters": items}))
    return out


def _eval_topology(
    devices: Mapping[str, Any], opts: Mapping[str, Any], instance_type: Optional[str]
) -> list[Finding]:
    expected = opts.get("expected_topology") or TOPOLOGIES.get(normalise_instance(instance_type))
    out = []
    for dev, info in sorted(devices.items(), key=lambda kv: int(kv[0])):
        seen = info.get("connected")
        if seen is None:
            continue
        problem = None
        if expected is not None and str(dev) in expected:
            want = expected[str(dev)]
            if sorted(seen) != sorted(want):
                problem = {"expected": list(want)}
        else:  # no documented topology: links must at least be symmetric
            one_way = [
                n
                for n in seen
                if str(n) in devices
                and devices[str(n)].get("connected") is not None
                and int(dev) not in devices[str(n)]["connected"]
            ]
            if one_way:
                problem = {"not_reciprocated_by": one_way}
        if problem is not None:
            out.append(
                Finding(
                    "NEURON_TOPOLOGY",
                    f"neuron:{dev}",
                    f"neuron{dev} connected_devices {seen} differs from the expected topology",
                    {"connected_devices": seen, **problem},
                )
            )
    return out
