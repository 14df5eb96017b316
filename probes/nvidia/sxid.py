"""NVIDIA NVSwitch SXid errors: the ``sxid`` decoder of kernel-log rules.

The nvidia-nvswitch driver prints each SXid error as (open-gpu-kernel-modules
src/common/nvswitch/kernel/inc/common_nvswitch.h, NVSWITCH_PRINT_SXID)::

    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up

then ``Severity N Engine instance ...`` and ``Data {...}`` lines of the same SXid, which carry no
verdict and raise nothing. A catalogued SXid (NVIDIA's Fabric Manager guide, generated into
hma/contracts/catalogue/sxid.toml by scripts/gen-xid-catalogue) is ``GPU_SXID_<n>``; the line's
``Fatal``/``Non-fatal`` word refines the guide's class: a potentially fatal SXid printed Non-fatal
is a warning, a non-fatal one printed Fatal is ``KERNEL_SXID_FATAL``, an always-fatal one is
critical whatever the word. An SXid outside the catalogue is ``KERNEL_SXID_FATAL`` or
``KERNEL_SXID_NONFATAL`` by its word. The component is the NVSwitch (``nvswitch:<PCI id>``); the
link the line names is in the details.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping, NamedTuple, Optional

from hma.contracts.model import Action, Finding, Severity
from hma.probes.kernel_log import decoders

PREFIX = "GPU_SXID_"
FATAL = "KERNEL_SXID_FATAL"
NONFATAL = "KERNEL_SXID_NONFATAL"
TELL_APART = {FATAL: "sxid", NONFATAL: "sxid"}  # SXids sharing a generic code differ by number
ALWAYS_FATAL = "(NVIDIA: always fatal"  # how scripts/gen-xid-catalogue's summary names the class

# From the start of the message, the driver's own prefix and word: nothing a user writes.
SXID_RE = re.compile(
    r"^nvidia-(?P<switch>nvswitch\d{1,3}): SXid \(PCI:(?P<sw>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:"
    r"[0-9a-fA-F]{2}\.[0-7])\): (?P<sxid>\d{1,6}), (?P<word>Fatal|Non-fatal), (?P<rest>.*)",
    re.DOTALL,
)
_LINK_RE = re.compile(r"Link (?P<link>\d{1,3})\b")


class SxidLine(NamedTuple):
    """The parts of one NVSwitch SXid kernel line."""

    switch: str  # nvswitchN, the driver's device name
    pci: str  # the NVSwitch's PCI id as printed (0000:06:00.0)
    sxid: int
    fatal: bool  # the line says Fatal (else Non-fatal)
    text: str  # the driver's message after the word
    link: Optional[int] = None  # the NVLink port the line names


def parse_sxid_line(message: str) -> Optional[SxidLine]:
    """The SXid line that ``message`` is (``nvidia-nvswitchN: SXid (PCI:...): N, Fatal, ...``),
    or None (the Severity and Data lines of an SXid are not one)."""
    m = SXID_RE.match(message)
    if m is None:
        return None
    switch, pci, number, word, rest = m.group("switch", "sw", "sxid", "word", "rest")
    rest = rest.strip()
    link = _LINK_RE.match(rest)
    return SxidLine(
        switch, pci, int(number), word == "Fatal", rest, int(link.group("link")) if link else None
    )


@functools.lru_cache(maxsize=1)
def _catalogued() -> Mapping[int, tuple[str, Severity]]:
    """SXid number -> (summary, severity) of its catalogue entry, read once."""
    from hma.contracts.catalogue import load_builtin

    out: dict[int, tuple[str, Severity]] = {}
    for entry in load_builtin():
        suffix = entry.code[len(PREFIX) :]
        if entry.code.startswith(PREFIX) and suffix.isdigit():
            out[int(suffix)] = (entry.summary, entry.severity)
    return out


def catalogued_sxids() -> frozenset[int]:
    """Every SXid that has its own code."""
    return frozenset(_catalogued())


def verdict(sxid: int, fatal: bool) -> tuple[str, Optional[Severity], Optional[Action]]:
    """(code, severity, action; None: the catalogue's) of SXid ``sxid`` printed Fatal or not."""
    known = _catalogued().get(sxid)
    if known is None:
        return (FATAL if fatal else NONFATAL), None, None
    if known[1] is Severity.WARNING and fatal:  # the guide's non-fatal SXid, printed Fatal
        return FATAL, None, None
    if known[1] is Severity.CRITICAL and not fatal and ALWAYS_FATAL not in known[0]:
        return f"{PREFIX}{sxid}", Severity.WARNING, Action.NONE  # potentially fatal, not this time
    return f"{PREFIX}{sxid}", None, None


def line_finding(line: SxidLine, evidence: Mapping[str, Any], source: str, ts: float) -> Finding:
    """The finding of a parsed SXid line, on the NVSwitch it names."""
    code, severity, action = verdict(line.sxid, line.fatal)
    details: dict[str, Any] = {"sxid": line.sxid, "nvswitch": line.switch, "pci": line.pci}
    details.update(evidence)
    details["sxid_fatal"] = line.fatal
    if line.link is not None:
        details["nvswitch_link"] = line.link
    if source:
        details["source"] = source
    word = "fatal" if line.fatal else "non-fatal"
    message = f"NVSwitch {line.switch} ({line.pci}) {word} SXid {line.sxid}: {line.text[:300]}"
    return Finding(
        code,
        f"nvswitch:{line.pci}",
        message[:400],
        details,
        severity,
        action,
        probe=source,
        ts=ts,
    )


class SxidDecoder(decoders.Decoder):
    """The ``sxid`` decoder of kernel-log rules (entry point ``hma.kernel_log.decoders``):
    NVSwitch SXid lines to ``GPU_SXID_*`` (or the generic ``KERNEL_SXID_*``) findings."""

    pattern = SXID_RE.pattern
    code = FATAL
    tell_apart = TELL_APART

    def codes(self) -> set[str]:
        """Every ``GPU_SXID_`` code and the two generic ones."""
        return {f"{PREFIX}{n}" for n in catalogued_sxids()} | {FATAL, NONFATAL}

    def prepare(self) -> None:
        """Read the SXid catalogue now."""
        catalogued_sxids()

    def fault(self, message: str) -> Optional[tuple[str, str, Optional[Severity]]]:
        """(code, component, the severity its word decides) of the SXid line ``message`` is,
        or None."""
        m = SXID_RE.match(message)
        if m is None:
            return None
        code, severity, _ = verdict(int(m.group("sxid")), m.group("word") == "Fatal")
        return code, f"nvswitch:{m.group('sw')}", severity

    def finding(self, message: str, details: Mapping[str, Any], source: str, ts: float) -> Finding:
        """:func:`line_finding` of the SXid line in ``message``."""
        line = parse_sxid_line(message)
        assert line is not None  # fault() found it
        return line_finding(line, details, source, ts)
