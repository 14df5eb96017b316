"""``hma genconf``: record what this node has now as a drop-in (LBNL NHC's ``nhc-genconf``).

Every enabled probe runs once (as under ``hma check``); each completed run's snapshot goes
through its probe's ``expectations`` (the GPU count, model and PCIe width, the InfiniBand ports
and rate, the EFA adapters, memory, online CPUs, mounted file systems), into the options the
probes already judge. A ``[match]`` on the DMI product name (else the hardware on the PCI bus)
keeps the file to nodes of this class. Values the schema refuses (a mount point with a newline)
are left out and named. The file is written through ``tomlcompat.dumps`` (read back before it is
written), atomically, 0644, never through a symbolic link, and never over a file without
``--force``. docs/cli.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from hma.adapters import tomlcompat
from hma.adapters.text import printable
from hma.assembly import load
from hma.commands.common import EX_CANTCREAT, config_failed
from hma.config import match
from hma.config.files import ConfigError, config_path
from hma.config.schema import EX_CONFIG
from hma.contracts.model import RunStatus, Severity
from hma.contracts.options import Option
from hma.detection.runner import run_once
from hma.detection.setup import Setup

NAME = "50-genconf.toml"


def default_output(config: Optional[str]) -> Path:
    """``hma.d/50-genconf.toml`` next to the main file (/etc/hma/hma.d/50-genconf.toml)."""
    return config_path(config).parent / "hma.d" / NAME


def record(setup: Setup) -> tuple[dict[str, Any], list[str]]:
    """The drop-in's data (``[match]`` and ``[probes.NAME]`` tables) and notes for stderr: the
    probes that did not complete, values left out."""
    notes: list[str] = []
    runs = run_once(setup, [n for n in setup.enabled() if n not in setup.exec_names])
    probes: dict[str, Any] = {}
    for run in runs:
        if run.status is RunStatus.UNSUPPORTED:
            continue  # nothing of it on this node: nothing to hold it to
        if not run.completed:
            why = f" ({printable(run.error)})" if run.error else ""
            notes.append(f"{run.probe}: {run.status}{why}, nothing recorded")
            continue
        probe = setup.probes[run.probe]
        values = _valid(run.probe, probe.expectations(run.snapshot), probe.options, notes)
        if values:
            probes[run.probe] = values
        if any(f.severity is Severity.CRITICAL for f in run.findings):
            notes.append(f"{run.probe}: reports a critical finding now; recorded as it is")
    data: dict[str, Any] = {}
    table = match_table(setup.config.section("paths")["sysfs"], notes)
    if table:
        data["match"] = table
    if probes:
        data["probes"] = probes
    return data, notes


def match_table(sysfs: str, notes: list[str]) -> dict[str, Any]:
    """``product = [DMI product name]``, else the hardware kinds present and absent."""
    product = match.read_product(sysfs)
    if product is not None and not match.problems({"product": [product]}):
        return {"product": [product]}
    try:
        present = match.read_hardware(sysfs)
    except OSError as exc:
        notes.append(f"no [match]: neither the DMI product name nor the PCI bus reads ({exc})")
        return {}
    return {"hardware": [k if k in present else f"!{k}" for k in match.HARDWARE]}


def _valid(
    probe: str, values: Mapping[str, Any], options: Mapping[str, Option], notes: list[str]
) -> dict[str, Any]:
    """``values`` as the schema takes them: an item of a list the option refuses is left out,
    another value too; each named in ``notes``."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        option = options[key]
        if isinstance(value, list):
            kept = [v for v in value if option.validate([v]) is None]
            for bad in (v for v in value if v not in kept):
                notes.append(
                    f"{probe}.{key}: left out {printable(repr(bad))}: unfit for the option"
                )
            value = kept
        problem = option.validate(value)
        if problem is not None:
            notes.append(f"{probe}.{key}: left out: {printable(problem)}")
            continue
        out[key] = value
    return out


def write(path: Path, text: str, force: bool) -> Optional[str]:
    """Write ``text`` to ``path`` atomically (a temporary file in its folder, then a link or a
    rename), 0644; None, or why not: ``path`` is a symbolic link, or exists without ``force``."""
    try:
        if path.is_symlink():
            return f"{path} is a symbolic link; not written through it"
        if path.exists() and not force:
            return f"{path} exists; --force replaces it"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fchmod(fh.fileno(), 0o644)
                os.fsync(fh.fileno())
            if force:
                os.replace(tmp, path)  # replaces a file (a link in its place meanwhile too)
            else:
                try:
                    os.link(tmp, path)  # fails if the file appeared meanwhile
                except FileExistsError:
                    return f"{path} exists; --force replaces it"
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None


def main(config: Optional[str], output: Optional[str], force: bool) -> int:
    """``hma genconf [--output PATH|-] [--force]``: 0 written, 73 not written, 78 invalid
    configuration. Raises nothing on bad input."""
    try:
        setup = load(config)
    except ConfigError as exc:
        return config_failed(exc, EX_CONFIG)
    data, notes = record(setup)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    header = (
        f"Written by `hma genconf` on {printable(setup.node_name)} at {stamp}: what this node\n"
        "had then. Every later deviation is judged against it; `hma genconf --force` records\n"
        "the node again (docs/nhc.md)."
    )
    text = tomlcompat.dumps(data, header)
    for note in notes:
        print(f"hma genconf: {note}", file=sys.stderr)
    if output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(output) if output else default_output(config)
    problem = write(path, text, force)
    if problem is not None:
        print(f"hma genconf: {printable(problem)}", file=sys.stderr)
        return EX_CANTCREAT
    print(f"wrote {printable(str(path))}")
    return 0
