"""Core value types shared by probes, the health model, remediation and reporters (the health
model's own, ``Fault``, ``Transition`` and ``Verdict``, are in ``hma.health.model``)."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from hma.adapters.text import refused
from hma.contracts.severity import Severity

# A component key is ``<kind>:<name>``: at most COMPONENT_MAX characters, none of them a blank, a
# character the terminal rule refuses (hma.adapters.text), or one of COMPONENT_SEPARATORS (the
# node label's and Slurm's separators, quotes, the escape itself): what the node label's ``c=``
# and a drain reason (``HMA: <CODE> <component>``) carry as they are.
COMPONENT_MAX = 128
COMPONENT_SEPARATORS = frozenset(",+=\"'\\")


class Action(enum.IntEnum):
    """Recommended recovery, ordered: none < reboot < replace."""

    NONE = 0
    REBOOT = 1
    REPLACE = 2

    @classmethod
    def parse(cls, text: str) -> Action:
        """Action from its lower-case name; ``ValueError`` otherwise."""
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown action {text!r}") from None

    def __str__(self) -> str:
        return self.name.lower()


class Clears(str, enum.Enum):
    """How an active fault goes away."""

    OBSERVATION = "observation"  # consecutive good polled readings
    REBOOT = "reboot"  # a new boot id
    OPERATOR = "operator"  # `hma ack`
    WINDOW = "window"  # no repeat within the code's window

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Finding:
    """One observation that something is wrong (or could not be measured).

    Probes leave ``severity`` and ``action`` as ``None`` to take the catalogue's values; the
    pipeline resolves them (with operator overrides) in one place, ``Catalogue.resolve``.
    """

    code: str
    component: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    severity: Optional[Severity] = None
    action: Optional[Action] = None
    probe: str = ""
    ts: float = 0.0

    def with_(self, **changes: Any) -> Finding:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The finding as the JSON object documented in docs/status.md."""
        return {
            "code": self.code,
            "severity": str(self.severity) if self.severity is not None else None,
            "component": self.component,
            "action": str(self.action) if self.action is not None else None,
            "message": self.message,
            "details": dict(self.details),
            "probe": self.probe,
            "ts": self.ts,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of ``to_json``."""
        sev = data.get("severity")
        act = data.get("action")
        return cls(
            code=str(data["code"]),
            component=str(data["component"]),
            message=str(data.get("message", "")),
            details=dict(data.get("details") or {}),
            severity=Severity.parse(sev) if sev else None,
            action=Action.parse(act) if act else None,
            probe=str(data.get("probe", "")),
            ts=float(data.get("ts", 0.0)),
        )


class RunStatus(str, enum.Enum):
    """Outcome of one probe run (the ``status`` field of ``hma check --json``)."""

    RAN = "ran"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    UNSUPPORTED = "unsupported"
    DISABLED = "disabled"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ProbeRun:
    """A finished probe run: only ``RAN`` counts as a good observation of what it did not report."""

    probe: str
    status: RunStatus
    started: float
    duration_s: float
    findings: tuple[Finding, ...] = ()
    error: str = ""
    snapshot: Any = None  # the collected data, kept as the next run's ``previous``

    @property
    def completed(self) -> bool:
        """True when the probe measured everything it owns (no good observation otherwise)."""
        return self.status is RunStatus.RAN


def gpu_component(pci_bus_id: str) -> str:
    """GPU component key from any PCI bus id (``00000000:3B:00.0`` -> ``gpu:0000:3b:00``)."""
    text = pci_bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:  # bus:dev.fn with no domain
        parts = ["0000", *parts]
    domain, bus, devfn = parts[-3], parts[-2], parts[-1]
    device = devfn.split(".")[0]
    return f"gpu:{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


def named_component(kind: str, name: str) -> str:
    """Component ``<kind>:<name>`` for a name that others chose (a mount point, a device name):
    each character a component may not hold written as the octal escapes of its UTF-8 bytes, as
    the kernel writes mount points in mountinfo (``/my data`` -> ``/my\\040data``); a key over
    COMPONENT_MAX characters is cut and ends in ``~`` and a hash of the whole name, so that two
    long names stay two components."""
    head = f"{kind}:"
    escaped = "".join(
        "".join(f"\\{byte:03o}" for byte in ch.encode("utf-8", "surrogatepass"))
        if ch.isspace() or refused(ch) or ch in COMPONENT_SEPARATORS
        else ch
        for ch in name
    )
    if len(head) + len(escaped) <= COMPONENT_MAX:
        return head + escaped
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{head}{escaped[: COMPONENT_MAX - len(head) - 13]}~{digest}"
