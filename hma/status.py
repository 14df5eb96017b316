"""``hma status``: read and judge ``status.json`` (docs/status.md), render it; write it atomically.

The daemon offers every new document to a ``StatusWriter`` (written when it changed, at most four
times a second, bounded in size, atomically); ``hma status`` calls ``read``, ``render`` and
``exit_code``. Reading never raises: every problem (no file, no daemon, stale file, garbage) comes
back as a plain sentence, and the exit code is then 3 (unknown).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from hma.severity import Severity, worst

SCHEMA = 1
FILENAME = "status.json"
STALE_FACTOR = 3.0  # the file is stale when older than this many heartbeats
_FAILED_PROBE = ("failed", "timed_out")


def status_path(run_dir: Union[str, Path]) -> Path:
    """``<run_dir>/status.json``."""
    return Path(run_dir) / FILENAME


def write_atomic(path: Union[str, Path], doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as JSON: temp file in the same folder, fsync, rename (readers see the old or
    the new document, never a mix). Mode 0644: any user may run ``hma status``."""
    write_text(Path(path), json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n")


def write_text(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` atomically (temp file, fsync, rename; mode 0644)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (no-op on tmpfs)
        dirfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)


MAX_FAULTS = 200
"""Faults listed in status.json at most (active first); the rest are counted in faults_omitted."""
MAX_DETAILS = 8192
"""Characters of one fault's ``details`` (or one probe's ``summary``) as JSON, at most."""
MAX_SUMMARY = 65536


def _capped(value: Any, limit: int) -> Any:
    text = json.dumps(value, separators=(",", ":"), default=str)
    if len(text) <= limit:
        return value
    keys = sorted(value)[:50] if isinstance(value, dict) else []
    return {"truncated": True, "size": len(text), "keys": keys}


def bounded(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with a size that no number of findings can grow past: at most MAX_FAULTS faults
    (the order given; ``faults_omitted`` counts the rest), each fault's ``details`` and each
    probe's ``summary`` replaced by ``{"truncated": true, "size": N, "keys": [...]}`` when too
    large."""
    out = dict(doc)
    faults = list(doc.get("faults") or [])
    if len(faults) > MAX_FAULTS:
        out["faults_omitted"] = len(faults) - MAX_FAULTS
        faults = faults[:MAX_FAULTS]
    out["faults"] = [{**f, "details": _capped(f.get("details") or {}, MAX_DETAILS)} for f in faults]
    out["probes"] = [
        {**p, "summary": _capped(p.get("summary"), MAX_SUMMARY)} for p in doc.get("probes") or []
    ]
    return out


class StatusWriter:
    """Writes status.json when its content changes or a heartbeat is due, at most once every
    ``min_interval_s``. A change offered sooner sets ``pending``: the caller offers a fresh
    document again once ``wait`` is 0."""

    def __init__(
        self, path: Union[str, Path], heartbeat_s: float, min_interval_s: float = 0.25
    ) -> None:
        self.path = Path(path)
        self.heartbeat_s = heartbeat_s
        self.min_interval_s = min_interval_s
        self._last_body = ""
        self.last_write = -1e18  # monotonic time of the last write
        self.pending = False
        self.writes = 0

    def wait(self, mono: float) -> float:
        """Seconds until a pending document may be written (inf when none is pending)."""
        if not self.pending:
            return float("inf")
        return max(0.0, self.last_write + self.min_interval_s - mono)

    def offer(self, doc: Mapping[str, Any], mono: float) -> bool:
        """Write ``doc`` (bounded) if it differs from the last one written, apart from
        ``generated``, or the heartbeat is due; returns whether it was written. Raises OSError."""
        doc = bounded(doc)
        body = json.dumps({k: v for k, v in doc.items() if k != "generated"}, sort_keys=True)
        if body == self._last_body and mono - self.last_write < self.heartbeat_s:
            self.pending = False
            return False
        if mono - self.last_write < self.min_interval_s:
            self.pending = True
            return False
        self.pending = False
        self.last_write = mono  # a failed write is retried at the next change or heartbeat
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, doc)
        self._last_body = body
        self.writes += 1
        return True


def pid_alive(pid: int) -> bool:
    """Whether a process exists (a zombie counts as gone; another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except (OverflowError, ValueError):
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def boot_id(procfs: str = "/proc") -> str:
    """The kernel's boot id under a procfs root ("" when unreadable)."""
    try:
        return (Path(procfs) / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def current_boot_id() -> str:
    """This boot's id without dashes ("" when unreadable)."""
    return boot_id().replace("-", "")


def read(
    run_dir: Union[str, Path],
    now: Optional[float] = None,
    boot_id: Optional[str] = None,
) -> tuple[Optional[dict[str, Any]], str]:
    """(document, problem): the document when one could be read, and "" or why it cannot be
    trusted (no daemon, daemon gone, stale file, newer schema). Never raises."""
    path = status_path(run_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"no daemon: {path} does not exist (is hma running? systemctl status hma)"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return None, f"cannot parse {path}: {exc}"
    if not isinstance(doc, dict):
        return None, f"cannot parse {path}: not a JSON object"
    schema = doc.get("schema")
    if schema != SCHEMA:
        return None, f"{path} has schema {schema!r}; this hma reads schema {SCHEMA}"
    now = time.time() if now is None else now
    age = now - float(doc.get("generated") or 0.0)
    when = f"last written {_duration(age)} ago"
    pid = doc.get("pid")
    booted = current_boot_id() if boot_id is None else boot_id.replace("-", "")
    doc_boot = str(doc.get("boot_id") or "").replace("-", "")
    if booted and doc_boot and booted != doc_boot:
        return doc, f"no daemon: {path} is from an earlier boot ({when})"
    if not isinstance(pid, int) or not pid_alive(pid):
        return doc, f"no daemon: the hma daemon (pid {pid}) is not running; {path} was {when}"
    heartbeat = float(doc.get("heartbeat_s") or 0.0)
    if heartbeat > 0 and age > STALE_FACTOR * heartbeat:
        return doc, (
            f"stale: {path} was {when}, but the daemon (pid {pid}) rewrites it every "
            f"{heartbeat:g} s; it may be hung (journalctl -u hma)"
        )
    return doc, ""


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


def _clean(text: Any) -> str:
    """Untrusted text (log lines, tool output) without terminal control characters."""
    out = []
    for ch in str(text):
        code = ord(ch)
        if ch in "\n\t" or (32 <= code < 127) or code > 159:
            out.append(ch)
        else:
            out.append(f"\\x{code:02x}")
    return "".join(out)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _when(ts: Any, now: float) -> str:
    if not isinstance(ts, (int, float)) or not ts:
        return "never"
    fmt = "%H:%M:%S" if abs(now - ts) < 43200 else "%Y-%m-%d %H:%M"
    clock = time.strftime(fmt, time.localtime(ts))
    delta = now - ts
    rel = f"{_duration(delta)} ago" if delta >= 0 else f"in {_duration(-delta)}"
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
        text = _clean(text)
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
    count = fault.get("count", 0)
    lines.append(
        f"      since {_when(fault.get('first_seen'), now)}, seen {count}x, "
        f"last {_when(fault.get('last_seen'), now)}, probe {_clean(fault.get('probe') or '-')}"
    )
    details = fault.get("details") or {}
    if isinstance(details, Mapping) and details:
        lines.append("      evidence:")
        lines += _evidence(details, "        ")
    return lines


def _fault_order(fault: Mapping[str, Any]) -> tuple[int, str, str]:
    return (-_sev(fault.get("severity")).rank, str(fault.get("code")), str(fault.get("component")))


def render(doc: Optional[Mapping[str, Any]], problem: str = "", now: Optional[float] = None) -> str:
    """A readable summary: health, probes, active faults with evidence, remediation and why."""
    if doc is None:
        return f"hma status: {problem or 'no status'}"
    now = time.time() if now is None else now
    lines: list[str] = []
    if problem:
        lines += [f"hma status: {problem}", "Last known status (may be out of date):", ""]
    sev = severity(doc)
    head = f"{_clean(doc.get('node', '?'))}: {str(sev).upper()}"
    if doc.get("action") and doc.get("action") != "none":
        head += f", recommended action {_clean(doc['action'])}"
    lines.append(head)
    about = [f"hma {_clean(doc.get('version', '?'))}", f"pid {doc.get('pid')}"]
    if isinstance(doc.get("started"), (int, float)):
        about.append(f"up {_duration(now - doc['started'])}")
    about.append(f"status written {_when(doc.get('generated'), now)}")
    if doc.get("instance_type"):
        about.append(f"instance {_clean(doc['instance_type'])}")
    topo = doc.get("topology")
    if isinstance(topo, Mapping) and topo.get("domain"):
        about.append(f"NVLink domain {_clean(topo['domain'])} ({_clean(topo.get('source'))})")
    lines += ["  " + ", ".join(about), ""]

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
                f"{str(p.get('findings', 0)) if ran else '-':<9}"
            )
            error = _clean(p.get("error") or "").strip()
            if error:
                row += error.splitlines()[0][:200]
            lines.append(row.rstrip())
    lines.append("")

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
        lines.append(f"  ... and {doc['faults_omitted']} more not listed in the status file")
    if pending:
        lines.append(f"Pending, not yet faults ({len(pending)}):")
        for fault in pending:
            lines.append(
                f"  [{_clean(fault.get('severity'))}] {_clean(fault.get('code'))} on "
                f"{_clean(fault.get('component'))}: {_clean(fault.get('message', ''))} "
                f"(seen {fault.get('count', 0)}x)"
            )
    lines.append("")
    lines += _remediation_lines(doc.get("remediation") or {}, now)
    return "\n".join(lines).rstrip() + "\n"


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
    actions = sorted(rem.get("actions") or [], key=lambda a: a.get("id") or 0)
    if not actions:
        lines.append("  Actions: none")
        return lines
    lines.append(f"  Actions ({len(actions)}):")
    for a in actions:
        attempts = a.get("attempts", 0)
        row = (
            f"    #{a.get('id')} {_clean(a.get('kind', '?'))} {_clean(a.get('state', '?'))}, "
            f"{attempts} attempt{'' if attempts == 1 else 's'}, "
            f"updated {_when(a.get('updated'), now)}"
        )
        if a.get("reason"):
            row += f", reason {_clean(a['reason'])!r}"
        lines.append(row)
        if a.get("state") == "held" and rem.get("held"):
            lines.append(f"      held: {_clean(rem['held'])}")
        if a.get("last_error"):  # on a done action the field holds how it was done
            label = "result" if a.get("state") == "done" else "last error"
            lines.append(f"      {label}: {_clean(a['last_error'])}")
    return lines


def boot_id_of(config_file: Optional[str]) -> Optional[str]:
    """This boot's id as the daemon reads it: under ``[paths] procfs`` when the configuration
    sets one other than /proc ("" when unreadable there), else None (read() uses /proc)."""
    from hma import configfile

    raw, _files, _errors = configfile.read_raw(configfile.config_path(config_file))
    paths = raw.get("paths")
    procfs = paths.get("procfs") if isinstance(paths, dict) else None
    if not isinstance(procfs, str) or not procfs.startswith("/") or procfs.rstrip("/") == "/proc":
        return None
    return boot_id(procfs)


def run_dir_of(config_file: Optional[str]) -> tuple[str, list[str]]:
    """``[agent] run_dir`` from the configuration files (default when unset or unreadable),
    with the problems met. Only this key is read, so a config broken elsewhere does not matter."""
    from hma import configfile

    return configfile.early_agent_path(config_file, "run_dir")


def main(config_file: Optional[str], as_json: bool) -> int:
    """``hma status [--json]``: print the summary (or the document); exit as documented."""
    run_dir, problems = run_dir_of(config_file)
    for line in problems:
        print(f"hma status: config: {line} (looking in {run_dir})", file=sys.stderr)
    doc, problem = read(run_dir, boot_id=boot_id_of(config_file))
    if as_json:
        if doc is not None:
            print(json.dumps(doc, indent=2, allow_nan=False))
        if problem:
            print(f"hma status: {problem}", file=sys.stderr)
    else:
        print(render(doc, problem), end="" if doc is not None else "\n")
    return exit_code(doc, problem)
