"""``hma status``: read and judge ``status.json`` (docs/status.md), render it.

The daemon writes the file (hma.reporters.statusfile), and without a daemon each ``hma
healthcheck`` run does (``writer`` "healthcheck": shown with its age, exit code by its verdict
while it is fresh); ``hma status`` calls ``read``, ``render`` and ``exit_code``. Reading never
raises: every problem (no file, no daemon, stale file, garbage) comes back as a plain sentence,
and the exit code is then 3 (unknown).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Mapping, Optional

from hma.adapters.text import printable
from hma.commands import common
from hma.commands.term import columns, fit
from hma.contracts.severity import Severity, worst
from hma.reporters import statusfile

_FAILED_PROBE = ("failed", "timed_out")


def _sev(text: Any) -> Severity:
    try:
        return Severity.parse(str(text))
    except ValueError:
        return Severity.UNKNOWN


def severity(doc: Mapping[str, Any]) -> Severity:
    """The node's severity: the document's, its active faults', and unknown for a probe whose
    last run failed or timed out (what it watches is not measured)."""
    found = [_sev(doc.get("severity", "unknown"))]
    found += [_sev(f.get("severity")) for f in doc.get("faults") or [] if f.get("active", True)]
    found += [Severity.UNKNOWN for p in doc.get("probes") or [] if p.get("status") in _FAILED_PROBE]
    return worst(found)


def exit_code(doc: Optional[Mapping[str, Any]], problem: str = "") -> int:
    """Nagios exit code: 3 when there is a problem (no daemon, stale), else the node's severity
    by precedence critical (2) > unknown (3) > warning (1) > ok (0)."""
    if doc is None or problem:
        return int(Severity.UNKNOWN)
    return int(severity(doc))


# --- rendering ------------------------------------------------------------------------------------

_VALUE_CAP = 500
_LINES_CAP = 20


def _clean(text: Any, newlines: bool = False) -> str:
    """Text that others wrote (log lines, tool output), safe for the terminal."""
    return printable(str(text), newlines)


def _when(ts: Any, now: float) -> str:
    if not isinstance(ts, (int, float)) or not ts:
        return "never"
    fmt = "%H:%M:%S" if abs(now - ts) < 43200 else "%Y-%m-%d %H:%M"
    clock = time.strftime(fmt, time.localtime(ts))
    delta = now - ts
    rel = f"{statusfile.duration(delta)} ago" if delta >= 0 else f"in {statusfile.duration(-delta)}"
    return f"{clock} ({rel})"


def _took(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _evidence(details: Mapping[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for key in sorted(details):
        value = details[key]
        text = (
            value
            if isinstance(value, str)
            else json.dumps(value, sort_keys=True, default=str, allow_nan=False)
        )
        text = _clean(text, newlines=True)
        if len(text) > _VALUE_CAP:
            text = text[:_VALUE_CAP] + f"... ({len(text)} characters)"
        parts = text.splitlines() or [""]
        if len(parts) > _LINES_CAP:
            parts = [*parts[:_LINES_CAP], f"... ({len(parts)} lines)"]
        head = f"{indent}{_clean(key)}: "
        lines.append(head + parts[0])
        lines += [" " * len(head) + p for p in parts[1:]]
    return lines


_CLEARS = {
    "observation": "clears after good observations",
    "reboot": "clears after a reboot",
    "operator": "clears when an operator runs `hma ack`",
    "window": "clears when it stops recurring",
}


def _fault_lines(fault: Mapping[str, Any], now: float) -> list[str]:
    sev = _clean(fault.get("severity", "unknown"))
    code, comp = _clean(fault.get("code", "?")), _clean(fault.get("component", "?"))
    lines = [f"  [{sev}] {code} on {comp}: {_clean(fault.get('message', ''))}"]
    facts = [f"action {_clean(fault.get('action', 'none'))}"]
    if fault.get("drains") and fault.get("active", True) and sev == "critical":
        facts.append("drains the node")
    clears = str(fault.get("clears", ""))
    if clears:
        facts.append(_CLEARS.get(clears, f"clears by {_clean(clears)}"))
    lines.append("      " + ", ".join(facts))
    policy = _policy_words(fault)
    if policy:
        lines.append("      " + policy)
    count = fault.get("count", 0)
    lines.append(
        f"      since {_when(fault.get('first_seen'), now)}, seen {_clean(count)}x, "
        f"last {_when(fault.get('last_seen'), now)}, probe {_clean(fault.get('probe') or '-')}"
    )
    details = fault.get("details") or {}
    if isinstance(details, Mapping) and details:
        lines.append("      evidence:")
        lines += _evidence(details, "        ")
    return lines


def _policy_words(fault: Mapping[str, Any]) -> str:
    """The code's count-in-window and observe mode in words ('' when it has neither)."""
    parts = []
    limit = fault.get("threshold")
    if isinstance(limit, Mapping):
        within = limit.get("within")
        span = statusfile.duration(within) if isinstance(within, (int, float)) else "?"
        scope = "on the node" if limit.get("per") == "node" else "on this component"
        count = f"{_clean(limit.get('occurrences', '?'))} of {_clean(limit.get('after', '?'))}"
        if limit.get("reached"):
            parts.append(f"threshold reached ({count} within {span} {scope})")
        else:
            parts.append(f"below its threshold: {count} within {span} {scope}")
    if fault.get("observe"):
        would = _clean(fault.get("would") or "")
        parts.append(f"observe mode: would {would}" if would else "observe mode")
        parts.append("never acted on")
    return ", ".join(parts)


def _fault_order(fault: Mapping[str, Any]) -> tuple[int, str, str]:
    return (-_sev(fault.get("severity")).rank, str(fault.get("code")), str(fault.get("component")))


def render(
    doc: Optional[Mapping[str, Any]],
    problem: str = "",
    now: Optional[float] = None,
    terminal: Optional[int] = None,
) -> str:
    """A readable summary: health, probes, active faults with evidence, remediation and why.
    ``terminal``: the terminal's columns, to which each row of the probe table is cut."""
    if doc is None:
        return f"hma status: {_clean(problem or 'no status')}"
    now = time.time() if now is None else now
    lines: list[str] = []
    checked = doc.get("writer") == statusfile.HEALTHCHECK
    if problem:
        lines += [f"hma status: {_clean(problem)}", "Last known status (may be out of date):", ""]
    elif checked:
        lines += [f"hma status: no daemon; last health check {_ago(doc.get('generated'), now)}", ""]
    sev = severity(doc)
    head = f"{_clean(doc.get('node', '?'))}: {str(sev).upper()}"
    if doc.get("action") and doc.get("action") != "none":
        head += f", recommended action {_clean(doc['action'])}"
    lines.append(head)
    lines += ["  " + ", ".join(_about(doc, checked, now))]
    lines += _maintenance_lines(doc.get("maintenance"))
    lines += _requested_lines(doc.get("requested"), now)
    lines.append("")

    probes = sorted(doc.get("probes") or [], key=lambda p: str(p.get("name")))
    lines.append(f"Probes ({len(probes)}):")
    if probes:
        width = max(5, *(len(str(p.get("name"))) for p in probes)) + 2
        lines.append(f"  {'NAME':<{width}}{'RESULT':<13}{'LAST RUN':<22}{'TOOK':>9}  FINDINGS")
        for p in probes:
            ran = p.get("last_run") is not None and p.get("status") not in ("disabled",)
            row = (
                f"  {_clean(p.get('name')):<{width}}{_clean(p.get('status', '?')):<13}"
                f"{_when(p.get('last_run'), now) if ran else '-':<22}"
                f"{_took(p.get('duration_s')) if ran else '-':>9}  "
                f"{_clean(p.get('findings', 0)) if ran else '-':<9}"
            )
            error = _clean(p.get("error") or "", newlines=True).strip()
            if error:
                row += error.splitlines()[0][:200]
            lines.append(fit(row.rstrip(), terminal))
    lines.append("")
    if checked:
        lines += ["Event sources: not followed without the daemon (`hma run` follows them)", ""]
    else:
        lines += _source_lines(doc.get("sources"), now, terminal)

    faults = doc.get("faults") or []
    active = sorted((f for f in faults if f.get("active", True)), key=_fault_order)
    pending = sorted((f for f in faults if not f.get("active", True)), key=_fault_order)
    if active:
        lines.append(f"Active faults ({len(active)}):")
        for fault in active:
            lines += _fault_lines(fault, now)
    else:
        lines.append("Active faults: none")
    if doc.get("faults_omitted"):
        lines.append(
            f"  ... and {_clean(doc['faults_omitted'])} more not listed in the status file"
        )
    if pending:
        lines.append(f"Pending, not yet faults ({len(pending)}):")
        for fault in pending:
            lines.append(
                f"  [{_clean(fault.get('severity'))}] {_clean(fault.get('code'))} on "
                f"{_clean(fault.get('component'))}: {_clean(fault.get('message', ''))} "
                f"(seen {_clean(fault.get('count', 0))}x)"
            )
    lines.append("")
    lines += _remediation_lines(doc.get("remediation") or {}, now)
    return "\n".join(lines).rstrip() + "\n"


def _ago(ts: Any, now: float) -> str:
    """How long ago ``ts`` was, in words ("2 min ago"; "at an unknown time")."""
    if not isinstance(ts, (int, float)) or not ts:
        return "at an unknown time"
    return f"{statusfile.duration(now - ts)} ago"


def _about(doc: Mapping[str, Any], checked: bool, now: float) -> list[str]:
    """Who wrote the document and when: the daemon (pid, uptime) or a health check run
    (``checked``: its pid, when it ran, how long it took)."""
    about = [f"hma {_clean(doc.get('version', '?'))}"]
    started, generated = doc.get("started"), doc.get("generated")
    if checked:
        about.append(f"health check pid {_clean(doc.get('pid'))}, ran {_when(started, now)}")
        if isinstance(started, (int, float)) and isinstance(generated, (int, float)):
            about.append(f"took {_took(generated - started)}")
    else:
        about.append(f"pid {_clean(doc.get('pid'))}")
        if isinstance(started, (int, float)):
            about.append(f"up {statusfile.duration(now - started)}")
        about.append(f"status written {_when(generated, now)}")
    if doc.get("instance_type"):
        about.append(f"instance {_clean(doc['instance_type'])}")
    topo = doc.get("topology")
    if isinstance(topo, Mapping) and topo.get("domain"):
        about.append(f"NVLink domain {_clean(topo['domain'])} ({_clean(topo.get('source'))})")
    return about


def _source_lines(sources: Any, now: float, terminal: Optional[int]) -> list[str]:
    """The event sources' table: state, what each reads, since when and why (a document
    written before sources were shown has none: no section)."""
    if not isinstance(sources, list):
        return []
    rows = [s for s in sources if isinstance(s, Mapping)]
    if not rows:
        return ["Event sources: none enabled", ""]
    width = max(5, *(len(_clean(s.get("name"))) for s in rows)) + 2
    lines = [f"Event sources ({len(rows)}):"]
    lines.append(f"  {'NAME':<{width}}{'STATE':<16}{'READS':<9}{'SINCE':<22}WHY")
    for src in sorted(rows, key=lambda s: str(s.get("name"))):
        row = (
            f"  {_clean(src.get('name')):<{width}}{_clean(src.get('state', '?')):<16}"
            f"{_clean(src.get('backend') or '-'):<9}{_when(src.get('since'), now):<22}"
            f"{_clean(src.get('reason') or '')[:300]}"
        )
        lines.append(fit(row.rstrip(), terminal))
    return [*lines, ""]


def _requested_lines(block: Any, now: float) -> list[str]:
    """The last requested check (``hma check --request``): when, and its verdict."""
    if not isinstance(block, Mapping):
        return []
    if block.get("done") is None:
        return [f"  requested check: running since {_when(block.get('at'), now)}"]
    verdict = _clean(str(block.get("verdict")).upper())
    return [f"  requested check: {verdict}, every probe run at {_when(block.get('at'), now)}"]


def _maintenance_lines(doc: Any) -> list[str]:
    """The maintenance window while it is open (``hma maintenance on``)."""
    from hma.contracts.maintenance import Maintenance

    if not isinstance(doc, Mapping) or doc.get("active") is not True:
        return []
    try:
        window = Maintenance.from_json(doc)
    except ValueError:
        return ["  MAINTENANCE: on (window unreadable); no action is taken on this node"]
    return [
        f"  MAINTENANCE: on, {_clean(window.describe())}",
        "  hma detects, records and alerts; it takes no action on this node",
    ]


def _remediation_lines(rem: Mapping[str, Any], now: float) -> list[str]:
    if not rem:
        return ["Remediation: not running (the agent only reports)"]
    head = f"Remediation: policy {_clean(rem.get('policy', '?'))}"
    if rem.get("state"):
        head += f", node {_clean(rem['state'])} in Slurm"
    jobs = rem.get("jobs") or []
    head += f", jobs running: {', '.join(_clean(j) for j in jobs)}" if jobs else ", no jobs"
    lines = [head]
    if rem.get("dry_run"):
        lines.append("  DRY RUN: actions are decided and logged, never applied")
    if rem.get("policy") == "none":
        lines.append("  policy none: the agent never acts on its own")
    if rem.get("held"):
        lines.append(f"  HELD: {_clean(rem['held'])}")
    if rem.get("honoured"):
        since = (rem.get("episode") or {}).get("honoured_at")
        lines.append(f"  OPERATOR'S RESUME: {_clean(rem['honoured'])} (since {_when(since, now)})")
    actions = sorted(rem.get("actions") or [], key=lambda a: a.get("id") or 0)
    if not actions:
        lines.append("  Actions: none")
        return lines
    lines.append(f"  Actions ({len(actions)}):")
    for a in actions:
        attempts = a.get("attempts", 0)
        row = (
            f"    #{_clean(a.get('id'))} {_clean(a.get('kind', '?'))} "
            f"{_clean(a.get('state', '?'))}, "
            f"{_clean(attempts)} attempt{'' if attempts == 1 else 's'}, "
            f"updated {_when(a.get('updated'), now)}"
        )
        if a.get("reason"):
            row += f", reason {_clean(a['reason'])!r}"
        if a.get("state") == "failed" and a.get("next_try"):  # retried with backoff: when
            row += f", next try {_when(a.get('next_try'), now)}"
        lines.append(row)
        if a.get("state") == "held" and rem.get("held"):
            lines.append(f"      held: {_clean(rem['held'])}")
        if a.get("last_error"):  # on a done action the field holds how it was done
            label = "result" if a.get("state") == "done" else "last error"
            lines.append(f"      {label}: {_clean(a['last_error'])}")
    return lines


def boot_id_of(config_file: Optional[str]) -> Optional[str]:
    """This boot's id as the daemon reads it, from the configuration files
    (hma.commands.common.boot_id_in)."""
    from hma.config import files

    raw, _files, _errors = files.read_raw(files.config_path(config_file))
    return common.boot_id_in(raw)


def run_dir_of(config_file: Optional[str]) -> tuple[str, list[str]]:
    """``[agent] run_dir`` from the configuration files (default when unset or unreadable),
    with the problems met. Only this key is read, so a config broken elsewhere does not matter."""
    from hma.config import files

    return files.early_agent_path(config_file, "run_dir")


def main(config_file: Optional[str], as_json: bool) -> int:
    """``hma status [--json]``: print the summary (or the document); exit as documented."""
    run_dir, problems = run_dir_of(config_file)
    for line in problems:
        print(f"hma status: config: {line} (looking in {run_dir})", file=sys.stderr)
    doc, problem = statusfile.read(run_dir, boot_id=boot_id_of(config_file), healthcheck=True)
    if as_json:
        if doc is None:
            common.dump(common.problem("status", problem, schema=statusfile.SCHEMA))
        else:
            common.dump({**doc, "problem": problem} if problem else doc)
        if problem:
            print(f"hma status: {_clean(problem)}", file=sys.stderr)
    else:
        print(render(doc, problem, terminal=columns()), end="" if doc is not None else "\n")
    return exit_code(doc, problem)
