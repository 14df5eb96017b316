"""Decoders: the code behind a rule's ``kind`` other than ``code``, registered by entry point.

A rule of ``kind = "xid"`` hands its line to the decoder registered under that name in the
``hma.kernel_log.decoders`` entry point group (the NVIDIA family registers ``xid`` and
``sxid``), so the kernel-log family knows line shapes, rules and de-duplication and no vendor's
decoding: a decoder says which fault a line is, builds its finding, and names the codes it can
raise.
"""

from __future__ import annotations

import abc
import functools
from typing import Any, Mapping, Optional

from hma.adapters import entrypoints
from hma.contracts.model import Finding, Severity, gpu_component

GROUP = "hma.kernel_log.decoders"


class Decoder(abc.ABC):
    """Turns the lines of its rules into faults and findings (one instance per process)."""

    pattern: str  # the rule's pattern when the rule file gives none
    code: str  # the rule's code when the rule file gives none
    tell_apart: Mapping[str, str] = {}  # catch-all code -> detail that tells its faults apart

    @abc.abstractmethod
    def codes(self) -> set[str]:
        """Every code the decoder can raise."""

    def prepare(self) -> None:  # noqa: B027 - most decoders have nothing to read ahead
        """Read what the first line would otherwise read (off the path from line to drain)."""

    @abc.abstractmethod
    def fault(self, message: str) -> Optional[tuple[str, str, Optional[Severity]]]:
        """(code, component, severity the line decides, None: the catalogue's) of the fault in
        ``message``, or None when it holds none (called for every candidate line: cheap)."""

    @abc.abstractmethod
    def finding(self, message: str, details: Mapping[str, Any], source: str, ts: float) -> Finding:
        """The finding of a ``message`` that :meth:`fault` decoded, ``details`` in its details."""


@functools.cache
def load(kind: str) -> Decoder:
    """The decoder registered as ``kind``; raises ``LookupError`` when none is, ``ValueError``
    when it does not load."""
    ep = entrypoints.find(GROUP, kind)
    if ep is None:
        raise LookupError(kind)
    try:
        cls = ep.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin is a rule error, not a crash
        raise ValueError(f"decoder {kind} ({ep.value}) does not load: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Decoder)):
        raise ValueError(f"decoder {kind}: {ep.value} is not a {__name__}.Decoder subclass")
    return cls()


@functools.lru_cache(maxsize=4096)
def component_of(pci: str) -> str:
    """GPU component key of a PCI id as a driver prints it (the ``{gpu}`` of a rule's ``pci``
    group); ``node`` if unreadable (cached: a storm of lines names the same few GPUs)."""
    try:
        return gpu_component(pci)
    except (ValueError, IndexError):
        return "node"
