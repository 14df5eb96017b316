"""``status.json``: where it lives, the document, writing it (atomic, bounded in size, when it
changed), and reading it with the checks that make it trustworthy (the writer's pid alive, this
boot, fresh).

The status reporter (hma.reporters.status) builds the document and offers it to a
``StatusWriter``. ``read`` never raises: every problem comes back as a plain sentence.
``hma status`` (hma.commands.status) renders it (docs/status.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Union

SCHEMA = 1
FILENAME = "status.json"
STALE_FACTOR = 3.0  # the file is stale when older than this many heartbeats
HEALTHCHECK = "healthcheck"  # ``writer`` of a document `hma healthcheck` wrote (no daemon)


def status_path(run_dir: Union[str, Path]) -> Path:
    """``<run_dir>/status.json``."""
    return Path(run_dir) / FILENAME


def write_atomic(path: Union[str, Path], doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as JSON: temp file in the same folder, rename (readers see the old or the
    new document, never a mix). Mode 0644: any user may run ``hma status``. No fsync: the file
    describes this boot only (``read`` refuses another boot's and reports one it cannot parse),
    and each write on a disk-backed run_dir would cost the node a journal commit."""
    write_text(
        Path(path), json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n", durable=False
    )


def write_text(target: Path, text: str, durable: bool = True) -> None:
    """Write ``text`` to ``target`` atomically (temp file, rename; mode 0644); ``durable``: fsync
    the file before the rename and the folder after it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
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
    import psutil  # here: every command's parser imports this module (`hma --version` too)

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, OverflowError, ValueError):
        return False
    except psutil.AccessDenied:
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
    healthcheck: bool = False,
) -> tuple[Optional[dict[str, Any]], str]:
    """(document, problem): the document when one could be read, and "" or why it cannot be
    trusted (no daemon, daemon gone, stale file, newer schema). Never raises.

    A document the health check wrote (``writer`` "healthcheck": no daemon runs) is "no daemon"
    to every caller that needs one (its pid has exited); with ``healthcheck`` (``hma status``)
    it is trusted while it is fresh: written this boot, within STALE_FACTOR x its interval."""
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
    when = f"last written {duration(age)} ago"
    pid = doc.get("pid")
    booted = current_boot_id() if boot_id is None else boot_id.replace("-", "")
    doc_boot = str(doc.get("boot_id") or "").replace("-", "")
    if booted and doc_boot and booted != doc_boot:
        return doc, f"no daemon: {path} is from an earlier boot ({when})"
    if doc.get("writer") == HEALTHCHECK:
        return doc, _checked_by_healthcheck(doc, path, age, healthcheck)
    if not isinstance(pid, int) or not pid_alive(pid):
        return doc, f"no daemon: the hma daemon (pid {pid}) is not running; {path} was {when}"
    heartbeat = float(doc.get("heartbeat_s") or 0.0)
    if heartbeat > 0 and age > STALE_FACTOR * heartbeat:
        return doc, (
            f"stale: {path} was {when}, but the daemon (pid {pid}) rewrites it every "
            f"{heartbeat:g} s; it may be hung (journalctl -u hma)"
        )
    return doc, ""


def _checked_by_healthcheck(doc: Mapping[str, Any], path: Path, age: float, wanted: bool) -> str:
    """The problem of a document the health check wrote, ``age`` seconds old ("" when it is
    ``wanted`` and fresh)."""
    when = f"the last health check wrote {path} {duration(age)} ago"
    if not wanted:
        return f"no daemon: {when} (pid {doc.get('pid')}, exited)"
    interval = float(doc.get("heartbeat_s") or 0.0)
    if interval > 0 and age > STALE_FACTOR * interval:
        return (
            f"stale: no daemon, and {when}; slurmd runs it every {interval:g} s "
            "([healthcheck] interval): is HealthCheckProgram set and slurmd running?"
        )
    return ""


def daemon_pid(run_dir: Union[str, Path], procfs: str) -> Optional[int]:
    """PID of the running daemon (from a trustworthy status.json), else None."""
    doc, problem = read(run_dir, boot_id=boot_id(procfs))
    return int(doc["pid"]) if doc is not None and not problem else None


def duration(seconds: float) -> str:
    """``seconds`` in words: "42 s", "5 min", "3.5 h", "2.0 d"."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
