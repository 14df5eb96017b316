"""Configuration: ``/etc/hma/hma.toml`` plus drop-ins, validated against one schema.

Every key is declared once as an ``Option`` (kind, default, doc): the core sections here, each
probe's and reporter's own keys on its class. ``hma config check`` prints every error as
``key.path: problem``; ``hma config defaults`` prints the documented defaults (docs/configuration.md
is generated from it and a test keeps it in sync).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

from hma.adapters.logs import LEVELS as LOG_LEVELS
from hma.config.files import (
    PROBES_DIR,
    RUN_DIR,
    STATE_DIR,
    ConfigError,
    config_path,
    merged,
    origins,
    read_layers,
)
from hma.contracts.catalogue import MAX_WITHIN_S, MODES, OVERRIDABLE, PER, Catalogue, policy_problem
from hma.contracts.options import FLOAT_LIMIT, Option, parse_duration, positive

EX_CONFIG = 78

CORE_SECTIONS: dict[str, dict[str, Option]] = {
    "agent": {
        "state_dir": Option("path", STATE_DIR, "Folder of the SQLite state database."),
        "run_dir": Option("path", RUN_DIR, "Folder of status.json (read by `hma status`)."),
        "check_requests": Option(
            "path",
            None,
            "Folder where users ask for a check now (`hma check --request`); unset: "
            "<run_dir>/check-requests.",
        ),
        "check_request_interval": Option(
            "float",
            60.0,
            "Seconds between two requested checks at least (a flood of requests costs one run).",
            minimum=1,
            maximum=86400,
        ),
        "probes_dir": Option(
            "path", PROBES_DIR, "Executable probes (Nagios plugin protocol), root-owned."
        ),
        "instance_type": Option(
            "str", None, "Instance type for expected device counts; unset: DMI product_name."
        ),
        "node_name": Option("str", None, "Node name used in status and alerts; unset: hostname."),
        "history_days": Option(
            "float",
            30.0,
            "Days of findings history kept in the state database.",
            check=positive,
            maximum=36500,
        ),
        "exec_output_cap": Option(
            "int", 65536, "Bytes of output kept from an executable probe.", minimum=256
        ),
        "log_level": Option(
            "choice",
            "info",
            "Daemon log level: debug (what each probe read and compared), info, warning, error.",
            choices=LOG_LEVELS,
        ),
    },
    "paths": {
        "sysfs": Option("path", "/sys", "Root of sysfs (tests and containers point it elsewhere)."),
        "procfs": Option("path", "/proc", "Root of procfs."),
    },
    # `hma healthcheck` without the daemon (docs/slurm.md): slurmd kills a HealthCheckProgram
    # after 60 s, so the run bounds itself well below that.
    "healthcheck": {
        "timeout": Option(
            "float",
            50.0,
            "Seconds after which `hma healthcheck` stops and exits unknown (slurmd kills "
            "HealthCheckProgram at 60 s); unfinished Slurm actions stay in the outbox.",
            check=positive,
            maximum=58.0,
        ),
        "probe_timeout": Option(
            "float",
            30.0,
            "Longest a probe may run under `hma healthcheck` without the daemon (a longer "
            "probe timeout is cut to this; a run that needs more is unknown).",
            check=positive,
            below="timeout",
        ),
        "skip": Option(
            "strlist",
            ["efa_mesh"],
            "Probes `hma healthcheck` never runs without the daemon (reported not run, unknown).",
        ),
        "on_error": Option(
            "choice",
            "note",
            "When the configuration does not load (`hma healthcheck`, `hma run`): note (label "
            "the node blind and send a journal entry) or drain (that, and drain the node).",
            choices=("note", "drain"),
        ),
        "interval": Option(
            "float",
            300.0,
            "slurm.conf's HealthCheckInterval: without a daemon, `hma status` shows the last "
            "health check's status.json until it is 3 x this old (then stale, exit 3).",
            check=positive,
            maximum=86400.0,
        ),
        "debug": Option(
            "bool",
            False,
            "Debug lines of every run (what each probe read and compared) in the run log, as "
            "`hma healthcheck -d` (slurmd runs HealthCheckProgram without arguments).",
        ),
        "log": Option(
            "bool",
            True,
            "Keep the run log <state_dir>/healthcheck.log: each run's output, last 100 runs, "
            "at most 1 MiB.",
        ),
    },
}
# The sections of the features (deep checks, topology, remediation) and of the cluster backends
# are added by ``hma.assembly``: the configuration imports no feature.

# Device subsystems whose add/remove events a probe may be triggered by (besides those a probe
# class declares itself).
TRIGGER_SUBSYSTEMS = ("infiniband", "net", "pci")

# Shortest probe interval (a smaller one spins a core); longest probe interval and timeout (a
# timeout must also stay below threading.TIMEOUT_MAX).
MIN_INTERVAL = 0.1
MAX_INTERVAL = 30 * 86400.0
MAX_TIMEOUT = 86400.0

PROBE_COMMON: dict[str, Option] = {
    "enabled": Option("bool", True, "Run this probe."),
    "interval": Option(
        "float",
        60.0,
        "Seconds between runs.",
        check=positive,
        minimum=MIN_INTERVAL,
        maximum=MAX_INTERVAL,
    ),
    "timeout": Option(
        "float",
        30.0,
        "Seconds before a run is abandoned (unknown).",
        check=positive,
        maximum=MAX_TIMEOUT,
    ),
    "triggers": Option(
        "strlist",
        [],
        "Device subsystems whose add/remove events run the probe at once.",
        choices=TRIGGER_SUBSYSTEMS,
    ),
}

CODE_OPTIONS: dict[str, Option] = {
    "severity": Option(
        "choice", None, "Severity.", choices=("ok", "warning", "critical", "unknown")
    ),
    "action": Option("choice", None, "Recommended action.", choices=("none", "reboot", "replace")),
    "fail_after": Option("int", None, "Consecutive bad observations before a fault.", minimum=1),
    "clear_after": Option("int", None, "Consecutive good observations to clear.", minimum=1),
    "enabled": Option("bool", None, "false: the code is dropped (tune false positives)."),
    "window_s": Option(
        "float",
        None,
        "Window of window-cleared codes (and of a counted code's warning below `after`).",
        check=positive,
        maximum=366 * 86400.0,
    ),
    "after": Option(
        "int",
        None,
        "Occurrences within `within` before the code takes its severity and action (below: "
        "a warning that never drains); 1: at the first.",
        minimum=1,
        maximum=1_000_000,
    ),
    "within": Option(
        "duration",
        None,
        'Window that `after` counts in: seconds or "30m", "1h", "7d".',
        check=positive,
        maximum=MAX_WITHIN_S,
    ),
    "per": Option(
        "choice", None, "Count occurrences per component, or all together per node.", choices=PER
    ),
    "mode": Option(
        "choice",
        None,
        "observe: decided, recorded and alerted as what it would do, never acted on.",
        choices=MODES,
    ),
}
assert set(CODE_OPTIONS) == set(OVERRIDABLE)


def _code_problem(code: str, table: Mapping[str, Any], catalogue: Catalogue) -> list[str]:
    """The ``[codes.<CODE>]`` keys that do not fit with each other or with the catalogue entry
    (``after`` > 1 needs a ``within``)."""
    entry = catalogue.get(code)
    if entry is None:
        return []
    after = table.get("after", entry.after)
    within = parse_duration(table["within"]) if "within" in table else entry.within
    problem = policy_problem(after, within, table.get("per", entry.per), entry.mode)
    return [f"codes.{code}.{problem}"] if problem else []


@dataclass(frozen=True)
class Schema:
    """Everything a valid configuration may contain."""

    sections: Mapping[str, Mapping[str, Option]]
    probes: Mapping[str, Mapping[str, Option]]  # probe name -> its options (common ones included)
    reporters: Mapping[str, Mapping[str, Option]]
    catalogue: Catalogue
    sources: Mapping[str, Mapping[str, Option]] = field(default_factory=dict)
    # "probes.NAME" / "sources.NAME" sections that exist but are not checked here: `hma check`
    # loads only the probes it runs (`hma config check` and `hma run` check everything); and
    # the tables of broken plugins ("reporters.NAME", a backend's "NAME").
    unchecked: frozenset[str] = frozenset()
    # Checks across the keys of one section (section values -> "key.path: problem" lines).
    checks: Mapping[str, Callable[[Mapping[str, Any]], list[str]]] = field(default_factory=dict)


def probe_options(
    own: Mapping[str, Option],
    interval: float,
    timeout: float,
    enabled: bool,
    triggers: Sequence[str] = (),
) -> dict:
    """A probe's full option set: the common keys with the probe's defaults, then its own keys."""
    common = dict(PROBE_COMMON)
    common["interval"] = replace(PROBE_COMMON["interval"], default=interval)
    common["timeout"] = replace(PROBE_COMMON["timeout"], default=timeout)
    common["enabled"] = replace(PROBE_COMMON["enabled"], default=enabled)
    common["triggers"] = replace(
        PROBE_COMMON["triggers"],
        default=list(triggers),
        choices=tuple(sorted({*TRIGGER_SUBSYSTEMS, *triggers})),
    )
    return {**common, **own}


@dataclass
class Config:
    """A validated configuration with every default filled in."""

    sections: dict[str, dict[str, Any]]
    probes: dict[str, dict[str, Any]]
    reporters: dict[str, dict[str, Any]]
    codes: dict[str, dict[str, Any]]
    files: list[str] = field(default_factory=list)
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "key.path: problem" lines of a valid configuration that likely does not do what its
    # author meant (`hma config check` prints them; the daemon logs them)
    warnings: list[str] = field(default_factory=list)

    def section(self, name: str) -> dict[str, Any]:
        """Values of a top-level section such as ``agent`` or ``paths``."""
        return self.sections[name]

    def probe(self, name: str) -> dict[str, Any]:
        """Values of ``[probes.<name>]`` (defaults when the section is absent)."""
        return self.probes[name]


def _fill(prefix: str, raw: Any, options: Mapping[str, Option], errors: list[str]) -> dict:
    values = {key: opt.default for key, opt in options.items()}
    if not isinstance(raw, dict):
        errors.append(f"{prefix}: expected a table")
        return values
    for key, value in raw.items():
        opt = options.get(key)
        if opt is None:
            errors.append(f"{prefix}.{key}: unknown key{_hint(key, options)}")
            continue
        problem = opt.validate(value)
        if problem:
            errors.append(f"{prefix}.{key}: {problem}")
        else:
            values[key] = value
    for key, opt in options.items():
        limit = values.get(opt.below) if opt.below else None
        if values[key] is not None and limit is not None and values[key] >= limit:
            errors.append(
                f"{prefix}.{key}: must be below {opt.below} ({limit:g}), got {values[key]:g}"
            )
    return values


def _hint(key: str, known: Any) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def validate(raw: Mapping[str, Any], schema: Schema, files: Sequence[str] = ()) -> Config:
    """Apply defaults and check every key; raises ``ConfigError`` with all problems at once."""
    errors: list[str] = []
    warnings: list[str] = []
    sections: dict[str, dict[str, Any]] = {}
    for name, options in schema.sections.items():
        sections[name] = _fill(name, raw.get(name, {}), options, errors)
        if name in schema.checks and not any(e.startswith(f"{name}.") for e in errors):
            errors += schema.checks[name](sections[name])
    groups = {}
    for group in ("probes", "reporters", "sources"):
        given = raw.get(group, {})
        groups[group] = _fill_group(group, given, getattr(schema, group), errors, schema.unchecked)
        warnings += _off_by_default(group, given, getattr(schema, group))
    probes, reporters, sources = groups["probes"], groups["reporters"], groups["sources"]
    codes: dict[str, dict[str, Any]] = {}
    raw_codes = raw.get("codes", {})
    if not isinstance(raw_codes, dict):
        errors.append("codes: expected a table")
        raw_codes = {}
    for code, table in raw_codes.items():
        if code not in schema.catalogue:
            errors.append(
                f"codes.{code}: unknown code{_hint(code, [e.code for e in schema.catalogue])}"
            )
            continue
        before = len(errors)
        filled = _fill(f"codes.{code}", table, CODE_OPTIONS, errors)
        codes[code] = {k: v for k, v in filled.items() if v is not None}
        if len(errors) == before:
            errors += _code_problem(code, codes[code], schema.catalogue)
    known = [*schema.sections, "probes", "sources", "reporters", "codes"]
    for key in raw:
        if key not in known and key not in schema.unchecked:
            errors.append(f"{key}: unknown section{_hint(key, known)}")
    if errors:
        raise ConfigError(errors)
    return Config(sections, probes, reporters, codes, list(files), sources, warnings)


def salvage(raw: Mapping[str, Any], schema: Schema) -> Config:
    """The configuration ``raw`` as far as it can be read, for saying that it cannot: every
    section and reporter table with the keys that validate, defaults for the rest (no probe,
    event source or code)."""
    errors: list[str] = []
    sections = {
        name: _fill(name, raw.get(name, {}), options, errors)
        for name, options in schema.sections.items()
    }
    reporters = _fill_group("reporters", raw.get("reporters", {}), schema.reporters, errors)
    return Config(sections, {}, reporters, {})


def _off_by_default(group: str, raw: Any, schemas: Mapping[str, Mapping[str, Option]]) -> list[str]:
    """Tables that set options of a plugin that is off by default without turning it on (its
    options then do nothing)."""
    out = []
    for name, table in raw.items() if isinstance(raw, dict) else ():
        enabled = schemas.get(name, {}).get("enabled")
        if not isinstance(table, dict) or "enabled" in table or enabled is None or enabled.default:
            continue
        if table:
            out.append(
                f"{group}.{name}: {', '.join(sorted(table))} set, but the {group[:-1]} is off "
                "(enabled defaults to false): add enabled = true"
            )
    return out


def _fill_group(
    group: str,
    raw: Any,
    schemas: Mapping[str, Mapping[str, Option]],
    errors: list[str],
    unchecked: frozenset[str] = frozenset(),
) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict):
        errors.append(f"{group}: expected a table")
        raw = {}
    out: dict[str, dict[str, Any]] = {}
    for name, options in schemas.items():
        out[name] = _fill(f"{group}.{name}", raw.get(name, {}), options, errors)
    for name in raw:
        if name not in schemas and f"{group}.{name}" not in unchecked:
            errors.append(f"{group}.{name}: no such {group[:-1]}{_hint(name, schemas)}")
    return out


def load(
    schema: Schema,
    explicit: Optional[str] = None,
    read: Optional[tuple[list[tuple[str, dict[str, Any]]], list[str]]] = None,
) -> Config:
    """Read, merge and validate; raises ``ConfigError`` with every problem of every file.

    A file that cannot be read or parsed does not hide the others: they are still validated.
    Each validation error names the file its key comes from. ``read``: what
    ``configfile.read_layers`` returned for this file, when the caller has read it already.
    """
    layers, errors = read if read is not None else read_layers(config_path(explicit))
    raw, files = merged(layers)
    where = origins(layers)
    try:
        config = validate(raw, schema, files)
    except ConfigError as exc:
        raise ConfigError([*errors, *(_in_file(e, where) for e in exc.errors)]) from None
    if errors:
        raise ConfigError(errors)
    config.warnings = [_in_file(w, where) for w in config.warnings]
    return config


def _in_file(error: str, where: Mapping[str, str]) -> str:
    """``error`` (``key.path: problem``) with the file that set the key (or its table)."""
    path = error.split(": ", 1)[0]
    while path:
        if path in where:
            return f"{error} (in {where[path]})"
        path = path.rpartition(".")[0]
    return error


def render_defaults(schema: Schema) -> str:
    """The documented defaults as a commented TOML file (the packaged /etc/hma/hma.toml)."""
    lines = [
        "# hma configuration. Every key is shown with its default, commented out.",
        f"# Numbers must be finite (without a stated range: within +-{FLOAT_LIMIT:,.0f});",
        "# strings are one line without control characters.",
        "",
    ]

    def table(header: str, options: Mapping[str, Option]) -> None:
        lines.append(f"# [{header}]")
        for key, opt in options.items():
            lines.append(f"# {opt.doc}")
            if opt.choices:
                each = "each one of" if opt.kind == "strlist" else "one of"
                lines.append(f"#   {each}: {', '.join(opt.choices)}")
            if opt.limits():
                lines.append(f"#   range: {opt.limits()}")
            lines.append(f"# {key} = {toml_value(opt.default)}")
        lines.append("")

    for name, options in schema.sections.items():
        table(name, options)
    for name, options in sorted(schema.probes.items()):
        table(f"probes.{name}", options)
    for name, options in sorted(schema.sources.items()):
        table(f"sources.{name}", options)
    for name, options in sorted(schema.reporters.items()):
        table(f"reporters.{name}", options)
    table("codes.<CODE>", CODE_OPTIONS)
    return "\n".join(lines)


def toml_value(value: Any) -> str:
    """``value`` as TOML writes it (``<unset>`` for None: a key without a default)."""
    if value is None:
        return "<unset>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return repr(value)
