"""Wiring: discover probes and reporters, build the config schema, load the config, make contexts.

Shared by every command (``check``, ``run``, ``config check``) so each piece of wiring lives once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Collection, Mapping, Optional, Sequence

from hma.adapters import entrypoints
from hma.config import files, schema
from hma.config.files import ConfigError
from hma.config.schema import CORE_SECTIONS, Schema
from hma.contracts import catalogue
from hma.contracts.catalogue import Catalogue
from hma.contracts.options import Option
from hma.contracts.probe import Probe
from hma.deepcheck.options import DEEP_CHECK
from hma.detection.registry import (
    Broken,
    discover,
    entry_point_names,
    exec_probes,
)
from hma.detection.setup import Setup
from hma.remediation.options import RECOVERY, cluster_options, problems, recovery_options
from hma.topology.options import TOPOLOGY
from hma.watch.options import WATCH

if TYPE_CHECKING:  # event sources and reporters are imported when the configuration has some
    from hma.contracts.source import EventSource


DEFAULT_BACKEND = "slurm"  # [cluster] backend unless the configuration names another

# Sections of the features the agent wires, in the order the reference documents list them
# (``[cluster]``, ``[recovery]`` and the backends' follow).
FEATURE_SECTIONS: dict[str, dict[str, Option]] = {
    "deep_check": DEEP_CHECK,
    "topology": TOPOLOGY,
    "watch": WATCH,
}


def schema_for(
    classes: dict[str, type[Probe]],
    broken: list[Broken],
    cat: Catalogue,
    sources: Optional[dict[str, type[EventSource]]] = None,
    reporter_names: Optional[Collection[str]] = None,
    backend_names: Optional[Collection[str]] = None,
) -> Schema:
    """The config schema for this set of probes, event sources, reporters and cluster backends
    (every installed reporter and backend, or those named). Backends and reporters that fail to
    load are added to ``broken``; the tables of broken plugins are left unchecked."""
    probes = {
        name: schema.probe_options(
            cls.options,
            cls.default_interval,
            cls.default_timeout,
            cls.default_enabled,
            cls.subsystems,
        )
        for name, cls in classes.items()
    }
    backends: dict[str, Any] = {}
    if backend_names is None or backend_names:  # `hma check` on a file without one: none
        from hma.contracts.cluster import GROUP as BACKEND_GROUP
        from hma.contracts.cluster import Backend

        backends, failed = discover(BACKEND_GROUP, Backend, backend_names)
        broken += failed
    reporter_options: dict[str, Mapping[str, Option]] = {}
    if reporter_names is None or reporter_names:  # `hma check` on a file without one: none
        from hma import reporters

        reporter_classes, failed = reporters.discover(reporter_names)
        broken += failed
        reporter_options = reporters.schemas(reporter_classes)
    return Schema(
        sections={
            **CORE_SECTIONS,
            **FEATURE_SECTIONS,
            "cluster": cluster_options(
                [*backends, *(b.name for b in broken if b.kind == "backend")], DEFAULT_BACKEND
            ),
            "recovery": recovery_options(
                [  # the default backend's defaults first
                    cls.recovery
                    for _name, cls in sorted(
                        backends.items(), key=lambda item: (item[0] != DEFAULT_BACKEND, item[0])
                    )
                ]
            ),
            **{name: dict(cls.options) for name, cls in sorted(backends.items())},
        },
        checks={"recovery": problems},
        probes=probes,
        reporters=reporter_options,
        catalogue=cat,
        sources={
            name: {
                "enabled": Option("bool", cls.default_enabled, "Run this event source."),
                **cls.options,
            }
            for name, cls in (sources or {}).items()
        },
        # a broken plugin's table must not make the configuration invalid (its options are
        # unknown): `hma config check` reports the plugin itself
        unchecked=frozenset(item.section for item in broken),
    )


def _declared_codes(
    source_classes: dict[str, type[EventSource]], raw: dict[str, Any]
) -> list[catalogue.Entry]:
    """Codes event sources declare from their (raw, pre-validation) options: site rule files.

    They must be in the catalogue before the configuration is validated, since ``[codes.SITE_X]``
    may override them. Raises ``config.ConfigError`` naming each broken declaration.
    """
    sources = raw.get("sources") if isinstance(raw.get("sources"), dict) else {}
    entries: list[catalogue.Entry] = []
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


def _chosen_backend(raw: dict[str, Any]) -> Optional[str]:
    """``[cluster] backend`` of the raw configuration, when it is a string."""
    cluster = raw.get("cluster")
    chosen = cluster.get("backend") if isinstance(cluster, dict) else None
    return chosen if isinstance(chosen, str) else None


def _backend_sections(raw: dict[str, Any]) -> set[str]:
    """The backends whose sections the raw configuration holds: the one ``[cluster] backend``
    names and every other top-level table the core does not own, and the default one when
    ``[recovery]`` sets a key backends declare (its label field, its modes): none for a file
    without them (``hma check`` then imports no backend)."""
    chosen = _chosen_backend(raw)
    core = {
        *CORE_SECTIONS,
        *FEATURE_SECTIONS,
        "cluster",
        "recovery",
        "probes",
        "sources",
        "reporters",
        "codes",
    }
    others = {name for name, table in raw.items() if isinstance(table, dict) and name not in core}
    recovery = raw.get("recovery")
    if isinstance(recovery, dict) and set(recovery) - set(RECOVERY):
        others.add(DEFAULT_BACKEND)
    return {chosen, *others} if chosen else others


def _tables(raw: dict[str, Any], group: str) -> set[str]:
    """Names of the ``[group.NAME]`` tables of the raw configuration."""
    tables = raw.get(group)
    return set(tables) if isinstance(tables, dict) else set()


def _in_use(raw: dict[str, Any], item: Broken) -> bool:
    """Whether the raw configuration enables a broken probe, event source or reporter: its
    table is there without ``enabled = false`` (a broken backend is in use when ``[cluster]
    backend`` names it, which ``load`` refuses)."""
    group, _, name = item.section.partition(".")
    tables = raw.get(group)
    table = tables.get(name) if name and isinstance(tables, dict) else None
    return isinstance(table, dict) and table.get("enabled") is not False


def _add_executables(
    classes: dict[str, Any],
    executables: Mapping[str, Any],
    only: Optional[Sequence[str]],
    registered: Collection[str],
    broken: list[Broken],
) -> set[str]:
    """Add the executable probes (those in ``only``, when given) to ``classes``; one that shadows
    a registered probe is broken instead. Returns the names added."""
    exec_names: set[str] = set()
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
    return exec_names


def _plugin_names(
    raw: dict[str, Any], only: Optional[Sequence[str]], remediates: bool
) -> tuple[Optional[set[str]], Optional[set[str]]]:
    """(reporters, backends) whose modules ``load`` imports: None for every installed one.
    With ``only``, those the raw configuration names; when the caller ``remediates``, every
    reporter and the default backend besides (it declares the [recovery] keys remediation
    reads, as in a full load)."""
    if only is None:
        return None, None
    if not remediates:
        return _tables(raw, "reporters"), _backend_sections(raw)
    return None, _backend_sections(raw) | {DEFAULT_BACKEND}


def load(
    config_file: Optional[str] = None,
    only: Optional[Sequence[str]] = None,
    remediates: bool = False,
) -> Setup:
    """Discover everything and load the configuration; raises ``config.ConfigError``.

    ``only``: load just these probes (``hma check NAME``): other probes' modules are not
    imported and their sections not checked; event sources are loaded only when the
    configuration overrides a code they declare. ``remediates``: the caller acts on the verdict
    without the daemon (``hma healthcheck``): with ``only``, every reporter (its alerts) and the
    cluster backend are loaded all the same."""
    cat = catalogue.load_builtin()
    read = files.read_layers(files.config_path(config_file))  # once for everything
    raw = files.merged(read[0])[0]
    if only is None:
        entrypoints.rescan()
    classes, broken = discover(names=only)
    # probes_dir is read before validation, since it decides the probe set
    executables = exec_probes(files.agent_path(raw, "probes_dir")[0])
    unchecked: set[str] = set()
    if only is not None:  # other sections are left to `hma config check`, unless misnamed
        named = _tables(raw, "probes") - set(executables)
        unchecked |= {f"probes.{n}" for n in entry_point_names(among=named) if n not in only}
        unchecked |= {f"probes.{n}" for n in executables if n not in only}
    wanted = {n for n in executables if n in only} if only is not None else set()
    registered = set(classes) if only is None else set(entry_point_names(among=wanted))
    if only is None or _site_codes(raw, cat):
        from hma.contracts.source import GROUP as SOURCE_GROUP
        from hma.contracts.source import EventSource

        source_classes, source_broken = discover(SOURCE_GROUP, EventSource)
        broken += source_broken
    else:
        source_classes = {}
        named = _tables(raw, "sources")
        if named:
            from hma.contracts.source import GROUP as SOURCE_GROUP

            unchecked |= {f"sources.{n}" for n in entry_point_names(SOURCE_GROUP, among=named)}
    exec_names = _add_executables(classes, executables, only, registered, broken)
    try:
        cat = cat.extended(_declared_codes(source_classes, raw))
    except catalogue.CatalogueError as exc:
        raise ConfigError([f"site codes: {exc}"]) from None
    reporter_names, backend_names = _plugin_names(raw, only, remediates)
    full = schema_for(classes, broken, cat, source_classes, reporter_names, backend_names)
    full = replace(full, unchecked=full.unchecked | unchecked)
    cfg = schema.load(full, config_file, read)
    backend = cfg.section("cluster")["backend"]
    failed = [b.error for b in broken if b.kind == "backend" and b.name == backend]
    if failed:  # `hma run` would have nothing to act through
        raise ConfigError([f"cluster.backend: {backend!r} failed to load: {failed[0]}"])
    return Setup(
        config=cfg,
        catalogue=cat.with_overrides(cfg.codes),
        probes={name: cls() for name, cls in classes.items()},
        sources={name: cls() for name, cls in source_classes.items()},
        broken=broken,
        broken_in_use=tuple(
            # not an executable that shadows a built-in probe: the built-in one runs
            b
            for b in broken
            if _in_use(raw, b) and not (b.kind == "probe" and b.name in classes)
        ),
        exec_names=frozenset(exec_names),
    )


def salvaged(config_file: Optional[str] = None) -> schema.Config:
    """The configuration as far as it can be read, when ``load`` refused it: what ``hma
    healthcheck`` and ``hma run`` need to say so (the cluster backend, ``[healthcheck]``,
    ``[reporters.journald]``): each key that validates, defaults for the rest
    (hma.config.schema.salvage). Never raises for the configuration's sake."""
    read = files.read_layers(files.config_path(config_file))
    broken: list[Broken] = []
    full = schema_for({}, broken, catalogue.load_builtin())
    return schema.salvage(files.merged(read[0])[0], full)
