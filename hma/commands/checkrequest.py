"""``hma check --request [--wait S]``: ask the running agent for a check of every probe now.

It adds an empty file to the agent's request folder (hma.daemon.checkreq: the channel carries no
data, so a user can ask for a check, never for a verdict), then waits until status.json shows a
requested run that started after the request and has finished, prints its verdict and the
node's active faults, and exits by the verdict (docs/cli.md).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Mapping, Optional

from hma.adapters.text import printable
from hma.config import files
from hma.contracts.severity import Severity
from hma.reporters import statusfile

WAIT_S = 180.0  # the default --wait: the agent's rate limit (60 s) and a run of every probe
POLL_S = 0.5
PROG = "hma check --request"


def folder(config: Optional[str]) -> tuple[str, str, Optional[str]]:
    """The agent's run folder, request folder and boot id (``[paths] procfs``'s), from the
    configuration (defaults when it cannot be read)."""
    from hma.commands import common

    raw, _files, _errors = files.read_raw(files.config_path(config))
    run_dir = files.agent_path(raw, "run_dir")[0]
    agent = raw.get("agent")
    path = agent.get("check_requests") if isinstance(agent, dict) else None
    if not isinstance(path, str) or not path.startswith("/"):
        path = os.path.join(run_dir, "check-requests")
    return run_dir, path, common.boot_id_in(raw)


def touch(path: str) -> float:
    """Add a new empty request file to the folder ``path``; its mtime. Raises ``OSError``."""
    name = f"{os.getuid()}.{os.getpid()}.{time.time_ns()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    # O_PATH: the folder (mode 1733) is not readable by users, only searchable
    dir_fd = os.open(path, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)


def answer(doc: Mapping[str, Any], asked: float) -> Optional[Mapping[str, Any]]:
    """status.json's ``requested`` block when it is a finished run that answers a request made
    at ``asked``; None otherwise."""
    block = doc.get("requested")
    if not isinstance(block, dict):
        return None
    at, done = block.get("at"), block.get("done")
    if not isinstance(at, (int, float)) or not isinstance(done, (int, float)):
        return None
    return block if at >= asked else None


def render(doc: Mapping[str, Any], block: Mapping[str, Any]) -> str:
    """The verdict line and the node's active faults (text others wrote escaped)."""
    took = float(block["done"]) - float(block["at"])
    lines = [
        f"{printable(str(doc.get('node', '?')))}: {printable(str(block.get('verdict'))).upper()}"
        f" (requested check, every probe run, {took:.1f} s)"
    ]
    for fault in doc.get("faults") or []:
        if isinstance(fault, dict):
            lines.append(
                f"  [{printable(str(fault.get('severity')))}] {printable(str(fault.get('code')))}"
                f" {printable(str(fault.get('component')))}: {printable(str(fault.get('message')))}"
            )
    return "\n".join(lines)


def exit_code(verdict: Any) -> int:
    """0 ok, 1 warning, 2 critical, 3 unknown (as ``hma check``)."""
    try:
        return int(Severity.parse(str(verdict)))
    except ValueError:
        return int(Severity.UNKNOWN)


def main(config: Optional[str], wait: float) -> int:
    """Request a check and wait up to ``wait`` seconds for its verdict; the exit code."""
    run_dir, path, boot = folder(config)
    try:
        asked = touch(path)
    except OSError as exc:
        why = exc.strerror or str(exc)
        print(
            f"{PROG}: no agent to ask: cannot add a request to {printable(path)} ({why}); is "
            "hma running? (systemctl status hma)",
            file=sys.stderr,
        )
        return int(Severity.UNKNOWN)
    deadline = time.monotonic() + wait
    problem = ""
    while True:
        doc, problem = statusfile.read(run_dir, boot_id=boot)
        block = answer(doc, asked) if doc is not None and not problem else None
        if doc is not None and block is not None:
            print(render(doc, block))
            return exit_code(block.get("verdict"))
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    why = f" ({printable(problem)})" if problem else ""
    print(
        f"{PROG}: no answer from the agent within {wait:g} s{why}: the check was requested; "
        "`hma status` shows its result later",
        file=sys.stderr,
    )
    return int(Severity.UNKNOWN)
