"""``hma healthcheck`` (and ``hma-healthcheck``): Slurm's ``HealthCheckProgram``.

slurmd runs it every ``HealthCheckInterval`` with only ``SLURMD_NODENAME`` in the environment and
ignores its exit code, so it sets PATH and SLURM_CONF from the configuration itself and makes the
node's drain state match the verdict per policy.

- When the daemon runs (fresh ``status.json`` whose pid is alive), the daemon's verdict is the
  answer: it prints it and returns within a second. The daemon itself remediates (its outbox).
- Otherwise it runs the probes once, feeds them through the health model kept in the state
  database (so hysteresis holds across runs) the way the daemon does (hma.health.pipeline: a new
  boot, a reset database, history and alerts) and applies the remediation decisions at once:
  labels, drains and resumes, with the same ownership rules, breaker and outbox as the daemon.

Exit code: the node's worst severity (0..3), like ``hma check``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

from hma.adapters.text import printable
from hma.config.files import ConfigError
from hma.contracts.model import Severity
from hma.reporters import statusfile


def daemon_status(
    run_dir: str, now: float, boot_id: Optional[str] = None
) -> Optional[dict[str, Any]]:
    """The daemon's status document when it is running and fresh (``hma status`` would trust it:
    hma.reporters.statusfile.read), else None."""
    doc, problem = statusfile.read(run_dir, now=now, boot_id=boot_id)
    return None if problem else doc


def _prepare_environment(slurm: dict[str, Any]) -> None:
    """HealthCheckProgram runs with no PATH and no SLURM_CONF: take both from the config."""
    if not os.environ.get("PATH") and slurm.get("path"):
        os.environ["PATH"] = str(slurm["path"])
    if slurm.get("conf") and not os.environ.get("SLURM_CONF"):
        os.environ["SLURM_CONF"] = str(slurm["conf"])


def run(config_file: Optional[str] = None, quiet: bool = False) -> int:
    """Do one health check; returns the exit code."""
    from hma import assembly

    try:
        setup = assembly.load(config_file)
    except ConfigError as exc:
        for line in exc.errors:
            print(f"hma healthcheck: {line}", file=sys.stderr)
        return int(Severity.UNKNOWN)
    _prepare_environment(setup.config.section("slurm"))
    now = time.time()
    procfs = setup.config.section("paths")["procfs"]
    doc = daemon_status(setup.config.section("agent")["run_dir"], now, statusfile.boot_id(procfs))
    if doc is not None:
        severity = str(doc.get("severity", "unknown"))
        faults = [f for f in doc.get("faults", []) if f.get("active")]
        held = (doc.get("remediation") or {}).get("held")
        if not quiet:
            what = ", ".join(f"{f['code']} {f['component']}" for f in faults) or "no active fault"
            print(
                printable(
                    f"{doc.get('node')}: {severity.upper()} (daemon pid {doc.get('pid')}): {what}"
                    + (f"; held: {held}" if held else "")
                )
            )
        try:
            return int(Severity.parse(severity))
        except ValueError:
            return int(Severity.UNKNOWN)
    return _standalone(setup, now, quiet)


def _standalone(setup: Any, now: float, quiet: bool) -> int:
    """No daemon: probes once, health model from the state database, remediation applied."""
    from hma.detection.runner import run_once
    from hma.health.pipeline import command_pipeline, open_store
    from hma.remediation.engine import Remediator

    store = open_store(setup)
    try:
        pipeline = command_pipeline(setup, store, "hma healthcheck")
        boot_id = pipeline.model.boot_id
        pipeline.start(now)
        for probe_run in run_once(setup, setup.enabled(), boot_id=boot_id):
            pipeline.observe_run(probe_run, now)
        verdict = pipeline.model.verdict(now)
        node = os.environ.get("SLURMD_NODENAME") or None
        rem = Remediator(setup, store, start=False, node_name=node)
        try:
            rem.refresh()
            rem.update(verdict, boot_id)
            rem.flush(timeout=float(setup.config.section("slurm")["timeout"]) * 3)
            status = rem.status()
        finally:
            rem.close()
    finally:
        store.close()
    if not quiet:
        faults = ", ".join(f"{f.code} {f.component}" for f in verdict.faults) or "no active fault"
        print(
            printable(
                f"{status.get('node') or setup.node_name}: {str(verdict.severity).upper()}: "
                f"{faults}; slurm {status.get('state')}"
                + (f"; held: {status['held']}" if status.get("held") else "")
            )
        )
    return int(verdict.severity)


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``hma-healthcheck`` (slurm.conf ``HealthCheckProgram`` takes no arguments;
    the configuration file comes from ``$HMA_CONFIG`` or /etc/hma/hma.toml)."""
    args = list(sys.argv[1:] if argv is None else argv)
    config_file = args[1] if len(args) >= 2 and args[0] == "--config" else None
    return run(config_file)


if __name__ == "__main__":
    sys.exit(main())
