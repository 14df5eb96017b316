"""``hma check``: run probes once in the foreground. No remediation and no state writes."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, Optional, Sequence

from hma.adapters.text import printable
from hma.assembly import load
from hma.contracts.model import Finding, ProbeRun, Severity
from hma.contracts.probe import NodeFacts
from hma.contracts.severity import worst
from hma.detection.runner import run_once
from hma.detection.setup import Setup


def document(node: str, runs: Sequence[ProbeRun], extra: Sequence[Finding] = ()) -> dict[str, Any]:
    """The ``hma check --json`` document (docs/cli.md)."""
    severities = [f.severity or Severity.UNKNOWN for r in runs for f in r.findings]
    severities += [f.severity or Severity.UNKNOWN for f in extra]
    return {
        "node": node,
        "severity": str(worst(severities)),
        "probes": [
            {
                "name": r.probe,
                "status": str(r.status),
                "duration_s": round(r.duration_s, 4),
                **({"error": r.error} if r.error else {}),
                "findings": [_finding_json(f) for f in r.findings],
            }
            for r in runs
        ],
        **({"agent_findings": [_finding_json(f) for f in extra]} if extra else {}),
    }


def _finding_json(f: Finding) -> dict[str, Any]:
    data = f.to_json()
    return {k: data[k] for k in ("code", "severity", "component", "action", "message", "details")}


def render_text(doc: dict[str, Any]) -> str:
    """Human-readable form of the check document (text that others wrote escaped)."""
    lines = [f"{printable(doc['node'])}: {doc['severity'].upper()}"]
    for probe in doc["probes"]:
        lines.append(
            f"  {printable(probe['name']):<12} {probe['status']:<11} "
            f"{probe['duration_s'] * 1000:7.0f} ms"
            + (f"  {printable(probe['error'])}" if probe.get("error") else "")
        )
        lines += [f"    {_finding_line(f)}" for f in probe["findings"]]
    lines += [f"  {_finding_line(f)}" for f in doc.get("agent_findings", [])]
    return "\n".join(lines)


def _finding_line(f: dict[str, Any]) -> str:
    return f"[{f['severity']}] {printable(f['code'])} {printable(f['component'])}: " + printable(
        f["message"]
    )


def exit_code(doc: dict[str, Any]) -> int:
    """Nagios exit code of a document's severity."""
    return int(Severity.parse(doc["severity"]))


def select(setup: Setup, wanted: Sequence[str]) -> tuple[list[str], Optional[str]]:
    """Probe names to run (default: all enabled) or an error for a name that is not a probe."""
    if not wanted:
        return setup.enabled(), None
    # reported as HMA_PLUGIN_BROKEN, not run
    broken = {b.name for b in setup.broken if b.kind == "probe"}
    missing = [n for n in wanted if n not in setup.probes and n not in broken]
    if not missing:
        return [n for n in wanted if n in setup.probes], None
    from hma.contracts.source import GROUP as SOURCE_GROUP
    from hma.detection.registry import entry_point_names

    sources = set(setup.sources) | set(entry_point_names(SOURCE_GROUP))
    known = sorted(set(setup.probes) | set(entry_point_names()))
    problems = []
    for name in missing:
        if name in sources:
            problems.append(
                f"{name} is an event source, not a probe: the agent (`hma run`) follows it "
                f"continuously and `hma status` shows its findings; `hma logscan FILE` runs "
                f"its rules over a saved log"
                if name == "kernel_log"
                else f"{name} is an event source, not a probe: `hma status` shows its findings"
            )
        else:
            problems.append(
                f"unknown probe {name!r} (probes: {', '.join(known)}; "
                "`hma check --help` describes them)"
            )
    return [], "; ".join(problems)


def probes_help(config_file: Optional[str], width: int = 80) -> str:
    """The probes and event sources installed here, for ``hma check --help`` (lines wrapped to
    ``width``)."""
    from hma.commands.term import wrap
    from hma.config.files import early_agent_path
    from hma.contracts.source import GROUP as SOURCE_GROUP
    from hma.contracts.source import EventSource
    from hma.detection import registry

    def table(rows: list[str]) -> list[str]:  # the descriptions wrap under themselves
        return [out for row in rows for out in wrap(row, width, " " * 15)]

    probes, broken = registry.discover()
    sources, _ = registry.discover(SOURCE_GROUP, EventSource)
    folder = early_agent_path(config_file, "probes_dir")[0]
    lines = ["probes installed here (PROBE):"]
    lines += table([f"  {n:<12} {cls.description}" for n, cls in sorted(probes.items())])
    lines += table([f"  {b.name:<12} (failed to load: {b.error})" for b in broken])
    executables = sorted(registry.exec_probes(folder))
    lines += wrap(
        "executable probes (every root-owned executable here, named after its file):", width, "  "
    )
    lines.append(f"  {folder}: {', '.join(executables) or 'none'}")  # a path is never cut
    lines += wrap(
        "event sources (followed by `hma run`; `hma check` does not run them):", width, "  "
    )
    lines += table([f"  {n:<12} {cls.description}" for n, cls in sorted(sources.items())])
    return "\n".join(lines)


def _facts(setup: Setup, names: Sequence[str]) -> Optional[NodeFacts]:
    """The node's facts from the cluster backend when a probe to run judges them (one read, as
    the agent's facts thread makes it; nothing written); None (the node's name only) else. A
    read that fails is said on stderr: those probes see no state."""
    if not any(setup.probes[n].needs_facts for n in names):
        return None
    from hma.detection.registry import make_backend
    from hma.remediation.facts import read_once

    facts, error = read_once(make_backend(setup.config))
    if error:
        print(
            f"hma check: the node's state was not read from the cluster: {printable(error)}",
            file=sys.stderr,
        )
    return replace(facts, node_name=facts.node_name or setup.node_name)


def main(config: Optional[str], probes: Sequence[str], as_json: bool) -> int:
    """``hma check [PROBE...] [--json]``: the exit code (Nagios) of the probes' findings.
    Raises ConfigError."""
    setup = load(config, only=list(probes) or None)  # only the named probes' sections
    names, error = select(setup, probes)
    if error:
        print(f"hma check: {error}", file=sys.stderr)
        if as_json:
            from hma.commands import common

            common.dump(common.problem("check", error, node=setup.node_name))
        return 3
    runs = run_once(setup, names, facts=_facts(setup, names))
    doc = document(setup.node_name, runs, setup.catalogue.resolve_all(setup.load_findings()))
    if as_json:
        import json

        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(render_text(doc))
    return exit_code(doc)
