"""``hma watch``: the controller's watcher (docs/watch.md). ``--once``: one pass (cron, tests),
``--json`` its document; without: the service, a pass every ``[watch] interval`` until SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from dataclasses import replace
from typing import Any

from hma.adapters import logs
from hma.adapters.text import printable
from hma.cluster.slurm.backend import SlurmBackend
from hma.commands import common
from hma.config.files import ConfigError
from hma.detection.setup import Setup
from hma.remediation import evidence
from hma.remediation.options import Recovery
from hma.reporters import start_reporters
from hma.watch import decide
from hma.watch.loop import Watcher
from hma.watch.options import Watch

EX_CONFIG = 2
EX_SLURM = 3


def build(setup: Setup) -> Watcher:
    """The watcher of the configuration (``ConfigError`` when the backend is not Slurm)."""
    backend = common.scheduler(setup)
    if not isinstance(backend, SlurmBackend):
        name = setup.config.section("cluster")["backend"]
        raise ConfigError([f"cluster.backend: {name!r} is not Slurm: hma watch needs Slurm"])
    section = setup.config.section("recovery")
    rec = Recovery.of(section)
    limits = decide.Limits(
        rec.label_field,
        rec.max_drained_percent,
        rec.max_drained_nodes,
        rec.max_remediations,
        rec.remediation_window,
    )
    reporters = start_reporters(setup.config.reporters, logging.getLogger("hma.watch").error)
    cfg = Watch.of(setup.config.section("watch"))
    bundles = evidence.Settings.of(section, {"state_dir": cfg.state_dir, "run_dir": ""})
    on = bundles.enabled and not rec.dry_run
    return Watcher(
        cfg,
        rec,
        limits,
        backend,
        reporters,
        evidence=replace(bundles, status_file="") if on else None,
    )


def main(setup: Setup, once: bool, as_json: bool) -> int:
    """``hma watch [--once [--json]]``; exit 0, 2 (invalid configuration), 3 (``--once``: Slurm
    could not be read), 73 (the state folder cannot be written), 77 (not root)."""
    if common.needs_root("hma watch"):
        return common.EX_NOPERM
    logs.configure(str(setup.config.section("agent")["log_level"]))
    try:
        watcher = build(setup)
    except ConfigError as exc:
        return common.config_failed(exc, EX_CONFIG, "watch" if as_json else "")
    try:
        if once:
            return _once(watcher, as_json)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        watcher.run(stop)
    except OSError as exc:
        print(f"hma watch: state not written: {printable(str(exc))}", file=sys.stderr)
        return common.EX_CANTCREAT
    return 0


def _once(watcher: Watcher, as_json: bool) -> int:
    doc: dict[str, Any] = watcher.once()
    if as_json:
        common.dump(doc)
    else:
        for item in doc.get("decisions", []):
            held = f" (held: {item['held']})" if item.get("held") else ""
            print(f"{printable(item['node'])}: {item['kind']} {item['code']}{held}: {item['why']}")
    if doc.get("error"):
        print(f"hma watch: {printable(str(doc['error']))}", file=sys.stderr)
        return EX_SLURM
    return 0
