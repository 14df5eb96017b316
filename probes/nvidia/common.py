"""Shared GPU health rules: two readers (NVML in ``gpu``, ``nvidia-smi -q -x`` in ``nvidia_smi``),
one reading record (probes/nvidia/reading.py), one ``evaluate``.

The rules judge a snapshot in its stored JSON form (``Snapshot.to_json``), which may be the
previous run's from an older hma: every reading is looked at defensively, a field absent or None
is not measured (never a finding), a value of the wrong type is not understood (never a crash).
``with_baseline`` adds ``pcie_baseline``, carried from one snapshot to the next.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from hma.adapters.files import RootReader
from hma.contracts.model import Action, Finding, Severity, gpu_component
from hma.contracts.options import Option
from hma.contracts.probe import unknown
from hma.probes.nvidia import settle
from hma.probes.support import pci

NODE = "node"

# NVML return codes (pynvml NVML_ERROR_*): the ones that decide a finding.
NOT_SUPPORTED = 3
FUNCTION_NOT_FOUND = 13
NOT_APPLICABLE = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})
# NVML error (or nvidia-smi exit code, which reuses most of the numbers) -> finding code.
FATAL_ERRORS: Mapping[int, str] = {
    15: "GPU_LOST",  # NVML_ERROR_GPU_IS_LOST; nvidia-smi 15: fallen off the bus
    16: "GPU_RESET_REQUIRED",  # NVML_ERROR_RESET_REQUIRED
    999: "GPU_UNKNOWN_ERROR",  # NVML_ERROR_UNKNOWN
    9: "GPU_DRIVER_NOT_LOADED",  # NVML_ERROR_DRIVER_NOT_LOADED; nvidia-smi 9
    18: "GPU_DRIVER_NOT_LOADED",  # NVML_ERROR_LIB_RM_VERSION_MISMATCH (driver half upgraded)
    12: "GPU_DRIVER_NOT_LOADED",  # NVML_ERROR_LIBRARY_NOT_FOUND: no driver installed
    8: "GPU_INSUFFICIENT_POWER",  # NVML_ERROR_INSUFFICIENT_POWER; nvidia-smi 8: cables
    11: "GPU_IRQ_ISSUE",  # NVML_ERROR_IRQ_ISSUE
    14: "GPU_INFOROM_CORRUPTED",  # NVML_ERROR_CORRUPTED_INFOROM; nvidia-smi 14
}

ARCH_NAMES: Mapping[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}
PRE_AMPERE = frozenset({"kepler", "maxwell", "pascal", "volta", "turing"})

FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
FABRIC_COMPLETED = 3
FABRIC_SUMMARY = {0: "not supported", 1: "healthy", 2: "unhealthy", 3: "limited capacity"}
SUMMARY_UNHEALTHY, SUMMARY_LIMITED = 2, 3

RECOVERY_NO_DRAIN = frozenset({5})  # as hma.probes.nvidia.xid treats Xid 154 "to 0x5"
RECOVERY_ACTIONS = {
    0: "none",
    1: "GPU reset",
    2: "node reboot",
    3: "drain P2P",
    4: "drain and reset",
    5: "recover IMEX domain",
    6: "bus reset",
    7: "system reboot",
}

# GPUs per instance type, for the count check when expected_gpus is unset. Sources: the AWS EC2
# accelerated-computing instance pages (not re-checked here: all entries are marked
# unverified in docs/gpu.md except p5.48xlarge, which HyperPod documents as 8).
INSTANCE_GPUS: Mapping[str, int] = {
    "p3.2xlarge": 1,
    "p3.8xlarge": 4,
    "p3.16xlarge": 8,
    "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
    "p5e.48xlarge": 8,
    "p5en.48xlarge": 8,
    "p6-b200.48xlarge": 8,
    "g4dn.xlarge": 1,
    "g4dn.2xlarge": 1,
    "g4dn.4xlarge": 1,
    "g4dn.8xlarge": 1,
    "g4dn.16xlarge": 1,
    "g4dn.12xlarge": 4,
    "g4dn.metal": 8,
    "g5.xlarge": 1,
    "g5.2xlarge": 1,
    "g5.4xlarge": 1,
    "g5.8xlarge": 1,
    "g5.16xlarge": 1,
    "g5.12xlarge": 4,
    "g5.24xlarge": 4,
    "g5.48xlarge": 8,
    "g6.xlarge": 1,
    "g6.2xlarge": 1,
    "g6.4xlarge": 1,
    "g6.8xlarge": 1,
    "g6.16xlarge": 1,
    "g6.12xlarge": 4,
    "g6.24xlarge": 4,
    "g6.48xlarge": 8,
}


def gpus_may_be_there(
    opts: Mapping[str, Any], instance_type: Optional[str], sysfs: RootReader
) -> bool:
    """Whether a GPU probe applies even without its driver or tool: GPUs are expected, are on
    the PCI bus, or the bus cannot be read to tell (unknown, never "unsupported")."""
    if expected_count(opts, instance_type):
        return True
    gpus = pci.nvidia_devices(sysfs)
    return gpus is None or bool(gpus)


def expected_count(opts: Mapping[str, Any], instance_type: Optional[str]) -> Optional[int]:
    """GPUs this node should have: ``expected_gpus``, else the instance table, else None."""
    if opts.get("expected_gpus") is not None:
        return int(opts["expected_gpus"])
    if instance_type:
        name = instance_type.strip().lower()
        if name.startswith("ml."):  # SageMaker HyperPod names: ml.p5.48xlarge
            name = name[3:]
        return INSTANCE_GPUS.get(name)
    return None


def _link_width(value: Any) -> Optional[str]:
    return None if value in (1, 2, 4, 8, 12, 16, 32) else "must be a PCIe link width (1..32)"


# Thresholds shared by both probes (each declares them in its own [probes.NAME] section).
RULE_OPTIONS: Mapping[str, Option] = {
    "expected_gpus": Option(
        "int", None, "GPUs this node must have; unset: from the instance-type table.", minimum=0
    ),
    "expected_driver": Option(
        "str", None, "Driver version the node should run (warning when different); unset: any."
    ),
    "expected_model": Option(
        "str",
        None,
        "Product name every GPU must report, e.g. 'NVIDIA H100 80GB HBM3' (warning when "
        "different); unset: any.",
    ),
    "ecc_aggregate_uncorrected_max": Option(
        "int", 0, "Warning when lifetime uncorrected ECC errors exceed this.", minimum=0
    ),
    "ecc_aggregate_corrected_max": Option(
        "int", 10000, "Warning when lifetime corrected ECC errors exceed this.", minimum=0
    ),
    "retired_pages_max": Option(
        "int",
        60,
        "Pre-Ampere: retired pages (SBE+DBE) above this mean replace the GPU (NVIDIA RMA: 60).",
        minimum=0,
    ),
    "expected_pcie_width": Option(
        "int",
        None,
        "PCIe link width the GPUs must run at (critical below); unset: the GPU's own baseline "
        "(docs/gpu.md).",
        check=_link_width,
    ),
    "expected_pcie_gen": Option(
        "int",
        None,
        "PCIe generation the GPUs' links must run at while busy (warning below; an idle link "
        "may lower it); unset: not judged.",
        minimum=1,
        maximum=6,
    ),
    "nvlink_errors_per_minute": Option(
        "float",
        100.0,
        "Warning when NVLink error counters of a GPU rise faster than this.",
        minimum=0,
    ),
    "temp_margin_c": Option(
        "float", 0.0, "Warning when the GPU is within this many degrees of its slowdown limit."
    ),
    "hang_runs": Option(
        "int", 2, "Consecutive runs with a hung driver call that make GPU_DRIVER_HANG.", minimum=1
    ),
    "row_remap_archs": Option(
        "strlist",
        ["ampere", "hopper", "blackwell"],
        "Architectures whose data-center GPUs remap rows (REFERENCE 1.3).",
    ),
    "settle_s": Option(
        "float",
        120.0,
        "Seconds after a boot or a driver upgrade during which a GPU count mismatch, a driver "
        "that is not loaded and an unfinished fabric registration are unknown (settling), not "
        "faults; 0: judged at once.",
        minimum=0,
    ),
    "ecc_off_by_default": Option(
        "strlist",
        ["GeForce", "RTX", "TITAN", "Quadro"],
        "Product-name words of GPUs that ship with ECC off (workstation and consumer parts): "
        "ECC disabled on them is their normal, not a finding.",
    ),
    "row_remap_exclude": Option(
        "strlist",
        ["GeForce", "RTX", "TITAN"],
        "Product-name words of GPUs without row remapping even on those architectures.",
    ),
}


def _gpu_key(gpu: Mapping[str, Any], snap: Mapping[str, Any]) -> str:
    bus = gpu.get("bus_id")
    if bus:
        try:
            return gpu_component(str(bus))
        except (ValueError, IndexError):
            pass  # not a PCI bus id: fall back to the index
    addresses = snap.get("pci_gpus") or []
    idx = gpu.get("index")
    if isinstance(idx, int) and 0 <= idx < len(addresses):
        return gpu_component(addresses[idx])
    return NODE


def _count(value: Any, default: int) -> int:
    """An int from a stored snapshot of any age or shape; ``default`` when it is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def remaps_rows(gpu: Mapping[str, Any], opts: Mapping[str, Any]) -> bool:
    """Whether this GPU has row remapping (NVML may not say NOT_SUPPORTED when it has not)."""
    arch = gpu.get("arch")
    if arch not in (opts.get("row_remap_archs") or []):
        return False
    name = str(gpu.get("name") or "").lower()
    return not any(word.lower() in name for word in opts.get("row_remap_exclude") or [])


def evaluate(
    snap: Mapping[str, Any],
    opts: Mapping[str, Any],
    instance_type: Optional[str] = None,
    previous: Any = None,
    elapsed_s: float = 0.0,
) -> list[Finding]:
    """Pure: findings for one snapshot. ``previous`` is the previous snapshot of the same probe
    (for rates and the hang streak); ``elapsed_s`` the seconds since it was taken."""
    out: list[Finding] = []
    reader = str(snap.get("reader") or "")
    prev = previous if isinstance(previous, Mapping) else {}
    hang = snap.get("hang")
    if hang:
        out.append(_hang_finding(hang, prev, opts, reader))
    init = snap.get("init_error")
    if init:
        finding = _error_finding(init, NODE, reader)
        if int(init.get("code", 0)) == NO_DRIVER and expected_count(opts, instance_type) is None:
            finding = _unexpected_gpus(finding, snap.get("pci_gpus") or [])
        out.append(_settling(finding, snap))
    if hang or init:
        return out  # nothing else was measured
    out += _eval_node(snap, opts, instance_type)
    old = prev.get("gpus")
    prev_gpus = {
        g["bus_id"]: g
        for g in (old if isinstance(old, list) else [])
        if isinstance(g, Mapping) and isinstance(g.get("bus_id"), str)
    }
    for gpu in snap.get("gpus") or []:
        out += _eval_gpu(gpu, snap, opts, prev, prev_gpus.get(gpu.get("bus_id")), elapsed_s)
    return out


def _hang_finding(
    hang: Mapping[str, Any], prev: Mapping[str, Any], opts: Mapping[str, Any], reader: str
) -> Finding:
    prev_hang = prev.get("hang") if isinstance(prev.get("hang"), Mapping) else None
    streak = max(
        _count(hang.get("streak"), 1), _count(prev_hang.get("streak"), 1) + 1 if prev_hang else 1
    )
    details = {**hang, "streak": streak, "reader": reader}
    what = f"{hang.get('call')}" + (
        f" on GPU {hang['device']}" if hang.get("device") is not None else ""
    )
    if streak >= int(opts.get("hang_runs") or 2):
        return Finding(
            "GPU_DRIVER_HANG",
            NODE,
            f"{what} did not return within {hang.get('after_s')} s on {streak} consecutive runs",
            details,
        )
    return unknown(
        "GPU_NVML_TIMEOUT", NODE, f"{what} did not return within {hang.get('after_s')} s", **details
    )


def _error_finding(err: Mapping[str, Any], component: str, reader: str) -> Finding:
    code = int(err.get("code", 0))
    text = str(err.get("text") or "")
    call = str(err.get("call") or "")
    details = {"error_code": code, "error": text, "call": call, "reader": reader}
    fatal = FATAL_ERRORS.get(code)
    if fatal:
        return Finding(fatal, component, f"{call}: {text}", details)
    return unknown("GPU_READ_FAILED", component, f"{call}: {text}", **details)


NO_DRIVER = 12  # NVML_ERROR_LIBRARY_NOT_FOUND; nvidia-smi that cannot start
# What a boot or a driver upgrade shows for a while on a healthy node (settle.py).
SETTLING_CODES = frozenset({"GPU_COUNT_MISMATCH", "GPU_DRIVER_NOT_LOADED", "GPU_FABRIC_NOT_READY"})


def _settling(finding: Finding, snap: Mapping[str, Any]) -> Finding:
    """``finding`` as unknown while the snapshot's GPUs settle, for the codes a boot or a
    driver upgrade shows on a healthy node; unchanged otherwise."""
    window = snap.get("settle")
    if finding.code not in SETTLING_CODES or not isinstance(window, Mapping):
        return finding
    return unknown(
        finding.code,
        finding.component,
        f"{settle.judged_from(window)}; now: {finding.message}",
        **finding.details,
        settle=dict(window),
    ).with_(action=Action.NONE)


def _unexpected_gpus(finding: Finding, addresses: list[str]) -> Finding:
    """No driver installed while nothing says this node should have GPUs, yet NVIDIA GPUs are on
    its PCI bus (why the probe applies): the GPUs cannot be read, so unknown (DESIGN: judged only
    against a known expectation; a tool that cannot run is unknown). Configured ``expected_gpus``
    or a known instance type make it critical."""
    return unknown(
        finding.code,
        NODE,
        f"{len(addresses)} NVIDIA GPU(s) on the PCI bus but no driver installed "
        f"({finding.message}); "
        "not judged without an expected GPU count (expected_gpus or instance type)",
        **finding.details,
        pci_gpus=list(addresses),
        expected="none",
    )


def _read_failed(record: Mapping[str, Any], component: str) -> Optional[Finding]:
    """One unknown finding for all calls of a GPU (or the node) that failed to read."""
    errors = dict(sorted((record.get("call_errors") or {}).items()))
    if not errors:
        return None
    first = next(iter(errors))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return unknown(
        "GPU_READ_FAILED", component, f"{first}: {errors[first]}{more}", call_errors=errors
    )


def _eval_node(
    snap: Mapping[str, Any], opts: Mapping[str, Any], instance_type: Optional[str]
) -> list[Finding]:
    out: list[Finding] = []
    node_failed = _read_failed(snap, NODE)
    if node_failed is not None:
        out.append(node_failed)
    want = expected_count(opts, instance_type)
    count = snap.get("count")
    if want is not None and isinstance(count, int) and count != want:
        mismatch = Finding(
            "GPU_COUNT_MISMATCH",
            NODE,
            f"{count} GPU(s) visible, {want} expected",
            {"count": count, "expected": want, "instance_type": instance_type},
        )
        out.append(_settling(mismatch, snap))
    driver = snap.get("driver")
    if opts.get("expected_driver") and driver and driver != opts["expected_driver"]:
        out.append(
            Finding(
                "GPU_DRIVER_VERSION",
                NODE,
                f"driver {driver} is not the expected {opts['expected_driver']}",
                {"driver": driver, "expected": opts["expected_driver"]},
            )
        )
    domains = fabric_domains(snap)
    if len(domains) > 1:
        out.append(
            Finding(
                "GPU_FABRIC_DOMAIN_MISMATCH",
                NODE,
                f"GPUs report {len(domains)} NVLink domains: "
                + "; ".join(f"{d} (GPUs {','.join(map(str, i))})" for d, i in domains.items()),
                {"domains": {d: list(i) for d, i in domains.items()}},
            )
        )
    if snap.get("nvswitch") and snap.get("fabric_manager") is False:
        out.append(
            Finding(
                "GPU_FABRIC_MANAGER_DOWN",
                NODE,
                "NVSwitch system but the nv-fabricmanager service is not running",
                {},
            )
        )
    return out


def _eval_gpu(
    gpu: Mapping[str, Any],
    snap: Mapping[str, Any],
    opts: Mapping[str, Any],
    prev_snap: Mapping[str, Any],
    prev: Optional[Mapping[str, Any]],
    elapsed_s: float,
) -> list[Finding]:
    comp = _gpu_key(gpu, snap)
    reader = str(snap.get("reader") or "")
    base = {"index": gpu.get("index"), "bus_id": gpu.get("bus_id"), "reader": reader}
    if gpu.get("error"):
        return [_error_finding(gpu["error"], comp, reader)]
    out: list[Finding] = []
    read_failed = _read_failed(gpu, comp)
    if read_failed is not None:
        out.append(read_failed)

    def add(code: str, message: str, **details: Any) -> None:
        out.append(_settling(Finding(code, comp, message, {**base, **details}), snap))

    model = opts.get("expected_model")
    if model and isinstance(gpu.get("name"), str) and gpu["name"] != model:
        add("GPU_MODEL_MISMATCH", f"GPU is a {gpu['name']}, expected {model}", expected=model)
    _eval_memory(gpu, opts, add)
    _eval_pcie(gpu, opts, prev_snap, add)
    _eval_pcie_gen(gpu, opts, add)
    _eval_nvlink(gpu, prev, opts, elapsed_s, add)
    clocks = gpu.get("clocks") or {}
    active = [
        r
        for r in ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
        if clocks.get(r)
    ]
    if active:
        add("GPU_CLOCKS_SLOWDOWN", f"clocks held down by {', '.join(active)}", reasons=active)
    temp, slow = _num(gpu.get("temp")), _num(gpu.get("temp_slowdown"))
    if temp is not None and slow is not None and temp >= slow - float(opts["temp_margin_c"]):
        add(
            "GPU_TEMP_HIGH",
            f"{temp:.0f} C at or above the slowdown limit {slow:.0f} C",
            temp=temp,
            slowdown=slow,
        )
    _eval_fabric(gpu.get("fabric"), add)
    recovery = _recovery_finding(gpu.get("recovery_action"), comp, base)
    if recovery is not None:
        out.append(recovery)
    return out


def ecc_expected(gpu: Mapping[str, Any], opts: Mapping[str, Any]) -> bool:
    """Whether the product ships with ECC on (data-center parts), so ECC off is something to
    do; workstation and consumer parts (``ecc_off_by_default`` words) ship with it off."""
    name = str(gpu.get("name") or "").lower()
    return not any(word.lower() in name for word in opts.get("ecc_off_by_default") or [])


def _eval_memory(gpu: Mapping[str, Any], opts: Mapping[str, Any], add: Any) -> None:
    """ECC mode and counts, retired pages (before Ampere), row remapping (Ampere on)."""
    mode = gpu.get("ecc_mode")
    ecc_mode: Mapping[str, Any] = mode if isinstance(mode, Mapping) else {}
    if ecc_mode.get("current") is False and ecc_expected(gpu, opts):
        add("GPU_ECC_DISABLED", "ECC is disabled", pending=ecc_mode.get("pending"))
    ecc = gpu.get("ecc") or {}
    vol_unc = _num(ecc.get("volatile_uncorrected"))
    if vol_unc:
        add(
            "GPU_ECC_UNCORRECTED",
            f"{vol_unc:.0f} uncorrectable ECC error(s) since driver load",
            volatile_uncorrected=vol_unc,
        )
    agg_unc, agg_cor = _num(ecc.get("aggregate_uncorrected")), _num(ecc.get("aggregate_corrected"))
    if agg_unc is not None and agg_unc > opts["ecc_aggregate_uncorrected_max"]:
        add(
            "GPU_ECC_AGGREGATE_HIGH",
            f"{agg_unc:.0f} lifetime uncorrectable ECC errors",
            aggregate_uncorrected=agg_unc,
            threshold=opts["ecc_aggregate_uncorrected_max"],
        )
    elif agg_cor is not None and agg_cor > opts["ecc_aggregate_corrected_max"]:
        add(
            "GPU_ECC_AGGREGATE_HIGH",
            f"{agg_cor:.0f} lifetime correctable ECC errors",
            aggregate_corrected=agg_cor,
            threshold=opts["ecc_aggregate_corrected_max"],
        )

    arch = gpu.get("arch")
    retired = gpu.get("retired")
    if isinstance(retired, Mapping) and (arch in PRE_AMPERE or arch is None):
        if retired.get("pending"):
            add("GPU_RETIRED_PAGES_PENDING", "page retirement pending: reboot to retire")
        total = (_num(retired.get("sbe")) or 0) + (_num(retired.get("dbe")) or 0)
        if total > opts["retired_pages_max"]:
            add(
                "GPU_RETIRED_PAGES_LIMIT",
                f"{total:.0f} retired pages (limit " f"{opts['retired_pages_max']})",
                sbe=retired.get("sbe"),
                dbe=retired.get("dbe"),
            )
    remap = gpu.get("remap")
    if isinstance(remap, Mapping) and remaps_rows(gpu, opts):
        counts = {"corrected": remap.get("corrected"), "uncorrected": remap.get("uncorrected")}
        if remap.get("failure"):
            add("GPU_ROW_REMAP_FAILURE", "row remapping failed", **counts)
        if remap.get("pending"):
            add("GPU_ROW_REMAP_PENDING", "row remapping pending: reset or reboot", **counts)


def _recovery_finding(action: Any, comp: str, base: Mapping[str, Any]) -> Optional[Finding]:
    """The driver's recovery action (0: none) as a finding; recovering the IMEX domain is a
    warning without action (it does not touch the GPUs)."""
    if not isinstance(action, int) or action == 0:
        return None
    name = RECOVERY_ACTIONS.get(action, f"unknown ({action})")
    finding = Finding(
        "GPU_RECOVERY_ACTION",
        comp,
        f"driver asks for recovery action: {name}",
        {**base, "recovery_action": action, "recovery_action_name": name},
    )
    if action in RECOVERY_NO_DRAIN:  # the IMEX domain is recovered without touching GPUs
        finding = finding.with_(severity=Severity.WARNING, action=Action.NONE)
    return finding


def pcie_key(gpu: Mapping[str, Any]) -> Optional[str]:
    """Baseline key of a GPU: its bus id and UUID (a GPU moved or replaced starts afresh)."""
    bus = gpu.get("bus_id")
    return f"{bus}/{gpu.get('uuid') or ''}" if bus else None


def _link(gpu: Mapping[str, Any]) -> Optional[tuple[float, float, bool]]:
    """(width, max width, judgeable) of a GPU's PCIe link; None when not measured.

    An idle GPU may lower link generation and width to save power (the A10G capture shows gen 1
    x8 of gen 4 x16 at idle): the width is judged only at full generation or under load.
    """
    pcie = gpu.get("pcie") or {}
    width, max_width = _num(pcie.get("width")), _num(pcie.get("max_width"))
    if gpu.get("error") or width is None or max_width is None:
        return None
    gen, max_gen = _num(pcie.get("gen")), _num(pcie.get("max_gen"))
    idle = bool((gpu.get("clocks") or {}).get("gpu_idle"))
    power_saving = idle and gen is not None and max_gen is not None and gen < max_gen
    return width, max_width, not power_saving


def expectations(snap: Any) -> dict[str, Any]:
    """What ``hma genconf`` records of a snapshot (``Probe.expectations``): the GPU count, the
    model and the PCIe width and generation when every GPU reports the same (a link only where
    it is judged: not in power saving). Nothing when the reading ended early (no driver, a hang)."""
    if not isinstance(snap, Mapping) or snap.get("init_error") or snap.get("hang"):
        return {}
    out: dict[str, Any] = {}
    count = snap.get("count")
    if isinstance(count, int) and not isinstance(count, bool):
        out["expected_gpus"] = count
    gpus = [g for g in snap.get("gpus") or [] if isinstance(g, Mapping) and not g.get("error")]
    names = {g.get("name") for g in gpus}
    if len(names) == 1 and isinstance(next(iter(names)), str):
        out["expected_model"] = names.pop()
    links = [_link(g) for g in gpus]
    widths = {int(link[0]) for link in links if link is not None and link[2]}
    if len(widths) == 1 and _link_width(next(iter(widths))) is None:
        out["expected_pcie_width"] = widths.pop()
    gens = {(g.get("pcie") or {}).get("gen") for g, link in zip(gpus, links) if link and link[2]}
    if len(gens) == 1 and isinstance(next(iter(gens)), int):
        out["expected_pcie_gen"] = gens.pop()
    return out


def with_baseline(snap: dict[str, Any], previous: Any) -> dict[str, Any]:
    """``snap`` with ``pcie_baseline``: the previous snapshot's, raised by this run's judgeable
    widths. Kept across runs that measured nothing (a hang, a driver error)."""
    prev = previous if isinstance(previous, Mapping) else {}
    old = prev.get("pcie_baseline")
    baseline = {
        str(k): int(v)
        for k, v in (old.items() if isinstance(old, Mapping) else ())
        if isinstance(v, int) and not isinstance(v, bool)
    }
    for gpu in snap.get("gpus") or []:
        key, link = pcie_key(gpu), _link(gpu)
        if key and link is not None and link[2]:
            baseline[key] = max(baseline.get(key, 0), int(link[0]))
    snap["pcie_baseline"] = baseline
    return snap


def _eval_pcie(
    gpu: Mapping[str, Any], opts: Mapping[str, Any], prev: Mapping[str, Any], add: Any
) -> None:
    """Width against what is known to be expected. Below ``expected_pcie_width``, else below
    this GPU's own baseline (its widest link seen before): degraded. Without a configured width,
    below what both ends of the link can do (the GPU's maximum and its upstream port's,
    ``slot_max_width``): narrow. A GPU with no known slot (on a virtual machine's root bus) is
    not judged against its maximum: cloud instances run GPUs in x8 slots."""
    link = _link(gpu)
    if link is None or not link[2]:
        return
    width, max_width, _judged = link
    baseline = prev.get("pcie_baseline")
    seen = baseline.get(pcie_key(gpu) or "") if isinstance(baseline, Mapping) else None
    slot = _num((gpu.get("pcie") or {}).get("slot_max_width"))
    details = {
        "width": width,
        "max_width": max_width,
        "slot_max_width": slot,
        "gen": (gpu.get("pcie") or {}).get("gen"),
    }
    expected: Optional[float] = None
    if opts.get("expected_pcie_width"):
        expected, source = float(opts["expected_pcie_width"]), "expected_pcie_width"
    elif isinstance(seen, int) and not isinstance(seen, bool):
        expected, source = float(seen), "baseline (widest link seen on this GPU)"
    if expected is not None and width < expected:
        add(
            "GPU_PCIE_WIDTH_DEGRADED",
            f"PCIe link x{width:.0f}, expected x{expected:.0f} ({source})",
            expected=expected,
            expected_from=source,
            **details,
        )
    elif not opts.get("expected_pcie_width") and slot is not None and width < min(max_width, slot):
        add(
            "GPU_PCIE_WIDTH_NARROW",
            f"PCIe link x{width:.0f}, though the GPU (x{max_width:.0f}) and its slot "
            f"(x{slot:.0f}) can do x{min(max_width, slot):.0f}",
            expected=min(max_width, slot),
            expected_from="both ends of the link (GPU and upstream port maximum)",
            **details,
        )


def _eval_pcie_gen(gpu: Mapping[str, Any], opts: Mapping[str, Any], add: Any) -> None:
    """Generation against ``expected_pcie_gen``, judged only while the GPU is known not to be
    idle: an idle GPU lowers its link generation to save power."""
    want = opts.get("expected_pcie_gen")
    gen = _num((gpu.get("pcie") or {}).get("gen"))
    clocks = gpu.get("clocks")
    if (
        not want
        or gen is None
        or not isinstance(clocks, Mapping)
        or clocks.get("gpu_idle") is not False
    ):
        return
    if gen < want:
        add(
            "GPU_PCIE_GEN_DEGRADED",
            f"PCIe link gen {gen:.0f} while busy, expected gen {want}",
            gen=gen,
            expected=want,
        )


def _eval_nvlink(
    gpu: Mapping[str, Any],
    prev: Optional[Mapping[str, Any]],
    opts: Mapping[str, Any],
    elapsed_s: float,
    add: Any,
) -> None:
    nvlink = gpu.get("nvlink") or {}
    states = nvlink.get("states") or {}
    down = sorted((int(k) for k, up in states.items() if up is False))
    if down:
        add(
            "GPU_NVLINK_DOWN",
            f"NVLink link(s) {', '.join(map(str, down))} inactive " f"of {len(states)}",
            links=down,
            total_links=len(states),
        )
    errors = nvlink.get("errors") or {}
    prev_nvlink = (prev or {}).get("nvlink")
    prev_errors = prev_nvlink.get("errors") if isinstance(prev_nvlink, Mapping) else None
    if not errors or not isinstance(prev_errors, Mapping) or elapsed_s <= 0:
        return
    rise = sum(max(0, int(v) - _count(prev_errors.get(k), int(v))) for k, v in errors.items())
    rate = rise * 60.0 / elapsed_s
    if rate > float(opts["nvlink_errors_per_minute"]):
        add(
            "GPU_NVLINK_ERRORS",
            f"NVLink errors rising at {rate:.0f}/min",
            rate_per_minute=round(rate, 1),
            increase=rise,
            threshold=opts["nvlink_errors_per_minute"],
        )


def _eval_fabric(fabric: Any, add: Any) -> None:
    if not isinstance(fabric, Mapping):
        return
    state: Any = fabric.get("state")
    status: Any = fabric.get("status")
    summary = fabric.get("summary")
    if state in (None, 0):  # fabric not supported on this GPU
        return
    if state != FABRIC_COMPLETED:
        add(
            "GPU_FABRIC_NOT_READY",
            f"fabric registration {FABRIC_STATES.get(state, state)}: no multi-GPU work",
            state=state,
            status=status,
            summary=summary,
        )
    elif status is not None and status != 0:
        add(
            "GPU_FABRIC_UNHEALTHY",
            f"fabric registration failed: status {status}",
            state=state,
            status=status,
            summary=summary,
        )
    elif summary == SUMMARY_UNHEALTHY or (summary in (None, 0) and _mask_unhealthy(fabric)):
        add(
            "GPU_FABRIC_UNHEALTHY",
            "fabric health summary: unhealthy",
            state=state,
            status=status,
            summary=summary,
            health_mask=fabric.get("health_mask"),
        )
    elif summary == SUMMARY_LIMITED:
        add(
            "GPU_FABRIC_DEGRADED",
            "fabric health summary: limited capacity",
            state=state,
            status=status,
            summary=summary,
            health_mask=fabric.get("health_mask"),
        )


def _mask_unhealthy(fabric: Mapping[str, Any]) -> bool:
    """Health from the v2 health mask: a route unhealthy or an incorrect configuration."""
    mask = fabric.get("health_mask")
    if not isinstance(mask, int):
        return False
    route_unhealthy = (mask >> 4) & 0x3 == 1  # NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
    incorrect = (mask >> 8) & 0xF  # 1 = NONE, 0 = not supported, >1 = a configuration problem
    return route_unhealthy or incorrect > 1


ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def fabric_domains(snap: Mapping[str, Any]) -> dict[str, list[Any]]:
    """NVLink domains (``<cluster uuid>.<clique id>``) the node's GPUs report, each with the
    indexes of its GPUs. A GPU counts only once its fabric registration completed with a cluster
    UUID other than all zeros (HGX boards report zeros: their NVLink ends at the node)."""
    out: dict[str, list[Any]] = {}
    for gpu in snap.get("gpus") or []:
        fabric = gpu.get("fabric") if isinstance(gpu, Mapping) else None
        if not isinstance(fabric, Mapping) or fabric.get("state") != FABRIC_COMPLETED:
            continue
        cluster, clique = fabric.get("cluster_uuid"), fabric.get("clique_id")
        if isinstance(cluster, str) and cluster != ZERO_UUID and isinstance(clique, int):
            out.setdefault(f"{cluster}.{clique}", []).append(gpu.get("index"))
    return out


def summary(snap: Any) -> Optional[dict[str, Any]]:
    """The status digest: the node's NVLink domain when every registered GPU agrees on one."""
    if not isinstance(snap, Mapping):
        return None
    domains = fabric_domains(snap)
    if len(domains) != 1:
        return None
    return {"domain": next(iter(domains))}
