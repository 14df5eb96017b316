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

  The run writes what it decided (verdict, findings, actions) to status.json, marked
  ``writer`` "healthcheck", for ``hma status`` (never over a running daemon's document).

A configuration that does not load is a check that cannot check: besides exit 3 and its
errors on stderr (both of which slurmd throws away), the node is labelled blind in its label
field and a journal entry sent (drained too with ``[healthcheck] on_error = "drain"``):
hma.remediation.blind.

NHC's habits: ``-d`` (debug lines on stderr; ``[healthcheck] debug`` for slurmd's runs, which
take no arguments), ``-t SECONDS`` (overrides ``[healthcheck] timeout``), and the run log
(hma.reporters.runlog) that keeps what each run printed.

Exit code: the node's worst severity (0..3), like ``hma check``; 3 also for a bad ``-t``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional

from hma.adapters.text import printable
from hma.commands import common
from hma.config import files
from hma.config.files import ConfigError
from hma.contracts.severity import Severity
from hma.reporters import runlog, statusfile

if TYPE_CHECKING:
    from hma.detection.setup import Setup
    from hma.health.pipeline import Pipeline


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


def run(
    config_file: Optional[str] = None,
    quiet: bool = False,
    debug: bool = False,
    timeout: Optional[str] = None,
) -> int:
    """Do one health check; returns the exit code. ``debug``: debug lines on stderr (``-d``);
    ``timeout``: seconds overriding ``[healthcheck] timeout`` (``-t``). What the run prints
    goes to its run log too (``[healthcheck] log``)."""
    started = time.time()
    raw, _files, errors = files.read_raw(files.config_path(config_file))
    log = runlog.RunLog(_log_folder(raw), started)
    with log.capture():
        if debug:
            from hma.adapters import logs

            logs.configure("debug")
        code = _run(config_file, raw, errors, quiet, timeout, log)
    log.close(code)
    return code


def _run(
    config_file: Optional[str],
    raw: Mapping[str, Any],
    errors: list[str],
    quiet: bool,
    timeout: Optional[str],
    log: runlog.RunLog,
) -> int:
    limit = _timeout(timeout)
    if isinstance(limit, str):
        print(f"hma healthcheck: -t: {printable(limit)}", file=sys.stderr)
        return int(Severity.UNKNOWN)
    answer = _from_daemon(raw, errors, quiet, log)
    if answer is not None:
        return answer
    from hma import assembly

    try:
        setup = assembly.load(config_file, only=_wanted(raw), remediates=True)
    except ConfigError as exc:
        for line in exc.errors:
            print(f"hma healthcheck: {line}", file=sys.stderr)
        _blind(config_file, exc.errors, limit, log)
        return int(Severity.UNKNOWN)
    if setup.config.section("healthcheck")["debug"]:
        from hma.adapters import logs

        logs.configure("debug")
    _override_timeout(setup, limit)
    _prepare_environment(setup.config.section("slurm"))
    return _standalone(setup, time.time(), quiet, log)


def _log_folder(raw: Mapping[str, Any]) -> Optional[str]:
    """The run log's folder, the state folder (None: ``[healthcheck] log = false``), read
    before validation like the other early paths: a value that is not a bool keeps the log."""
    table = raw.get("healthcheck")
    if isinstance(table, dict) and table.get("log") is False:
        return None
    return files.agent_path(raw, "state_dir")[0]


def _timeout(text: Optional[str]) -> Any:
    """``-t``'s seconds (None when not given), or the problem with it as a string; the same
    bounds as ``[healthcheck] timeout``."""
    if text is None:
        return None
    from hma.config.schema import CORE_SECTIONS
    from hma.contracts.options import parse_duration

    try:  # seconds, or a duration with a unit ("20s"); never nan, inf or an exponent
        seconds = parse_duration(text if text[-1:].isalpha() else f"{text}s")
    except ValueError:
        return f"expected seconds (a number), got {text!r}"
    return CORE_SECTIONS["healthcheck"]["timeout"].validate(seconds) or seconds


def _override_timeout(setup: Setup, limit: Optional[float]) -> None:
    """``-t``: the run's timeout, and ``probe_timeout`` cut to 80% of it when not below it."""
    if limit is None:
        return
    limits = setup.config.section("healthcheck")
    limits["timeout"] = limit
    if float(limits["probe_timeout"]) >= limit:
        limits["probe_timeout"] = 0.8 * limit


def _say(text: str, quiet: bool, log: runlog.RunLog) -> None:
    """The run's answer, escaped: printed (``--quiet``: only in the run log)."""
    if quiet:
        log.add(text)
    else:
        print(printable(text))


def _blind(
    config_file: Optional[str], errors: list[str], limit: Optional[float], log: runlog.RunLog
) -> None:
    """The health check cannot check: say so where the controller, journald and ``hma
    status`` see it (the node's label, a journal entry, status.json; a drain with
    ``[healthcheck] on_error = "drain"``), from what can be read of the configuration
    (hma.remediation.blind)."""
    from hma import assembly
    from hma.remediation import blind

    readable = assembly.salvaged(config_file)
    _prepare_environment(readable.sections.get("slurm", {}))
    guard = _guard(limit or float(readable.section("healthcheck")["timeout"]), log)
    for line in blind.report(readable, errors, "hma healthcheck", time.time()):
        print(line, file=sys.stderr)
    _blind_status(readable, errors, log.started)
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


def _from_daemon(
    raw: Mapping[str, Any], errors: list[str], quiet: bool, log: runlog.RunLog
) -> Optional[int]:
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
    what = ", ".join(f"{f['code']} {f['component']}" for f in faults) or "no active fault"
    _say(
        f"{doc.get('node')}: {severity.upper()} (daemon pid {doc.get('pid')}): {what}"
        + (f"; held: {held}" if held else ""),
        quiet,
        log,
    )
    try:
        return int(Severity.parse(severity))
    except ValueError:
        return int(Severity.UNKNOWN)


def _give_up(seconds: float, log: runlog.RunLog) -> None:
    """Past ``[healthcheck] timeout``: say so (and in the run log) and leave at once, exit 3
    (slurmd would kill the whole run at 60 s without a word). The outbox makes an action cut
    here happen exactly once in effect on the next run."""
    print(
        f"hma healthcheck: stopped after {seconds:g} s ([healthcheck] timeout, -t; slurmd kills "
        "HealthCheckProgram at 60 s); unfinished actions stay in the outbox",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    log.close(int(Severity.UNKNOWN))
    os._exit(int(Severity.UNKNOWN))


def _guard(limit: float, log: runlog.RunLog) -> threading.Timer:
    """The started timer that gives up after ``limit`` seconds (``_give_up``); cancel it."""
    guard = threading.Timer(limit, _give_up, args=(limit, log))
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


def _standalone(setup: Setup, now: float, quiet: bool, log: runlog.RunLog) -> int:
    """No daemon: probes once, health model from the state database, remediation applied; a
    state store that cannot be used is one line and exit 3 (unknown)."""
    from hma.commands import common

    limit = float(setup.config.section("healthcheck")["timeout"])
    deadline = time.monotonic() + limit
    guard = _guard(limit, log)
    try:
        return common.with_store(
            setup,
            "hma healthcheck",
            lambda store: _checked(setup, store, now, quiet, deadline, log),
            failed=int(Severity.UNKNOWN),
        )
    finally:
        guard.cancel()


def _checked(
    setup: Setup, store: Any, now: float, quiet: bool, deadline: float, log: runlog.RunLog
) -> int:
    """The check itself on the opened store: exit code the worst severity."""
    from hma.detection.runner import run_once
    from hma.health.pipeline import command_pipeline
    from hma.remediation.engine import Remediator

    names = bound_probes(setup)
    skipped = _not_run(setup, names)
    pipeline = command_pipeline(setup, store, "hma healthcheck")
    boot_id = pipeline.model.boot_id
    pipeline.start(now)
    runs = run_once(setup, names, boot_id=boot_id)
    for probe_run in runs:
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
    faults = ", ".join(f"{f.code} {f.component}" for f in verdict.faults) or "no active fault"
    _say(
        f"{status.get('node') or setup.node_name}: {str(verdict.severity).upper()}: "
        f"{faults}; slurm {status.get('state')}"
        + (f"; held: {status['held']}" if status.get("held") else "")
        + (f"; not run (unknown): {', '.join(skipped)}" if skipped else ""),
        quiet,
        log,
    )
    _write_status(setup, pipeline, runs, status, now)
    return int(verdict.severity)


def _write_status(
    setup: Setup, pipeline: Pipeline, runs: list[Any], remediation: Mapping[str, Any], now: float
) -> None:
    """What this run decided, as status.json for ``hma status`` (``_publish``)."""
    from hma.health import maintenance_mode
    from hma.health.model import listed
    from hma.reporters import status

    interval = float(setup.config.section("healthcheck")["interval"])
    window = maintenance_mode.load(pipeline.store)
    verdict = pipeline.model.verdict(time.time())
    _publish(
        setup,
        status.Snapshot(
            node=str(remediation.get("node") or setup.node_name),
            boot_id=pipeline.boot_id,
            started=now,
            generated=time.time(),
            severity=str(verdict.severity),
            action=str(verdict.action),
            active=len(verdict.faults),
            instance_type=setup.instance_type(),
            topology=_topology(setup),
            probes=tuple(status.ProbeStatus(r.probe, r, now + interval, None) for r in runs),
            faults=tuple(f.to_json() for f in listed(pipeline.model)),
            remediation=remediation,
            maintenance=window.to_json(now) if window is not None else None,
        ),
    )


def _blind_status(config: Any, errors: list[str], started: float) -> None:
    """A run that cannot check says so in status.json too (``_publish``): severity unknown and
    the fault ``HMA_CONFIG_INVALID`` with the errors, so ``hma status`` never shows an earlier
    run's verdict as this one's; ``config``: what could be read of the configuration."""
    from hma.contracts.catalogue import load_builtin
    from hma.detection.setup import Setup
    from hma.health.model import Fault
    from hma.remediation import blind
    from hma.reporters import status

    setup = Setup(config=config, catalogue=load_builtin(), probes={})
    entry = setup.catalogue.entry(blind.CODE)
    now = time.time()
    fault = Fault(
        blind.CODE,
        blind.COMPONENT,
        entry.severity,
        entry.action,
        f"invalid configuration: {errors[0] if errors else '?'}",
        {"errors": list(errors[: blind.MAX_ERRORS])},
        "hma healthcheck",
        started,
        now,
        1,
        entry.drains,
        entry.clears,
        True,
    )
    procfs = config.section("paths")["procfs"]
    _publish(
        setup,
        status.Snapshot(
            node=os.environ.get("SLURMD_NODENAME") or setup.node_name,
            boot_id=statusfile.boot_id(procfs),
            started=started,
            generated=now,
            severity=str(Severity.UNKNOWN),
            action="none",
            active=1,
            instance_type=setup.instance_type(),
            topology=_topology(setup),
            probes=(),
            faults=(fault.to_json(),),
            remediation={},
        ),
    )


def _topology(setup: Setup) -> dict[str, str]:
    """The NVLink domain a health check knows: the configured one (hma.topology.domain)."""
    from hma.topology import domain

    name, source = domain.resolve(setup.config.section("topology")["domain"], {})
    return {"domain": name, "source": source}


def _publish(setup: Setup, snapshot: Any) -> None:
    """Write ``snapshot``'s document as status.json, ``writer`` "healthcheck" and heartbeat
    ``[healthcheck] interval``: never over the document of a daemon that runs (it may have
    started meanwhile). A file that cannot be written is one line on stderr."""
    from hma.reporters import status

    run_dir = setup.config.section("agent")["run_dir"]
    if statusfile.daemon_pid(run_dir, setup.config.section("paths")["procfs"]) is not None:
        return
    interval = float(setup.config.section("healthcheck")["interval"])
    doc = status.document(snapshot, interval, writer=statusfile.HEALTHCHECK)
    path = statusfile.status_path(run_dir)
    try:
        os.makedirs(path.parent, mode=0o755, exist_ok=True)
        statusfile.write_atomic(path, statusfile.bounded(doc))
    except (OSError, ValueError) as exc:
        print(f"hma healthcheck: cannot write {path}: {printable(str(exc))}", file=sys.stderr)


def arguments(parser: Any) -> None:
    """The options of ``hma healthcheck`` (and ``hma-healthcheck``) on an argparse parser."""
    parser.add_argument("--quiet", action="store_true", help="print nothing; only the exit code")
    parser.add_argument(
        "-d",
        "--debug",
        action="store_true",
        help="debug lines on stderr (and in the run log): what each probe read, the "
        "thresholds it compared and why it decided ([healthcheck] debug for slurmd's runs)",
    )
    parser.add_argument(
        "-t",
        "--timeout",
        metavar="SECONDS",
        help="stop after SECONDS, exit 3 (overrides [healthcheck] timeout; at most 58)",
    )


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``hma-healthcheck`` (slurm.conf ``HealthCheckProgram`` takes no arguments:
    the configuration file comes from ``$HMA_CONFIG`` or /etc/hma/hma.toml, debug and timeout
    from ``[healthcheck]``); by hand it takes ``hma healthcheck``'s options and ``--config``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return run()
    import argparse

    parser = argparse.ArgumentParser(
        prog="hma-healthcheck", description="Slurm HealthCheckProgram: `hma healthcheck`."
    )
    parser.add_argument("--config", help="main configuration file")
    arguments(parser)
    ns = parser.parse_args(args)
    return run(ns.config, quiet=ns.quiet, debug=ns.debug, timeout=ns.timeout)


if __name__ == "__main__":
    sys.exit(main())
