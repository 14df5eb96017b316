"""What detection runs from: the loaded configuration, catalogue, probes and event sources.

``hma.assembly`` builds a :class:`Setup` once per (re)configuration; every stage that runs probes or
reads the configuration takes one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from hma.adapters.command import TOOL_OUTPUT_CAP, CommandRunner
from hma.adapters.files import ReadError, RootReader
from hma.config.schema import Config
from hma.contracts.catalogue import Catalogue
from hma.contracts.model import Finding
from hma.contracts.probe import NodeFacts, Probe, ProbeContext
from hma.detection.registry import Broken, broken_finding

if TYPE_CHECKING:  # event sources are imported when the configuration has some
    from hma.contracts.source import EventSource, KeyValue, SourceContext


@dataclass
class Setup:
    """Everything loaded once per (re)configuration."""

    config: Config
    catalogue: Catalogue
    probes: dict[str, Probe]  # enabled or not; see ``enabled``
    sources: dict[str, EventSource] = field(default_factory=dict)
    broken: list[Broken] = field(default_factory=list)
    broken_in_use: tuple[Broken, ...] = ()  # those whose table the configuration enables
    exec_names: frozenset[str] = frozenset()  # executable (Nagios) probes among ``probes``
    # (the DMI product name or None,) once read: firmware sets it at boot; a reload makes a new
    # Setup
    _dmi_product: Optional[tuple[Optional[str]]] = field(
        default=None, init=False, repr=False, compare=False
    )

    def enabled(self) -> list[str]:
        """Names of the enabled probes, sorted."""
        return sorted(n for n in self.probes if self.config.probe(n)["enabled"])

    def load_findings(self) -> list[Finding]:
        """Findings about plugins that failed to load."""
        return [broken_finding(b) for b in self.broken]

    @property
    def node_name(self) -> str:
        """``[agent] node_name`` or the short hostname."""
        return self.config.section("agent")["node_name"] or os.uname().nodename.split(".")[0]

    def instance_type(self) -> Optional[str]:
        """``[agent] instance_type``, else DMI product_name under the sysfs root (read on the
        first call only: it cannot change while the node runs, and every probe run and status
        write asks)."""
        configured = self.config.section("agent")["instance_type"]
        if configured:
            return str(configured)
        if self._dmi_product is None:
            self._dmi_product = (self._read_product_name(),)
        return self._dmi_product[0]

    def _read_product_name(self) -> Optional[str]:
        try:
            return (
                RootReader(self.config.section("paths")["sysfs"]).text("class/dmi/id/product_name")
                or None
            )
        except ReadError:
            return None

    def context(
        self, name: str, facts: Optional[NodeFacts] = None, oneshot: bool = False, boot_id: str = ""
    ) -> ProbeContext:
        """A fresh context for one run of probe ``name``."""
        paths = self.config.section("paths")
        return ProbeContext(
            options=self.config.probe(name),
            sysfs=RootReader(paths["sysfs"]),
            procfs=RootReader(paths["procfs"]),
            runner=self._runner(exec_probe=name in self.exec_names),
            instance_type=self.instance_type(),
            facts=facts or NodeFacts(node_name=self.node_name),
            oneshot=oneshot,
            boot_id=boot_id,
        )

    def _runner(self, exec_probe: bool) -> CommandRunner:
        """``[agent] exec_output_cap`` for Nagios plugins; tools are read whole."""
        if exec_probe:
            return CommandRunner(int(self.config.section("agent")["exec_output_cap"]))
        return CommandRunner(TOOL_OUTPUT_CAP)

    def source_context(
        self, name: str, boot_id: str, kv: Optional[KeyValue] = None
    ) -> SourceContext:
        """Context for event source ``name``."""
        from hma.contracts.source import MemoryKV, SourceContext

        paths = self.config.section("paths")
        return SourceContext(
            options=self.config.sources[name],
            sysfs=RootReader(paths["sysfs"]),
            procfs=RootReader(paths["procfs"]),
            runner=self._runner(exec_probe=False),
            boot_id=boot_id,
            kv=kv or MemoryKV(),
        )
