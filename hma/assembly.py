"""Wiring: discover probes and reporters, build the config schema, load the config, make contexts.

Shared by every command (``check``, ``run``, ``config check``) so each piece of wiring lives once.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Collection, Mapping, Optional, Sequence

from hma import catalogue as catalogue_mod
from hma import config as config_mod
from hma import configfile
from hma.adapters.command import TOOL_OUTPUT_CAP, CommandRunner
from hma.adapters.files import ReadError, RootReader
from hma.catalogue import Catalogue
from hma.config import CORE_SECTIONS, Config, Schema
from hma.configfile import ConfigError
from hma.model import Finding
from hma.options import Option
from hma.probe import NodeFacts, Probe, ProbeContext
from hma.record import field, record, replace
from hma.registry import (
    Broken,
    broken_finding,
    discover,
    entry_point_names,
    exec_probes,
    rescan,
)
from hma.remediation import options as remediation_options

if TYPE_CHECKING:  # event sources and reporters are imported when the configuration has some
    from hma.source import EventSource, KeyValue, SourceContext


@record
class Setup:
    """Everything loaded once per (re)configuration."""

    config: Config
    catalogue: Catalogue
    probes: dict[str, Probe]  # enabled or not; see ``enabled``
    sources: dict[str, EventSource] = field(default_factory=dict)
    broken: list[Broken] = field(default_factory=list)
    exec_names: frozenset[str] = frozenset()  # executable (Nagios) probes among ``probes``

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
        """``[agent] instance_type``, else DMI product_name under the sysfs root."""
        configured = self.config.section("agent")["instance_type"]
        if configured:
            return str(configured)
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
        from hma.source import MemoryKV, SourceContext

        paths = self.config.section("paths")
        return SourceContext(
            options=self.config.sources[name],
            sysfs=RootReader(paths["sysfs"]),
            procfs=RootReader(paths["procfs"]),
            runner=self._runner(exec_probe=False),
            boot_id=boot_id,
            kv=kv or MemoryKV(),
        )


def schema_for(
    classes: dict[str, type[Probe]],
    broken: list[Broken],
    cat: Catalogue,
    sources: Optional[dict[str, type[EventSource]]] = None,
    reporter_names: Optional[Collection[str]] = None,
    backend_names: Optional[Collection[str]] = None,
) -> Schema:
    """The config schema for this set of probes, event sources, reporters and cluster backends
    (every installed reporter and backend, or those named)."""
    probes = {
        name: config_mod.probe_options(
            cls.options,
            cls.default_interval,
            cls.default_timeout,
            cls.default_enabled,
            cls.subsystems,
        )
        for name, cls in classes.items()
    }
    for item in broken:  # a broken plugin's section must not make the config invalid
        probes.setdefault(item.name, dict(config_mod.PROBE_COMMON))
    backends: dict[str, Any] = {}
    if backend_names is None or backend_names:  # `hma check` on a file without one: none
        from hma.remediation.backend import GROUP as BACKEND_GROUP
        from hma.remediation.backend import Backend

        backends = discover(BACKEND_GROUP, Backend, backend_names)[0]
    reporters: dict[str, Mapping[str, Option]] = {}
    if reporter_names is None or reporter_names:  # `hma check` on a file without one: none
        from hma import reporters as reporters_mod

        reporters = reporters_mod.schemas(reporter_names)
    return Schema(
        sections={
            **CORE_SECTIONS,
            "cluster": remediation_options.cluster_options(backends),
            "recovery": remediation_options.RECOVERY,
            **{name: dict(cls.options) for name, cls in sorted(backends.items())},
        },
        checks={"recovery": remediation_options.problems},
        probes=probes,
        reporters=reporters,
        catalogue=cat,
        sources={
            name: {
                "enabled": Option("bool", cls.default_enabled, "Run this event source."),
                **cls.options,
            }
            for name, cls in (sources or {}).items()
        },
    )


def _declared_codes(
    source_classes: dict[str, type[EventSource]], raw: dict[str, Any]
) -> list[catalogue_mod.Entry]:
    """Codes event sources declare from their (raw, pre-validation) options: site rule files.

    They must be in the catalogue before the configuration is validated, since ``[codes.SITE_X]``
    may override them. Raises ``config.ConfigError`` naming each broken declaration.
    """
    sources = raw.get("sources") if isinstance(raw.get("sources"), dict) else {}
    entries: list[catalogue_mod.Entry] = []
    errors: list[str] = []
    for name, cls in sorted(source_classes.items()):
        given = sources.get(name) if isinstance(sources, dict) else None
        options = {key: opt.default for key, opt in cls.options.items()}
        for key, value in (given if isinstance(given, dict) else {}).items():
            if key in cls.options and cls.options[key].validate(value) is None:
                options[key] = value
        try:
            entries += cls.declared_codes(options)
        except ValueError as exc:  # CatalogueError and RulesError are ValueErrors
            errors += [f"sources.{name}: {line}" for line in str(exc).splitlines()]
    if errors:
        raise ConfigError(errors)
    return entries


def _site_codes(raw: dict[str, Any], cat: Catalogue) -> bool:
    """Whether ``[codes.X]`` names a code outside the built-in catalogue (declared by a source)."""
    return any(code not in cat for code in _tables(raw, "codes"))


def _backend_sections(raw: dict[str, Any]) -> set[str]:
    """The backends whose sections the raw configuration holds: the one ``[cluster] backend``
    names and every other top-level table the core does not own (none for a file without
    them: ``hma check`` then imports no backend)."""
    cluster = raw.get("cluster")
    chosen = cluster.get("backend") if isinstance(cluster, dict) else None
    core = {*CORE_SECTIONS, "cluster", "recovery", "probes", "sources", "reporters", "codes"}
    others = {name for name, table in raw.items() if isinstance(table, dict) and name not in core}
    return {chosen, *others} if isinstance(chosen, str) else others


def _tables(raw: dict[str, Any], group: str) -> set[str]:
    """Names of the ``[group.NAME]`` tables of the raw configuration."""
    tables = raw.get(group)
    return set(tables) if isinstance(tables, dict) else set()


def load(config_file: Optional[str] = None, only: Optional[Sequence[str]] = None) -> Setup:
    """Discover everything and load the configuration; raises ``config.ConfigError``.

    ``only``: load just these probes (``hma check NAME``): other probes' modules are not
    imported and their sections not checked; event sources are loaded only when the
    configuration overrides a code they declare."""
    cat = catalogue_mod.load_builtin()
    read = configfile.read_layers(configfile.config_path(config_file))  # once for everything
    raw = configfile.merged(read[0])[0]
    if only is None:
        rescan()
    classes, broken = discover(names=only)
    # probes_dir is read before validation, since it decides the probe set
    executables = exec_probes(configfile.agent_path(raw, "probes_dir")[0])
    unchecked: set[str] = set()
    if only is not None:  # other sections are left to `hma config check`, unless misnamed
        named = _tables(raw, "probes") - set(executables)
        unchecked |= {f"probes.{n}" for n in entry_point_names(among=named) if n not in only}
        unchecked |= {f"probes.{n}" for n in executables if n not in only}
    wanted = {n for n in executables if n in only} if only is not None else set()
    registered = set(classes) if only is None else set(entry_point_names(among=wanted))
    if only is None or _site_codes(raw, cat):
        from hma.source import GROUP as SOURCE_GROUP
        from hma.source import EventSource

        source_classes, source_broken = discover(SOURCE_GROUP, EventSource)
        broken += source_broken
    else:
        source_classes = {}
        named = _tables(raw, "sources")
        if named:
            from hma.source import GROUP as SOURCE_GROUP

            unchecked |= {f"sources.{n}" for n in entry_point_names(SOURCE_GROUP, among=named)}
    exec_names = set()
    for name, cls in executables.items():
        if only is not None and name not in only:
            continue
        if name in registered:
            broken.append(
                Broken(name, f"executable probe {name} shadows a built-in probe; skipped")
            )
        else:
            classes[name] = cls
            exec_names.add(name)
    try:
        cat = cat.extended(_declared_codes(source_classes, raw))
    except catalogue_mod.CatalogueError as exc:
        raise ConfigError([f"site codes: {exc}"]) from None
    schema = schema_for(
        classes,
        broken,
        cat,
        source_classes,
        None if only is None else _tables(raw, "reporters"),
        None if only is None else _backend_sections(raw),
    )
    schema = replace(schema, unchecked=frozenset(unchecked))
    cfg = config_mod.load(schema, config_file, read)
    return Setup(
        config=cfg,
        catalogue=cat.with_overrides(cfg.codes),
        probes={name: cls() for name, cls in classes.items()},
        sources={name: cls() for name, cls in source_classes.items()},
        broken=broken,
        exec_names=frozenset(exec_names),
    )
