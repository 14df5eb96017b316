"""``hma healthcheck`` (and ``hma-healthcheck``): Slurm's ``HealthCheckProgram`` (docs/slurm.md).

slurmd runs it every ``HealthCheckInterval`` with only ``SLURMD_NODENAME`` in the environment,
ignores its exit code and kills it after 60 s, so it sets PATH and SLURM_CONF from the
configuration itself, makes the node's drain state match the verdict per policy, and bounds its
own run time (``[healthcheck]``).

- When the daemon runs (fresh ``status.json`` whose pid is alive), the daemon's verdict is the
  answer: it is read before anything else is loaded (as fast as ``hma status``), printed, and
  returned. The daemon itself remediates (its outbox).
- Otherwise it runs the probes once, feeds them through the health model kept in the state
  database (so hysteresis holds across runs) the way the daemon does (hma.health.pipeline: a new
  boot, a reset database, history and alerts) and applies the remediation decisions at once:
  labels, drains and resumes, with the same ownership rules, breaker and outbox as the daemon.
  Probes in ``[healthcheck] skip`` are not run (reported unknown, not run); every other probe's
  timeout is cut to ``probe_timeout``; after ``timeout`` seconds the process stops with exit 3
  (the outbox finishes unfinished actions on the next run, exactly once in effect).

A configuration that does not load is a check that cannot check: besides exit 3 and its
errors on stderr (both of which slurmd throws away), the node is labelled blind in its label
field and a journal entry sent (drained too with ``[healthcheck] on_error = "drain"``):
hma.remediation.blind.

Exit code: the node's worst severity (0..3), like ``hma check``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Mapping, Optional

from hma.adapters.text import printable
from hma.commands import common
from hma.config import files
from hma.config.files import ConfigError
from hma.contracts.severity import Severity
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
    raw, _files, errors = files.read_raw(files.config_path(config_file))
    answer = _from_daemon(raw, errors, quiet)
    if answer is not None:
        return answer
    from hma import assembly

    try:
        setup = assembly.load(config_file, only=_wanted(raw), remediates=True)
    except ConfigError as exc:
        for line in exc.errors:
            print(f"hma healthcheck: {line}", file=sys.stderr)
        _blind(config_file, exc.errors)
        return int(Severity.UNKNOWN)
    _prepare_environment(setup.config.section("slurm"))
    return _standalone(setup, time.time(), quiet)


def _blind(config_file: Optional[str], errors: list[str]) -> None:
    """The health check cannot check: say so where the controller and journald see it (the
    node's label, a journal entry; a drain with ``[healthcheck] on_error = "drain"``), from
    what can be read of the configuration (hma.remediation.blind)."""
    from hma import assembly
    from hma.remediation import blind

    readable = assembly.salvaged(config_file)
    _prepare_environment(readable.sections.get("slurm", {}))
    guard = _guard(float(readable.section("healthcheck")["timeout"]))
    for line in blind.report(readable, errors, "hma healthcheck", time.time()):
        print(line, file=sys.stderr)
    guard.cancel()


def _wanted(raw: Mapping[str, Any]) -> list[str]:
    """The probes to load: every installed and executable one the configuration ``raw`` does
    not disable (``enabled = false``); the others are neither imported nor checked (``hma config
    check`` does that)."""
    from hma.detection import registry

    probes_dir = files.agent_path(raw, "probes_dir")[0]
    names = {*registry.entry_point_names(), *registry.exec_probes(probes_dir)}
    tables = raw.get("probes")
    tables = tables if isinstance(tables, dict) else {}
    off = {n for n, t in tables.items() if isinstance(t, dict) and t.get("enabled") is False}
    return sorted(names - off)


def _from_daemon(raw: Mapping[str, Any], errors: list[str], quiet: bool) -> Optional[int]:
    """The running daemon's answer (printed), read with nothing but the configuration files
    (``raw``, read with ``errors``) and status.json; None when no daemon answers (or the files
    cannot be read: the full load reports why)."""
    run_dir, problems = files.agent_path(raw, "run_dir", errors)
    if problems:
        return None
    doc = daemon_status(run_dir, time.time(), common.boot_id_in(raw))
    if doc is None:
        return None
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


def _give_up(seconds: float) -> None:
    """Past ``[healthcheck] timeout``: say so and leave at once, exit 3 (slurmd would kill the
    whole run at 60 s without a word). The outbox makes an action cut here happen exactly once
    in effect on the next run."""
    print(
        f"hma healthcheck: stopped after {seconds:g} s ([healthcheck] timeout; slurmd kills "
        "HealthCheckProgram at 60 s); unfinished actions stay in the outbox",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(int(Severity.UNKNOWN))


def _guard(limit: float) -> threading.Timer:
    """The started timer that gives up after ``limit`` seconds (``_give_up``); cancel it."""
    guard = threading.Timer(limit, _give_up, args=(limit,))
    guard.daemon = True
    guard.start()
    return guard


def bound_probes(setup: Any) -> list[str]:
    """Apply ``[healthcheck]`` to the loaded setup: the enabled probes to run (those in ``skip``
    left out) with every timeout cut to ``probe_timeout``, and each option that must stay below
    the timeout (a command's own timeout) cut to 80% of it."""
    limits: Mapping[str, Any] = setup.config.section("healthcheck")
    cap = float(limits["probe_timeout"])
    names = [n for n in setup.enabled() if n not in set(limits["skip"])]
    for name in names:
        opts = setup.config.probe(name)
        if float(opts["timeout"]) <= cap:
            continue
        opts["timeout"] = cap
        for key, opt in setup.probes[name].options.items():
            if opt.below == "timeout" and isinstance(opts.get(key), (int, float)):
                opts[key] = min(float(opts[key]), 0.8 * cap)
    return names


def _not_run(setup: Any, names: list[str]) -> list[str]:
    """The enabled probes left out of ``names`` that would apply to this node (one that says it
    does not apply, or cannot say, is not worth a line)."""
    out = []
    for name in setup.enabled():
        if name in names:
            continue
        try:
            if setup.probes[name].applies(setup.context(name, oneshot=True)) is None:
                out.append(name)
        except Exception:  # noqa: BLE001 - a probe's own check failing only hides its line
            continue
    return out


def _standalone(setup: Any, now: float, quiet: bool) -> int:
    """No daemon: probes once, health model from the state database, remediation applied; a
    state store that cannot be used is one line and exit 3 (unknown)."""
    from hma.commands import common

    limit = float(setup.config.section("healthcheck")["timeout"])
    deadline = time.monotonic() + limit
    guard = _guard(limit)
    try:
        return common.with_store(
            setup,
            "hma healthcheck",
            lambda store: _checked(setup, store, now, quiet, deadline),
            failed=int(Severity.UNKNOWN),
        )
    finally:
        guard.cancel()


def _checked(setup: Any, store: Any, now: float, quiet: bool, deadline: float) -> int:
    """The check itself on the opened store: exit code the worst severity."""
    from hma.detection.runner import run_once
    from hma.health.pipeline import command_pipeline
    from hma.remediation.engine import Remediator

    names = bound_probes(setup)
    skipped = _not_run(setup, names)
    pipeline = command_pipeline(setup, store, "hma healthcheck")
    boot_id = pipeline.model.boot_id
    pipeline.start(now)
    for probe_run in run_once(setup, names, boot_id=boot_id):
        pipeline.observe_run(probe_run, now)
    verdict = pipeline.model.verdict(now)
    node = os.environ.get("SLURMD_NODENAME") or None
    rem = Remediator(setup, store, start=False, node_name=node)
    try:
        rem.refresh()
        rem.update(verdict, boot_id)
        left = deadline - time.monotonic() - 2.0
        rem.flush(timeout=max(0.0, min(float(setup.config.section("slurm")["timeout"]) * 3, left)))
        status = rem.status()
    finally:
        rem.close()
    if not quiet:
        faults = ", ".join(f"{f.code} {f.component}" for f in verdict.faults) or "no active fault"
        print(
            printable(
                f"{status.get('node') or setup.node_name}: {str(verdict.severity).upper()}: "
                f"{faults}; slurm {status.get('state')}"
                + (f"; held: {status['held']}" if status.get("held") else "")
                + (f"; not run (unknown): {', '.join(skipped)}" if skipped else "")
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
