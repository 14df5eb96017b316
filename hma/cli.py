"""The ``hma`` command line. Subcommands stay thin: each calls one module. Each registers its
own arguments (``_check``, ``_status``, ... below; ``hma deep-check`` in its module); the
handlers import their module when they run, so ``hma VERB`` imports what that verb needs."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from hma import __version__
from hma.commands import common
from hma.config.files import ConfigError

if TYPE_CHECKING:  # argparse is imported when a parser is built: `hma status` skips it
    import argparse

CONFIG_HELP = "main configuration file (default $HMA_CONFIG or /etc/hma/hma.toml)"

# Shown under each command's --help (each line within 78 columns); tests/unit/test_help.py
# checks that every command has an entry.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "hma": ("hma status", "hma check gpu --json", "hma explain GPU_XID_79", "hma COMMAND --help"),
    "check": ("hma check", "hma check system gpu --json", "hma check --debug gpu"),
    "status": ("hma status", "hma status --json | jq .severity", "watch -n 5 hma status"),
    "config": ("hma config check", "hma config show | less", "hma config defaults | less"),
    "config check": ("hma config check", "hma --config /tmp/new.toml config check"),
    "config defaults": ("hma config defaults > /tmp/hma-defaults.toml",),
    "config show": (
        "hma config show | grep -v '# default$'",
        "hma config show --json | jq '.values[\"probes.gpu.expected_gpus\"]'",
    ),
    "run": ("systemctl start hma   (the service runs `hma run`)", "hma run --log-level debug"),
    "ack": ("sudo hma ack GPU_ROW_REMAP_FAILURE", "sudo hma ack SITE_PROBE_CRITICAL node"),
    "reset": (
        "sudo hma reset GPU_XID_79 gpu:0000:3b:00 --reason 'GPU swapped, RMA 1234'",
        "sudo hma reset --all --reason 'board replaced'",
    ),
    "maintenance": (
        "sudo hma maintenance on --for 2h --reason 'swap PSU'",
        "hma maintenance status",
        "sudo hma maintenance off",
    ),
    "healthcheck": (
        "HealthCheckProgram=/usr/bin/hma-healthcheck   (slurm.conf)",
        "hma healthcheck; echo $?",
        "sudo hma healthcheck -d -t 20",
    ),
    "fleet": ("hma fleet", "hma fleet --json | jq '.nodes[].node'"),
    "topology": ("hma topology --check", "hma topology --format block"),
    "watch": (
        "systemctl enable --now hma-watch   (the service runs `hma watch`)",
        "sudo hma watch --once --json",
    ),
    "genconf": (
        "sudo hma genconf   (writes /etc/hma/hma.d/50-genconf.toml)",
        "hma genconf --output - | less",
    ),
    "explain": ("hma explain GPU_XID_79", "hma explain --list | grep EFA_"),
    "logscan": ("hma logscan /var/log/kern.log", "journalctl -k -o short-iso | hma logscan -"),
    "inject": ("sudo hma inject xid --gpu 0000:3b:00.0 --xid 79 --yes-really-drain",),
    "inject xid": ("sudo hma inject xid --gpu 0000:3b:00.0 --xid 79 --yes-really-drain",),
    "srun": (
        "hma srun --auto-resume=3 -N 2 python train.py   (in an sbatch script)",
        "hma srun -- --help   (srun's own help)",
    ),
    "job-env": ('eval "$(hma job-env)"', "hma job-env --format json"),
    "deep-check": ("sudo hma deep-check --stages stress,accelerators", "hma deep-check run n[1-4]"),
}


def _epilog(name: str) -> Optional[str]:
    lines = EXAMPLES.get(name)
    return "examples:\n" + "\n".join(f"  {line}" for line in lines) if lines else None


def _load(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from hma import assembly

    return assembly.load(args.config)


class Verbs:
    """What a command's registration adds its subparser with: ``add`` (a command),
    ``add_to`` (an action under a command's own subparsers) and ``plain`` (no shared options),
    each with the command's examples and help within 80 columns."""

    def __init__(self, sub: Any, common_options: argparse.ArgumentParser, formatter: Any) -> None:
        self.sub = sub
        self.common_options = common_options
        self.formatter = formatter

    def add(self, name: str, **kw: Any) -> argparse.ArgumentParser:
        """A subcommand ``name`` that takes ``--config`` after it too."""
        return self.add_to(self.sub, "", name, **kw)

    def add_to(self, subparsers: Any, group: str, name: str, **kw: Any) -> argparse.ArgumentParser:
        """An action ``name`` of command ``group`` (``subparsers``: the command's own)."""
        kw.setdefault("description", kw.get("help"))
        return subparsers.add_parser(
            name,
            parents=[self.common_options],
            epilog=_epilog(f"{group} {name}" if group else name),
            formatter_class=self.formatter,
            **kw,
        )

    def plain(self, name: str, **kw: Any) -> argparse.ArgumentParser:
        """A subcommand ``name`` without the shared options (``hma srun``)."""
        return self.sub.add_parser(name, epilog=_epilog(name), formatter_class=self.formatter, **kw)


def cmd_check(args: argparse.Namespace) -> int:
    """Run probes once and print the result."""
    from hma.commands import check

    if args.help_text:
        from hma.commands.term import help_columns

        print(args.help_text + "\n" + check.probes_help(args.config, help_columns()))
        return 0
    if args.debug:  # what each probe read and ran, its thresholds and decisions, on stderr
        from hma.adapters import logs

        logs.configure("debug")
    if args.request or args.wait is not None:
        from hma.commands import checkrequest

        if args.probes or args.json:
            print("hma check: --request runs every probe and prints text", file=sys.stderr)
            return 2
        return checkrequest.main(
            args.config, checkrequest.WAIT_S if args.wait is None else args.wait
        )
    return check_main(args.config, args.probes, args.json)


def check_main(config: Optional[str], probes: Sequence[str], as_json: bool) -> int:
    """``hma check [PROBE...] [--json]`` (hma.commands.check); 3 on a configuration error."""
    from hma.commands import check

    try:
        return check.main(config, probes, as_json)
    except ConfigError as exc:
        return common.config_failed(exc, 3, "check" if as_json else "")


def _check(verbs: Verbs) -> None:
    import argparse

    class CheckHelp(argparse.Action):
        """``hma check -h``: cmd_check prints the help, then the probes installed here (found
        only then, with the configuration's probes_dir, wherever ``--config`` was given)."""

        def __call__(self, parser: argparse.ArgumentParser, ns: Any, *_args: Any) -> None:
            ns.help_text = parser.format_help()

    p = verbs.add(
        "check",
        add_help=False,
        help="run probes once in the foreground (no remediation)",
        description="Run the named probes (default: every enabled one) once, each under its "
        "timeout; no remediation and no state writes.",
    )
    p.add_argument("-h", "--help", action=CheckHelp, nargs=0, help="show this help and the probes")
    p.add_argument("probes", nargs="*", metavar="PROBE", help="probe names (listed below)")
    p.add_argument("--json", action="store_true", help="print the JSON document")
    p.add_argument(
        "--debug",
        action="store_true",
        help="on stderr: every file each probe read and command it ran, the thresholds it "
        "compared (its options) and why it decided (each finding with its evidence)",
    )
    p.add_argument(
        "--request",
        action="store_true",
        help="ask the running agent to run every probe now (through its verdict and "
        "remediation), wait for the verdict and exit by it; any user may (rate-limited)",
    )
    p.add_argument(
        "--wait",
        type=_wait_seconds,
        metavar="S",
        help="with --request: seconds to wait for the verdict (default 180; exit 3 after)",
    )
    p.set_defaults(func=cmd_check, help_text="")


def _wait_seconds(text: str) -> float:
    import argparse

    from hma.adapters import strict

    try:
        return strict.parse_decimal(text, low=0.0, high=86400.0)
    except strict.ParseError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0-86400)") from None


def cmd_status(args: argparse.Namespace) -> int:
    """Print the daemon's status.json as a summary (or the document with ``--json``)."""
    from hma.commands import status

    return status.main(args.config, args.json)


def _status(verbs: Verbs) -> None:
    p = verbs.add(
        "status",
        help="show the running daemon's view of the node",
        description="Read the running daemon's status file (status.json) and show the node's "
        "health: probes, active faults with their evidence, maintenance, what remediation did "
        "or holds and why. Any user may run it. Exit code: the node's severity (0 ok, "
        "1 warning, 2 critical, 3 unknown: also when no daemon runs or the file is stale).",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the status.json document (or, without one, a document saying what is "
        "missing)",
    )
    p.set_defaults(func=cmd_status)


def cmd_config_check(args: argparse.Namespace) -> int:
    """Validate the configuration: exit 0, or 2 with one ``key.path: problem`` line per error
    (a broken plugin the configuration enables is one, and an enabled reporter this host cannot
    run; any other broken plugin, and options of a plugin left off, are warnings). Each drop-in
    with a ``[match]`` table gets a line first: applied here or not, and why."""
    from hma.config import files

    for note in files.read_layers_noted(files.config_path(args.config))[2]:
        print(note)
    try:
        setup = _load(args)
    except ConfigError as exc:
        return common.config_failed(exc, 2)
    from hma import reporters

    for b in setup.broken:
        if b not in setup.broken_in_use:
            print(f"warning: {b.kind} plugin {b.name!r} failed to load: {b.error}", file=sys.stderr)
    for line in setup.config.warnings:
        print(f"warning: {line}", file=sys.stderr)
    lines = [f"{b.section}: {b.kind} plugin failed to load: {b.error}" for b in setup.broken_in_use]
    lines += reporters.unmet(setup.config.reporters)
    if lines:
        return common.config_failed(ConfigError(lines), 2)
    from hma.commands import srun_decide

    note = srun_decide.expansion_note(setup)
    if note:
        print(note, file=sys.stderr)
    used = ", ".join(setup.config.files) or "no file (all defaults)"
    print(f"configuration OK ({used})")
    return 0


def cmd_config_defaults(args: argparse.Namespace) -> int:
    """Print every key with its default and documentation, as a commented TOML file."""
    from hma.commands import docs
    from hma.config.schema import render_defaults

    print(render_defaults(docs.schema()))
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    """Print the merged configuration, each value with where it came from (hma.commands)."""
    from hma.commands import configshow

    return configshow.main(args.config, args.json)


def _config(verbs: Verbs) -> None:
    p = verbs.add("config", help="configuration tools")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    csub.required = True
    verbs.add_to(csub, "config", "check", help="validate the configuration").set_defaults(
        func=cmd_config_check
    )
    verbs.add_to(csub, "config", "defaults", help="print every key with its default").set_defaults(
        func=cmd_config_defaults
    )
    show = verbs.add_to(
        csub,
        "config",
        "show",
        help="print the merged configuration and where each value came from",
        description="Every key of the configuration in effect on this node, with its value and "
        "where it came from: the main file, a drop-in (by path; a drop-in whose [match] does "
        "not apply here is named and left out) or the default. Exit 0, or 2 with the errors "
        "of an invalid configuration.",
    )
    show.add_argument("--json", action="store_true", help="print the JSON document")
    show.set_defaults(func=cmd_config_show)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the agent in the foreground (the systemd service's ExecStart)."""
    from hma import daemon

    return daemon.main(args.config, args.log_level)


def _run(verbs: Verbs) -> None:
    from hma.adapters import logs

    p = verbs.add(
        "run",
        help="run the agent (systemd service)",
        description="Run the agent in the foreground: probes on their intervals, event sources, "
        "the health model, remediation, status.json, journald and Prometheus. systemd's hma "
        "service runs it; SIGHUP reloads the configuration. Exit 78 on an invalid "
        "configuration, 75 when another agent holds the state folder.",
    )
    p.add_argument(
        "--log-level",
        choices=logs.LEVELS,
        help="debug, info, warning or error (default [agent] log_level); debug shows what each "
        "probe read, the thresholds it compared and why it decided",
    )
    p.set_defaults(func=cmd_run)


def cmd_ack(args: argparse.Namespace) -> int:
    """Acknowledge a fault that clears by operator."""
    from hma.commands import ack

    if common.needs_root("hma ack"):
        return common.EX_NOPERM
    try:
        setup = _load(args)
    except ConfigError as exc:
        return common.config_failed(exc, 2)
    return ack.main(setup, args.code.upper(), args.component)


def _ack(verbs: Verbs) -> None:
    p = verbs.add(
        "ack",
        help="acknowledge a fault that clears by operator",
        description="Clear an active fault whose catalogue entry clears by operator (see `hma "
        "explain CODE`); recorded with who and when. A running daemon applies it at once. "
        "Needs root. Exit 0 done, 1 nothing to acknowledge, 2 misuse, 77 not root.",
    )
    p.add_argument("code", help="finding code, e.g. GPU_ROW_REMAP_FAILURE")
    p.add_argument("component", nargs="?", help="only this component (default: all of them)")
    p.set_defaults(func=cmd_ack)


def cmd_maintenance(args: argparse.Namespace) -> int:
    """``hma maintenance on|off|status``: hma detects and alerts but takes no action."""
    from hma.commands import maintenance

    try:
        setup = _load(args)
    except ConfigError as exc:
        return common.config_failed(exc, 3, "maintenance" if args.json else "")
    return maintenance.main(setup, args.action, args.duration, args.reason, args.json)


def _maintenance(verbs: Verbs) -> None:
    p = verbs.add(
        "maintenance",
        help="planned work: detect and alert, take no action on this node",
        description="While maintenance is on, hma detects, records and alerts but takes no "
        "action on this node (no drain, reboot or resume); it ends by itself after --for. "
        "The window survives restarts and is marked in the node's Slurm label field, so "
        "`hma fleet` lists the node. on and off need root.",
    )
    p.add_argument("action", choices=("on", "off", "status"), help="on, off or status")
    p.add_argument(
        "--for",
        dest="duration",
        metavar="DURATION",
        help="end by itself after DURATION (90s, 30m, 2h, 1d); default: until off",
    )
    p.add_argument("--reason", default="", help="why (shown in status, logs and history)")
    p.add_argument("--json", action="store_true", help="status as a JSON document")
    p.set_defaults(func=cmd_maintenance)


def cmd_reset(args: argparse.Namespace) -> int:
    """A human says the node was repaired: clear its remediation history and hold."""
    from hma.commands import reset

    if common.needs_root("hma reset"):
        return common.EX_NOPERM
    if args.all == (args.code is not None):
        print("hma reset: give either --all or CODE [COMPONENT]", file=sys.stderr)
        return 2
    try:
        setup = _load(args)
    except ConfigError as exc:
        return common.config_failed(exc, 2)
    code = args.code.upper() if args.code else None
    return reset.main(setup, code, args.component, args.reason)


def _reset(verbs: Verbs) -> None:
    p = verbs.add(
        "reset",
        help="a human repaired the node: clear its remediation history and hold",
        description="A human says the node was repaired: clear its remediation history, "
        "reboot counts and the hold for a human (repeat offender) for CODE [COMPONENT] or "
        "--all; who and why are recorded. The node returns only after a healthy observation. "
        "Needs root. Exit 0 done, 2 misuse, 77 not root, 73 state store unusable.",
    )
    p.add_argument("--all", action="store_true", help="everything (else CODE [COMPONENT])")
    p.add_argument("code", nargs="?", help="finding code whose history to clear")
    p.add_argument("component", nargs="?", help="only this component")
    p.add_argument("--reason", required=True, help="what was repaired (recorded with who)")
    p.set_defaults(func=cmd_reset)


def cmd_healthcheck(args: argparse.Namespace) -> int:
    """Slurm HealthCheckProgram: the daemon's verdict (or one probe run), drain state per policy."""
    from hma.commands import healthcheck

    return healthcheck.run(args.config, quiet=args.quiet, debug=args.debug, timeout=args.timeout)


def _healthcheck(verbs: Verbs) -> None:
    from hma.commands import healthcheck  # its options: hma-healthcheck takes them too

    p = verbs.add(
        "healthcheck",
        help="Slurm HealthCheckProgram: verdict and drain state",
        description="What slurmd runs as HealthCheckProgram: with the daemon running it reads "
        "its verdict; without one it runs the probes once, drains or resumes the node per "
        "[recovery] policy and writes what it decided to status.json for `hma status`. Each "
        "run's output is kept in the run log <state_dir>/healthcheck.log. Exit code: the "
        "node's severity (slurmd ignores it); 3 also for a bad -t.",
    )
    healthcheck.arguments(p)
    p.set_defaults(func=cmd_healthcheck)


def cmd_fleet(args: argparse.Namespace) -> int:
    """Cluster health from Slurm alone: nodes labelled/drained by hma, breaker per partition."""
    from hma.commands import fleet

    try:
        setup = _load(args)
    except ConfigError as exc:
        return common.config_failed(exc, 3, "fleet" if args.json else "")
    return fleet.main(setup, args.json)


def _fleet(verbs: Verbs) -> None:
    p = verbs.add(
        "fleet",
        help="cluster health from Slurm: hma-held nodes, breaker state",
        description="From any node that can run sinfo (one call): every node hma labelled, "
        "drained or put in maintenance, with code, component, action, since when and "
        "reboots, and the circuit breaker per partition. Exit 3 when Slurm cannot say.",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the JSON document (or, without Slurm, one saying what is missing)",
    )
    p.set_defaults(func=cmd_fleet)


def cmd_topology(args: argparse.Namespace) -> int:
    """Write the controller's topology file from the nodes' NVLink domains (hma.commands)."""
    from hma.commands import topology

    return topology.main(args.config, args.format, args.file, args.check)


def _topology(verbs: Verbs) -> None:
    p = verbs.add(
        "topology",
        help="controller: write topology.conf from the nodes' NVLink domains",
        description="Read every node's NVLink domain (one sinfo), keep [topology] "
        "spares_per_domain spares per domain, write the topology file when it changed and run "
        "scontrol reconfigure (docs/topology.md).",
    )
    p.add_argument(
        "--format",
        choices=("block", "yaml", "tree"),
        help="block: topology.conf for Slurm 23.11+; yaml: topology.yaml (25.05+); tree: "
        "SwitchName= lines (22.05); default [topology] format",
    )
    p.add_argument("--file", help="file to write (default: next to slurm.conf)")
    p.add_argument(
        "--check", action="store_true", help="print the difference, change nothing (exit 1)"
    )
    p.set_defaults(func=cmd_topology)


def cmd_watch(args: argparse.Namespace) -> int:
    """Watch the nodes that cannot act for themselves, from the controller (hma.commands)."""
    from hma.commands import watch

    try:
        setup = _load(args)
    except ConfigError as exc:
        return common.config_failed(exc, 2, "watch" if args.json else "")
    return watch.main(setup, args.once, args.json)


def _watch(verbs: Verbs) -> None:
    p = verbs.add(
        "watch",
        help="controller: reboot or replace nodes that are dead, wedged or not back",
        description="Read the node table every [watch] interval (one sinfo) and act on nodes "
        "that cannot act for themselves: not responding past down_after (a reboot through "
        "[recovery] reboot_command or HyperPod), not back from a reboot (a replace), stuck "
        "COMPLETING (reported). Acts only where this host runs the slurmctld in service and "
        "holds the claim (docs/watch.md).",
    )
    p.add_argument("--once", action="store_true", help="one pass, then exit (cron, tests)")
    p.add_argument("--json", action="store_true", help="with --once: print the pass's document")
    p.set_defaults(func=cmd_watch)


def cmd_genconf(args: argparse.Namespace) -> int:
    """Record what this node has now as a drop-in (``nhc-genconf``)."""
    from hma.commands import genconf

    return genconf.main(args.config, args.output, args.force)


def _genconf(verbs: Verbs) -> None:
    p = verbs.add(
        "genconf",
        help="record what this node has now as a configuration drop-in",
        description="Run every enabled probe once and write what the node has now (GPU count, "
        "model, PCIe width and generation; InfiniBand ports and rate; EFA adapters; memory; online "
        "CPUs; mounted file systems) into the options the probes judge, with a [match] for this "
        "node's product, as a drop-in (default hma.d/50-genconf.toml next to the main file). "
        "Exit 0 written, 73 not written (exists without --force, a symbolic link, cannot "
        "write), 78 invalid configuration.",
    )
    p.add_argument("--output", metavar="PATH", help="file to write, - for stdout")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=cmd_genconf)


def cmd_explain(args: argparse.Namespace) -> int:
    """Print a catalogue entry (or list them all with ``--list``)."""
    from hma.commands import explain

    return explain.main(args.code, args.list)


def _explain(verbs: Verbs) -> None:
    p = verbs.add(
        "explain",
        help="explain a finding code",
        description="What a finding code means, its severity and action, how it clears and "
        "what to do about it (the catalogue). Exit 2 for an unknown code, with the nearest "
        "codes as a hint.",
    )
    p.add_argument("code", nargs="?", help="finding code, e.g. GPU_XID_79")
    p.add_argument("--list", action="store_true", help="list every code")
    p.set_defaults(func=cmd_explain)


def cmd_logscan(args: argparse.Namespace) -> int:
    """Run the kernel-log rules over saved logs."""
    from hma.commands import logscan

    return logscan.main(args)


def _logscan(verbs: Verbs) -> None:
    p = verbs.add("logscan", help="run the kernel-log rules over saved logs")
    p.add_argument("files", nargs="+", metavar="FILE", help="dmesg/syslog/kmsg files, - for stdin")
    p.add_argument("--json", action="store_true", help="print the JSON document")
    p.add_argument("--rules-dir", help="site rules folder (default: [sources.kernel_log])")
    p.set_defaults(func=cmd_logscan)


def cmd_inject_xid(args: argparse.Namespace) -> int:
    """Write an NVRM Xid line to /dev/kmsg."""
    from hma.commands import inject

    return inject.main(args)


def _inject(verbs: Verbs) -> None:
    p = verbs.add("inject", help="write a test event (drains the node!)")
    isub = p.add_subparsers(dest="inject_command", metavar="KIND")
    isub.required = True
    p = verbs.add_to(isub, "inject", "xid", help="write an NVRM Xid line to /dev/kmsg (root)")
    p.add_argument("--gpu", required=True, help="PCI bus id of the GPU, e.g. 0000:3b:00.0")
    p.add_argument("--xid", required=True, type=int, help="Xid number, e.g. 79")
    p.add_argument("--text", help="message after the Xid number")
    p.add_argument("--kmsg", default="/dev/kmsg", help="device to write (tests: a file)")
    p.add_argument("--yes-really-drain", action="store_true", help="confirm: this drains the node")
    p.set_defaults(func=cmd_inject_xid)


def cmd_srun(args: argparse.Namespace) -> int:
    """``hma srun``: handled in ``main`` before argparse (srun's options pass through verbatim)."""
    return cmd_srun_argv(args.config, args.srun_args)


def cmd_srun_argv(config: Optional[str], argv: Sequence[str]) -> int:
    """Run ``hma srun`` with srun's arguments untouched (hma.commands.srun)."""
    from hma.commands import srun

    try:
        client, journal = srun.from_config(config)
    except ConfigError as exc:
        return common.config_failed(exc, 2)
    return srun.main(argv, client, srun.Log(journal))


def _srun(verbs: Verbs) -> None:
    import argparse

    p = verbs.plain(
        "srun",
        usage="hma srun [--auto-resume=N] [--grace=S] [--replace-wait=S] SRUN_ARGS ...",
        help="srun with --auto-resume=N: resume the step after a hardware fault",
        description="Run srun; with --auto-resume=N, when the step failed because a node had a "
        "hardware fault, resume it at most N times from its last checkpoint: a job without GRES "
        "(sbatch or salloc) gets the faulty nodes replaced inside its allocation and the same "
        "srun runs again; a GRES batch job is requeued (docs/auto-resume.md). --grace=S: seconds "
        "to wait for the node's verdict (default $HMA_AUTO_RESUME_GRACE or 60). "
        "--replace-wait=S: seconds to wait for replacement nodes (default "
        "$HMA_AUTO_RESUME_REPLACE_WAIT or 300). Everything after these options goes to srun "
        "verbatim; `hma srun -- --help` shows srun's own help.",
    )
    p.add_argument("srun_args", nargs=argparse.REMAINDER, metavar="SRUN_ARGS")
    p.set_defaults(func=cmd_srun)


def cmd_job_env(args: argparse.Namespace) -> int:
    """Print the job's node list, master node/address, node count and rank (hma.commands.srun)."""
    from hma.commands import srun

    try:
        client, _journal = srun.from_config(args.config)
    except ConfigError as exc:
        return common.config_failed(exc, 2)
    return srun.job_env_main(client, args.format)


def _job_env(verbs: Verbs) -> None:
    p = verbs.add(
        "job-env",
        help="print NODE_LIST, MASTER_ADDR, NNODES, NODE_RANK of the job",
        description="Inside a Slurm job: the job's node list, the first node as master "
        "(name and address), the node count and this node's rank, for torchrun and friends.",
    )
    p.add_argument("--format", choices=("sh", "json"), default="sh", help="sh (for eval) or json")
    p.set_defaults(func=cmd_job_env)


def _deep_check(verbs: Verbs) -> None:
    from hma.commands import deep_check  # hma deep-check (its own module)

    deep_check.register(verbs.add)


# Each command's registration, in the order `hma --help` lists them.
REGISTRATIONS: tuple[Callable[[Verbs], None], ...] = (
    _check,
    _status,
    _config,
    _run,
    _ack,
    _maintenance,
    _reset,
    _healthcheck,
    _fleet,
    _topology,
    _watch,
    _genconf,
    _explain,
    _logscan,
    _inject,
    _srun,
    _job_env,
    _deep_check,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (each registered by its ``REGISTRATIONS``)."""
    import argparse

    from hma.commands.term import help_columns

    class Formatter(argparse.HelpFormatter):
        """Help within 80 columns (the terminal's when narrower); examples kept as written."""

        def __init__(self, prog: str) -> None:
            super().__init__(prog, width=help_columns() - 2)

        def _fill_text(self, text: str, width: int, indent: str) -> str:
            if text.startswith("examples:"):
                return "".join(indent + line for line in text.splitlines(keepends=True))
            return super()._fill_text(text, width, indent)

    parser = argparse.ArgumentParser(
        prog="hma",
        description="node health monitoring agent",
        epilog=_epilog("hma"),
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"hma {__version__}")
    parser.add_argument("--config", help=CONFIG_HELP)
    # `--config` may also follow the subcommand (`hma check --json --config X`); SUPPRESS keeps
    # the value given before it when it does not.
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    verbs = Verbs(sub, shared, Formatter)
    for register in REGISTRATIONS:
        register(verbs)
    return parser


def _srun_split(argv: Sequence[str]) -> Optional[tuple[Optional[str], list[str]]]:
    """``(config, srun args)`` when the subcommand is ``srun``, else None.

    srun's own options (``-N 2``, ``--nodes=2``, ``-h``) must reach srun untouched, so the
    ``srun`` subcommand is split off before argparse sees it.
    """
    config, i = None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            config, i = argv[i + 1], i + 2
        elif arg.startswith("--config="):
            config, i = arg.split("=", 1)[1], i + 1
        elif arg == "srun":
            return config, list(argv[i + 1 :])
        else:
            return None
    return None


def _fast_path(argv: list[str]) -> Optional[int]:
    """``hma status [--json]``, ``hma check [PROBE...] [--json]`` and ``hma healthcheck
    [--quiet]`` (each with ``--config X``) without building the full parser: they are run often
    (the health check by slurmd) and should start about as fast as the interpreter. None for
    anything else (help, errors and every other command)."""
    config: Optional[str] = None
    command: Optional[str] = None
    names: list[str] = []
    as_json = quiet = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if command is None and arg in ("status", "check", "healthcheck"):
            command = arg
        elif arg == "--json" and command in ("status", "check") and not as_json:
            as_json = True
        elif arg == "--quiet" and command == "healthcheck" and not quiet:
            quiet = True
        elif arg == "--config" and i + 1 < len(argv) and config is None:
            config = argv[i + 1]
            i += 1
        elif arg.startswith("--config=") and config is None:
            config = arg.split("=", 1)[1]
        elif command == "check" and arg and not arg.startswith("-"):
            names.append(arg)
        else:
            return None
        i += 1
    if command == "check":
        return check_main(config, names, as_json)
    if command is None:
        return None
    if command == "healthcheck":
        from hma.commands import healthcheck

        return healthcheck.run(config, quiet=quiet)
    from hma.commands import status

    return status.main(config, as_json)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``hma`` console script."""
    if argv is None and len(sys.argv) == 1 and os.environ.get("SLURMD_NODENAME"):
        # run by slurmd as HealthCheckProgram (no arguments): `hma healthcheck`
        argv = ["healthcheck"]
    split = _srun_split(list(sys.argv[1:] if argv is None else argv))
    if split is not None and split[1][:1] in (["-h"], ["--help"]):
        split = None  # argparse prints hma's help of `hma srun` (`hma srun -- --help`: srun's)
    if split is not None:
        try:
            return cmd_srun_argv(*split)
        except KeyboardInterrupt:
            return 130
    try:
        quick = _fast_path(list(sys.argv[1:] if argv is None else argv))
        if quick is not None:
            return quick
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
