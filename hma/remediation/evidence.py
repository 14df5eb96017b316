"""Evidence before a repair: a bundle of what explains the fault, gathered before the agent
reboots, resets or replaces its node (a reboot clears the GPU's state, a replace wipes the disks).

A bundle is a folder ``<evidence_dir>/<unix time in ms>-<kind>-<node>/`` holding, each bounded
in time (``evidence_timeout`` for the whole bundle) and size (``evidence_piece_bytes`` per piece):

- ``nvidia-bug-report.log.gz``: ``nvidia-bug-report.sh --output-file ...`` where the program
  exists (``evidence_bug_report``);
- ``kernel.log``: the kernel log since boot (``evidence_kernel_log``, ``journalctl -k -b 0``);
- ``node-record.txt``: the node's record in the cluster (``evidence_node_record``, which the
  backend declares: Slurm's ``scontrol -o show node <node>``);
- ``hma.json``: hma's findings, its remediation state and status.json as the agent sees them;
- ``MANIFEST.json``: what each piece is, its command, whether it was cut or failed.

At most ``evidence_keep`` bundles and ``evidence_max_bytes`` in all are kept (the oldest go
first). A disk with less than ``evidence_min_free_bytes`` free, or a write that fails (a full
disk), leaves no bundle: logged, and the repair goes on without one. The bundle's path is
``HMA_EVIDENCE`` in a reboot or replace hook's environment (``hooks``), so that a replace hook
can ship it off the node. ``bundle`` is callable from the controller's side too (``hma
watch``, a node that still answers): ``remote`` is the argv prefix that runs a command on the
node (``ssh NODE``); the kernel log is read through it, and such a bundle has no bug report
(``nvidia-bug-report.sh`` writes its file on the node).
Commands run through the hook runner (``hooks.output_of``: argv, timeout, output cap).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from hma.remediation import hooks

log = logging.getLogger("hma.remediation")

BUG_REPORT = "nvidia-bug-report.log"  # the program adds .gz
_NAME = re.compile(r"\d{13,15}-[a-z_]{1,16}-[A-Za-z0-9_.-]{1,64}")  # milliseconds-kind-node


@dataclass(frozen=True)
class Settings:
    """The ``[recovery] evidence_*`` keys, typed; ``folder`` resolved (``<state_dir>/evidence``
    when ``evidence_dir`` is empty)."""

    enabled: bool
    folder: str
    status_file: str  # status.json, copied into hma.json (bounded); "" none (the controller)
    keep: int
    max_bytes: int
    piece_bytes: int
    min_free_bytes: int
    timeout: float
    bug_report: tuple[str, ...]
    kernel_log: tuple[str, ...]
    node_record: tuple[str, ...]  # the backend's (``evidence_node_record``)

    @classmethod
    def of(cls, section: Mapping[str, Any], agent: Mapping[str, Any]) -> Settings:
        """From the validated ``[recovery]`` and ``[agent]`` (state_dir, run_dir) sections."""
        return cls(
            enabled=bool(section["evidence"]),
            folder=str(section["evidence_dir"] or os.path.join(agent["state_dir"], "evidence")),
            status_file=os.path.join(str(agent["run_dir"]), "status.json"),
            keep=int(section["evidence_keep"]),
            max_bytes=int(section["evidence_max_bytes"]),
            piece_bytes=int(section["evidence_piece_bytes"]),
            min_free_bytes=int(section["evidence_min_free_bytes"]),
            timeout=float(section["evidence_timeout"]),
            bug_report=tuple(str(a) for a in section["evidence_bug_report"] or ()),
            kernel_log=tuple(str(a) for a in section["evidence_kernel_log"] or ()),
            node_record=tuple(str(a) for a in section.get("evidence_node_record") or ()),
        )


def bundle(
    node: str,
    dest: str,
    settings: Settings,
    kind: str = "evidence",
    state: Optional[Mapping[str, Any]] = None,
    remote: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
) -> str:
    """Gather a bundle for ``node`` under the folder ``dest`` (made if missing), then keep at
    most ``keep`` bundles and ``max_bytes`` there; the bundle's path, or "" when none could be
    made (too little free space, a failed write: logged). ``kind``: the repair it precedes;
    ``state``: hma's own findings and status (the agent's); ``remote``: the argv prefix that
    runs the node's commands on it (the controller's side), () on the node itself; ``env``:
    added to the commands' environment (the backend's own)."""
    try:
        os.makedirs(dest, mode=0o700, exist_ok=True)
        free = shutil.disk_usage(dest).free
    except OSError as exc:
        log.warning("no evidence bundle for %s: %s: %s", node, dest, exc.strerror or exc)
        return ""
    if free < settings.min_free_bytes:
        log.warning("no evidence bundle for %s: %d bytes free in %s", node, free, dest)
        return ""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", node)[:64] or "node"
    path = Path(dest) / f"{int(time.time() * 1000)}-{kind[:16]}-{safe}"
    try:
        path.mkdir(mode=0o700)
        _gather(path, node, settings, state, (tuple(remote), dict(env or {})))
    except OSError as exc:
        log.warning("no evidence bundle for %s: %s: %s", node, path, exc.strerror or exc)
        shutil.rmtree(path, ignore_errors=True)
        return ""
    prune(dest, settings, keep=path.name)
    return str(path)


def _gather(
    path: Path,
    node: str,
    settings: Settings,
    state: Optional[Mapping[str, Any]],
    how: tuple[tuple[str, ...], dict[str, str]],
) -> None:
    """Write the pieces (each bounded) and the manifest into ``path``; OSError on a failed
    write. ``how``: the remote prefix and the environment of the commands. The commands share
    ``timeout``: the quick ones (the node's record, the kernel log) first, then the bug report
    with what is left, so a slow bug report never starves them and the repair waits at most
    ``timeout``."""
    remote, env = how
    deadline = time.monotonic() + settings.timeout
    manifest: dict[str, Any] = {"node": node, "time": time.time(), "pieces": {}}
    pieces = manifest["pieces"]
    for name, argv in (
        ("node-record.txt", [*settings.node_record, node] if settings.node_record else []),
        ("kernel.log", [*remote, *settings.kernel_log] if settings.kernel_log else []),
    ):
        if not argv:
            continue
        text, why = _run(argv, deadline, settings, env)
        (path / name).write_text(text, encoding="utf-8")
        pieces[name] = {"argv": argv, "error": why}
    if settings.bug_report and not remote and shutil.which(settings.bug_report[0]):
        out = path / BUG_REPORT
        argv = [*remote, *settings.bug_report, "--output-file", str(out)]
        _, why = _run(argv, deadline, settings, env)
        got = [p for p in path.iterdir() if p.name.startswith(BUG_REPORT)]
        for piece in got:
            if piece.stat().st_size > settings.piece_bytes:
                piece.unlink()
                why = why or f"larger than {settings.piece_bytes} bytes: removed"
        pieces[BUG_REPORT + ".gz"] = {"argv": argv, "error": why}
    if state is not None:
        doc = dict(state)
        if settings.status_file:
            doc["status_json"] = _status(settings.status_file, settings.piece_bytes)
        (path / "hma.json").write_text(json.dumps(doc, indent=1, default=str), "utf-8")
        pieces["hma.json"] = {"error": ""}
    (path / "MANIFEST.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def _run(
    argv: list[str], deadline: float, settings: Settings, env: Mapping[str, str]
) -> tuple[str, str]:
    """(output, why not whole) of one command of the bundle, within what is left of its
    ``timeout`` (nothing run when none is left)."""
    left = deadline - time.monotonic()
    if left < 0.05:
        return "", f"not run: the bundle's {settings.timeout:g} s were spent"
    return hooks.output_of(argv, left, settings.piece_bytes, env)


def _status(path: str, limit: int) -> Any:
    """status.json as the agent last wrote it (what ``hma status`` shows); why not, as text."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if len(data) > limit:
        return f"larger than {limit} bytes"
    try:
        return json.loads(data)
    except ValueError:
        return "not JSON"


def prune(dest: str, settings: Settings, keep: str = "") -> list[str]:
    """Remove the oldest bundles in ``dest`` beyond ``keep`` bundles and ``max_bytes`` in all
    (never the bundle named ``keep``); the names removed."""
    try:
        names = sorted(n for n in os.listdir(dest) if _NAME.fullmatch(n))
    except OSError:
        return []
    sizes = {n: _size(os.path.join(dest, n)) for n in names}
    removed = []
    while names and (
        len(names) > settings.keep or sum(sizes[n] for n in names) > settings.max_bytes
    ):
        oldest = next((n for n in names if n != keep), None)
        if oldest is None:
            break
        shutil.rmtree(os.path.join(dest, oldest), ignore_errors=True)
        names.remove(oldest)
        removed.append(oldest)
    return removed


def _size(folder: str) -> int:
    """Bytes of the files in a bundle (symlinks are not followed)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total
