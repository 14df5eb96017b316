"""``nvidia_smi`` probe: ``nvidia-smi -q -x`` read into the same per-GPU records as the ``gpu``
probe (probes/nvidia/reading.py) and judged by the same rules (probes/nvidia/common.py).

Handles XML schema versions v11 to v13 (``clocks_throttle_reasons`` vs ``clocks_event_reasons``,
``gpu_reset_status`` vs ``gpu_recovery_action``, absolute vs T.Limit temperatures, ``N/A``, units
inside values). nvidia-smi exit codes that mean hardware trouble become the same findings as the
matching NVML errors; a hang past ``command_timeout`` is the same hang evidence as an NVML hang; a
malformed document is ``unknown`` with the parser's error.
"""

from __future__ import annotations

import re
import shutil
import uuid
import xml.etree.ElementTree as ET
from typing import Any, ClassVar, Iterator, Mapping, Optional, Sequence

from hma.adapters.strict import (
    ASCII_SPACE,
    U64_MAX,
    ParseError,
    parse_decimal,
    parse_uint,
    parse_word,
)
from hma.contracts.model import Finding
from hma.contracts.options import Option, positive
from hma.contracts.probe import Probe, ProbeContext
from hma.probes.nvidia import common, settle
from hma.probes.nvidia.reading import (
    CallError,
    Clocks,
    EccCounts,
    EccMode,
    Fabric,
    GpuReading,
    Hang,
    Pcie,
    Remap,
    Retired,
    Snapshot,
)
from hma.probes.support import pci

# nvidia-smi exit code -> the NVML error number the rules know (nvidia-smi(1) "RETURN VALUE").
EXIT_CODES: Mapping[int, int] = {
    8: 8,  # external power cables not attached
    9: 9,  # NVIDIA driver is not loaded
    10: 11,  # the kernel detected an interrupt issue with a GPU
    12: 12,  # NVML shared library could not be found
    14: 14,  # infoROM is corrupted
    15: 15,  # the GPU has fallen off the bus or has otherwise become inaccessible
}
EXIT_TEXT = {
    2: "invalid argument",
    3: "operation not available",
    4: "insufficient permissions",
    6: "query unsuccessful",
    8: "external power cables not attached",
    9: "NVIDIA driver is not loaded",
    10: "interrupt issue with a GPU",
    12: "NVML shared library not found",
    13: "NVML does not implement this function",
    14: "infoROM is corrupted",
    15: "GPU has fallen off the bus or is inaccessible",
    255: "other error or internal driver error",
}
HANDLE_RE = re.compile(
    r"^\s*Unable to determine the device handle for GPU\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.[0-9A-Fa-f]):[ \t]*(.+)",
    re.M,
)
_DOC_END = re.compile(r"</nvidia_smi_log\s*>|<nvidia_smi_log\s*/>")
HANDLE_ERRORS = {"gpu is lost": 15, "unknown error": 999, "gpu requires reset": 16}


class NvidiaSmiProbe(Probe):
    """``nvidia-smi -q -x`` against the shared GPU rules."""

    name = "nvidia_smi"
    description = "NVIDIA GPUs through nvidia-smi -q -x (same rules as the gpu probe)"
    default_interval = 300.0
    default_timeout = 60.0
    options: ClassVar[Mapping[str, Option]] = {
        "command": Option("argv", ["nvidia-smi", "-q", "-x"], "nvidia-smi argv (XML output)."),
        "command_timeout": Option(
            "float",
            30.0,
            "Seconds nvidia-smi may run before the run reports a hang.",
            check=positive,
            below="timeout",
        ),
        **common.RULE_OPTIONS,
    }

    def applies(self, ctx: ProbeContext) -> Optional[str]:
        exe = ctx.options["command"][0]
        if shutil.which(exe) is not None:
            return None
        if common.gpus_may_be_there(ctx.options, ctx.instance_type, ctx.sysfs):
            return None  # GPUs expected or on the PCI bus: a missing nvidia-smi is a finding
        return f"{exe} not found, no GPUs expected or on the PCI bus"

    def collect(self, ctx: ProbeContext) -> Any:
        return common.with_baseline(settle.observe(self._read(ctx), ctx).to_json(), ctx.previous)

    def _read(self, ctx: ProbeContext) -> Snapshot:
        argv = list(ctx.options["command"])
        timeout = float(ctx.options["command_timeout"])
        result = ctx.runner.run(argv, timeout)
        if result.timed_out:
            return Snapshot("nvidia-smi", hang=Hang(" ".join(argv), None, timeout, 1))
        raw = {
            "rc": result.rc,
            "start_error": result.error,
            "cut": result.cut_message(),
            "stdout": result.stdout,
            "stderr": result.stderr[-4000:],
        }
        return snapshot(raw, pci.nvidia_devices(ctx.sysfs) or ())

    def evaluate(self, snapshot: Any, ctx: ProbeContext) -> list[Finding]:
        elapsed = ctx.clock() - ctx.previous_ts if ctx.previous_ts else 0.0
        return common.evaluate(snapshot, ctx.options, ctx.instance_type, ctx.previous, elapsed)

    def summary(self, snapshot: Any) -> Optional[dict]:
        return common.summary(snapshot)

    def expectations(self, snapshot: Any) -> dict[str, Any]:
        return common.expectations(snapshot)


def parse_result(raw: Mapping[str, Any], pci_gpus: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON form of :func:`snapshot`."""
    return snapshot(raw, pci_gpus).to_json()


def snapshot(raw: Mapping[str, Any], pci_gpus: Sequence[str] = ()) -> Snapshot:
    """The readings of one nvidia-smi run (exit code, stdout, stderr), with the NVIDIA GPUs on
    the PCI bus."""
    snap = _snapshot(raw)
    snap.pci_gpus = list(pci_gpus)
    return snap


def _snapshot(raw: Mapping[str, Any]) -> Snapshot:
    snap = Snapshot("nvidia-smi")
    argv = "nvidia-smi"
    if raw.get("start_error"):
        snap.init_error = CallError(argv, 12, str(raw["start_error"]))
        return snap
    if raw.get("cut"):  # never parse part of a document
        snap.init_error = CallError(argv, -1, str(raw["cut"]))
        return snap
    rc = raw.get("rc")
    document, outside = split_output(str(raw.get("stdout") or ""))
    own_lines = outside + "\n" + str(raw.get("stderr") or "")
    handle_errors = _handle_errors(own_lines)
    parsed: Optional[Snapshot] = None
    parse_error = ""
    if document:
        try:
            parsed = _document(document)
        except (ET.ParseError, ValueError) as exc:
            parse_error = f"malformed nvidia-smi XML: {exc}"
    if parsed is not None:
        snap = parsed
    snap.gpus = [*snap.gpus, *handle_errors]
    if parsed is None and re.search(r"^\s*No devices were found\s*$", own_lines, re.M):
        snap.count = 0
        return snap
    if isinstance(rc, int) and rc != 0 and not handle_errors:
        code = EXIT_CODES.get(rc, -rc)
        why = EXIT_TEXT.get(rc, "unexpected exit status")
        message = f"exit status {rc}: {why}"
        if parsed is None or code in common.FATAL_ERRORS:
            snap.init_error = CallError(argv, code, message)
        return snap
    if parsed is None and not handle_errors:
        why = parse_error or "no <nvidia_smi_log> document in the output"
        snap.init_error = CallError(argv, -1, why)
    return snap


def split_output(stdout: str) -> tuple[str, str]:
    """``stdout`` as (the XML document, nvidia-smi's own lines around it).

    The document runs from the first ``<?xml`` or ``<nvidia_smi_log`` to the last
    ``</nvidia_smi_log>`` (to the end when cut), so text inside it (process names, which users
    choose) is never read as one of nvidia-smi's own lines.
    """
    starts = [i for i in (stdout.find("<?xml"), stdout.find("<nvidia_smi_log")) if i >= 0]
    if not starts:
        return "", stdout
    start = min(starts)
    ends = [m.end() for m in _DOC_END.finditer(stdout, start)]
    end = ends[-1] if ends else len(stdout)
    return stdout[start:end], stdout[:start] + "\n" + stdout[end:]


def _handle_errors(text: str) -> list[GpuReading]:
    out = []
    for match in HANDLE_RE.finditer(text):
        message = match.group(2).strip()
        code = HANDLE_ERRORS.get(message.lower(), 999)
        error = CallError("nvidia-smi (device handle)", code, message)
        out.append(GpuReading(bus_id=match.group(1), error=error))
    return out


# Characters XML 1.0 cannot carry. nvidia-smi prints a process name as the process set it, so
# one such name would make the whole document unreadable (every GPU unknown): they are replaced
# (U+FFFD) before parsing, and a driver value holding one is then refused by its strict parser.
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def parse_xml(text: str) -> dict[str, Any]:
    """The snapshot (JSON form) of an ``nvidia-smi -q -x`` document: :func:`_document`."""
    return _document(text).to_json()


def _document(text: str) -> Snapshot:
    """Node readings and GPU records from an ``nvidia-smi -q -x`` document (v11..v13).

    Every value is parsed strictly (``hma.adapters.strict``): one that is not what its element
    holds (a
    count of ``-1``, ``1e-9``, 400 digits, an unknown state word) is not measured, and the GPU
    gets a read failure (``call_errors``) naming the element, never a reading. A document with
    neither a GPU nor a driver version is refused (ValueError): it answers nothing.
    """
    root = ET.fromstring(NOT_XML.sub("\ufffd", text))
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"root element is <{root.tag}>, not <nvidia_smi_log>")
    gpus = [_gpu(index, node) for index, node in enumerate(root.findall("gpu"))]
    driver = _value(root.findtext("driver_version"))
    if not gpus and driver is None:  # e.g. <nvidia_smi_log/>: no answer, not "0 GPUs"
        raise ValueError("<nvidia_smi_log> holds no <gpu> and no driver version")
    node = _Fields(root)
    count = node.uint("attached_gpus", limit=MAX_GPUS)
    return Snapshot(
        "nvidia-smi",
        driver=driver,
        count=count if count is not None else len(gpus),
        gpus=gpus,
        nvswitch=any(g.fabric is not None and g.fabric.state != 0 for g in gpus),
        fabric_manager=None,  # nvidia-smi does not tell; the gpu probe checks the process
        call_errors=node.call_errors() if node.bad else {},
    )


MAX_GPUS = 1024
MAX_LINK_WIDTH = 32  # PCIe x32 is the widest link the specification defines
MAX_LINK_GEN = 16
FLAG_WORDS = {
    "yes": True,
    "enabled": True,
    "active": True,
    "true": True,
    "no": False,
    "disabled": False,
    "not active": False,
    "false": False,
}
FABRIC_STATE_TEXT = {"not supported": 0, "not started": 1, "in progress": 2, "completed": 3}
SUMMARY_TEXT = {"healthy": 1, "unhealthy": 2, "limited capacity": 3}
# nvmlErrorString() texts nvidia-smi prints as the fabric status; "Success" is the healthy one.
FABRIC_STATUS_TEXT = (
    "Success",
    "Uninitialized",
    "Invalid Argument",
    "Not Supported",
    "Insufficient Permissions",
    "Already Initialized",
    "Not Found",
    "Insufficient Size",
    "Insufficient External Power",
    "Driver Not Loaded",
    "Timeout",
    "Interrupt request issue",
    "Function Not Found",
    "Corrupted infoROM",
    "GPU is lost",
    "GPU requires restart",
    "Operating System has blocked the request",
    "In use by another client",
    "Insufficient Memory",
    "No data",
    "Insufficient resources",
    "Freq not supported",
    "Argument version mismatch",
    "Deprecated",
    "Not Ready",
    "Unknown Error",
)
# gpu_recovery_action texts (words that must all appear) -> NVML recovery action.
RECOVERY_WORDS = (
    (("none",), 0),
    (("drain", "p2p"), 3),
    (("drain", "reset"), 4),
    (("imex",), 5),
    (("bus", "reset"), 6),
    (("system", "reboot"), 7),
    (("reboot",), 2),
    (("reset",), 1),
)
_RECOVERY_TEXT = re.compile(r"[A-Za-z][A-Za-z /_-]{0,60}\Z", re.ASCII)
_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\Z", re.ASCII)


def _value(text: Optional[str]) -> Optional[str]:
    """Element text, None for absent, ``N/A``, ``[Not Supported]`` and deprecated markers."""
    if text is None:
        return None
    text = text.strip(ASCII_SPACE)  # str.strip() would drop Unicode spaces a value must not have
    low = text.lower().strip("[]")
    if not text or low in ("n/a", "not supported", "unknown error") or "deprecated" in low:
        return None
    return text


class _Fields:
    """Strict readers of one element's children; what does not parse is kept in ``bad``."""

    def __init__(self, node: ET.Element) -> None:
        self.node = node
        self.bad: dict[str, str] = {}

    def text(self, path: str) -> Optional[str]:
        """The value at ``path`` (None: absent or a not-available marker)."""
        return _value(self.node.findtext(path))

    def _refuse(self, path: str, exc: ParseError) -> None:
        self.bad.setdefault(path, str(exc))

    def uint(self, path: str, unit: str = "", limit: int = U64_MAX) -> Optional[int]:
        """An unsigned count, ``unit`` (``x``, `` MiB``) allowed after the digits."""
        value = self.text(path)
        if value is None:
            return None
        if unit and value.endswith(unit):
            value = value[: -len(unit)].rstrip(" ")
        try:
            return parse_uint(value, limit=limit, hex_ok=False)
        except ParseError as exc:
            self._refuse(path, exc)
            return None

    def degrees(self, path: str) -> Optional[float]:
        """A temperature (``41 C``, ``-2 C`` on the T.Limit scale)."""
        value = self.text(path)
        if value is None:
            return None
        if value.endswith("C"):
            value = value[:-1].rstrip(" ")
        try:
            return parse_decimal(value, low=-300.0, high=1000.0)
        except ParseError as exc:
            self._refuse(path, exc)
            return None

    def word(self, path: str, words: Mapping[str, Any]) -> Any:
        """The meaning of a recognised word (case-insensitive); None when absent or refused."""
        value = self.text(path)
        if value is None:
            return None
        try:
            return words[parse_word(value, list(words))]
        except ParseError as exc:
            self._refuse(path, exc)
            return None

    def flag(self, path: str) -> Optional[bool]:
        """Yes/No, Enabled/Disabled, Active/Not Active."""
        flag: Optional[bool] = self.word(path, FLAG_WORDS)
        return flag

    def call_errors(self) -> dict[str, str]:
        """The refused values as one read failure of the GPU (``GPU_READ_FAILED``)."""
        shown = "; ".join(f"{path}: {why}" for path, why in list(self.bad.items())[:3])
        more = f" (and {len(self.bad) - 3} more)" if len(self.bad) > 3 else ""
        return {"nvidia-smi": f"unparsable value in {len(self.bad)} field(s): {shown}{more}"}


def _sum(*values: Optional[int]) -> Optional[int]:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _gpu(index: int, node: ET.Element) -> GpuReading:
    f = _Fields(node)
    arch = f.text("product_architecture")
    bus = node.get("id") or f.text("pci/pci_bus_id")
    if bus is not None and not _BUS_ID.match(bus.strip()):
        f.bad["id"] = f"not a PCI bus id: {bus[:40]!r}"
        bus = None
    gpu = GpuReading(
        index=index,
        bus_id=bus,
        name=f.text("product_name"),
        uuid=f.text("uuid"),
        arch=arch.lower() if arch else None,
    )
    current_ecc = f.flag("ecc_mode/current_ecc")
    if current_ecc is not None:
        gpu.ecc_mode = EccMode(current_ecc, f.flag("ecc_mode/pending_ecc"))
    gpu.ecc = EccCounts(
        *(
            _ecc(f, scope, kind)
            for scope in ("volatile", "aggregate")
            for kind in ("corrected", "uncorrected")
        )
    )
    if node.find("retired_pages") is not None:
        pending = f.flag("retired_pages/pending_retirement")
        if pending is None:
            pending = f.flag("retired_pages/pending_blacklist")
        sbe = f.uint("retired_pages/multiple_single_bit_retirement/retired_count")
        dbe = f.uint("retired_pages/double_bit_retirement/retired_count")
        if pending is not None or sbe is not None or dbe is not None:
            gpu.retired = Retired(sbe, dbe, bool(pending))
    remap = node.find("remapped_rows")
    if remap is not None and len(remap):  # the whole element is "N/A" without remapping / MIG
        gpu.remap = Remap(
            f.uint("remapped_rows/remapped_row_corr"),
            f.uint("remapped_rows/remapped_row_unc"),
            bool(f.flag("remapped_rows/remapped_row_pending")),
            bool(f.flag("remapped_rows/remapped_row_failure")),
        )
    link = "pci/pci_gpu_link_info"
    gpu.pcie = Pcie(
        f.uint(f"{link}/link_widths/current_link_width", "x", MAX_LINK_WIDTH),
        f.uint(f"{link}/link_widths/max_link_width", "x", MAX_LINK_WIDTH),
        f.uint(f"{link}/pcie_gen/current_link_gen", limit=MAX_LINK_GEN),
        f.uint(f"{link}/pcie_gen/max_link_gen", limit=MAX_LINK_GEN),
    )
    gpu.clocks = _clocks(f)
    _temperature(f, gpu)
    gpu.fabric = _fabric(f)
    gpu.recovery_action = _recovery(f)
    _value_errors(node, gpu)
    if f.bad and gpu.error is None:
        gpu.call_errors.update(f.call_errors())
    return gpu


# Subtrees whose text others choose (process names): never read as a value or a status.
USER_TEXT = frozenset({"processes", "accounted_processes"})


def _driver_elements(node: ET.Element) -> Iterator[ET.Element]:
    """``node`` and its descendants, less the subtrees in ``USER_TEXT``."""
    yield node
    for child in node:
        if child.tag not in USER_TEXT:
            yield from _driver_elements(child)


def _value_errors(node: ET.Element, gpu: GpuReading) -> None:
    """Values that nvidia-smi could not read: "GPU is lost" as the whole value of an element
    makes the GPU lost; "Unknown Error" fields are a read failure (unknown), never silently N/A.
    Process lists are skipped: a process name is never read as a status."""
    texts = [
        (el.tag, (el.text or "").strip(ASCII_SPACE).strip("[]").lower())
        for el in _driver_elements(node)
    ]
    if any(text == "gpu is lost" for _tag, text in texts):
        gpu.error = CallError("nvidia-smi", 15, "GPU is lost")
        return
    failed = sorted({tag for tag, text in texts if text == "unknown error"})
    if failed:
        shown = ", ".join(failed[:5]) + (" ..." if len(failed) > 5 else "")
        gpu.call_errors = {"nvidia-smi": f"Unknown Error in {len(failed)} field(s): {shown}"}


def _ecc(f: _Fields, scope: str, kind: str) -> Optional[int]:
    if f.node.find(f"ecc_errors/{scope}") is None:
        return None
    if kind == "corrected":
        names = ["sram_correctable", "dram_correctable", "single_bit/total"]
    else:
        names = [
            "sram_uncorrectable",
            "sram_uncorrectable_parity",
            "sram_uncorrectable_secded",
            "dram_uncorrectable",
            "double_bit/total",
        ]
    return _sum(*(f.uint(f"ecc_errors/{scope}/{name}") for name in names))


def _clocks(f: _Fields) -> Optional[Clocks]:
    for group, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),  # v11 and drivers before 535
    ):
        if f.node.find(group) is None:
            continue
        return Clocks(
            **{
                name: bool(f.flag(f"{group}/{prefix}{name}"))
                for name in (
                    "gpu_idle",
                    "hw_slowdown",
                    "hw_thermal_slowdown",
                    "hw_power_brake_slowdown",
                )
            }
        )
    return None


def _temperature(f: _Fields, gpu: GpuReading) -> None:
    if f.node.find("temperature") is None:
        return
    slow = f.degrees("temperature/gpu_temp_slow_threshold")
    if slow is not None:
        gpu.temp, gpu.temp_slowdown = f.degrees("temperature/gpu_temp"), slow
        return
    # Drivers 590+ on H100/H200 report T.Limit: degrees *below* the limit, and the slowdown point
    # on that scale (e.g. margin 46 C, slowdown at -2 C). Negate both so "temp >= slowdown" holds.
    margin = f.degrees("temperature/gpu_temp_tlimit")
    slow_tlimit = f.degrees("temperature/gpu_temp_slow_tlimit_threshold")
    if margin is not None and slow_tlimit is not None:
        gpu.temp, gpu.temp_slowdown = -margin, -slow_tlimit
        gpu.temp_scale = "tlimit"
    else:
        gpu.temp = f.degrees("temperature/gpu_temp")


def _fabric(f: _Fields) -> Optional[Fabric]:
    if f.node.find("fabric") is None:
        return None
    state = f.word("fabric/state", FABRIC_STATE_TEXT)
    if state is None:
        return None
    status = f.text("fabric/status")
    if status is not None:
        try:
            status = parse_word(status, FABRIC_STATUS_TEXT)
        except ParseError as exc:
            f.bad["fabric/status"] = str(exc)
            return None
    return Fabric(
        state=state,
        status=0 if status is None or status == "Success" else status,
        summary=f.word("fabric/health/summary", SUMMARY_TEXT),
        health_mask=None,
        cluster_uuid=_cluster_uuid(f),
        clique_id=f.uint("fabric/cliqueId", limit=0xFFFFFFFF),
    )


def _cluster_uuid(f: _Fields) -> Optional[str]:
    """The fabric's cluster UUID in canonical form; a malformed one is refused (None)."""
    text = f.text("fabric/clusterUuid")
    if text is None:
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        f.bad["fabric/clusterUuid"] = f"not a UUID: {text[:60]!r}"
        return None


def _recovery(f: _Fields) -> Optional[int]:
    text = f.text("gpu_recovery_action")
    if text is not None:
        low = text.lower()
        if _RECOVERY_TEXT.match(text):
            for words, code in RECOVERY_WORDS:
                if all(w in low for w in words):
                    return code
        f.bad["gpu_recovery_action"] = f"unrecognised recovery action {text[:40]!r}"
        return None
    if f.node.find("gpu_reset_status") is None:  # v12
        return None
    if f.flag("gpu_reset_status/drain_and_reset_recommended"):
        return 4
    if f.flag("gpu_reset_status/reset_required"):
        return 1
    return 0
