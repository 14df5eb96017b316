"""``hma deep-check``: deep health checks (docs/deep-check.md).

- ``hma deep-check [--stages S,...] [--json]`` on a node (root): runs the node stages, prints a
  per-stage table (or JSON), records each stage that ran in the agent's state store.
- ``hma deep-check run NODES... [--stages S,...] [--json]`` from a login or controller node:
  reservation, one job per node, connectivity across them, a per-node table
  (hma.deepcheck.orchestrate).

Exit status: the Nagios code of the overall verdict (0 pass, 1 warn, 2 fail, 3 unknown or
nothing tested); 64 usage, 75 another run holds the reservation, 77 not root.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hma.commands import common
from hma.config.files import ConfigError

if TYPE_CHECKING:
    import argparse

    from hma.detection.setup import Setup

EXIT = {"pass": 0, "warn": 1, "fail": 2, "unknown": 3, "skipped": 3}
EX_USAGE, EX_TEMPFAIL = 64, 75


def register(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Add the ``deep-check`` subcommand to the parser (``add`` is the subparsers' add)."""
    p = add(
        "deep-check",
        help="deep health checks: stress, devices, DCGM, EFA, Neuron, bandwidth across nodes",
        description="Without arguments: run the node stages here (root). `run NODES...`: "
        "check those nodes through Slurm from a login node (docs/deep-check.md).",
    )
    p.add_argument("words", nargs="*", metavar="run NODES", help="run NODES: check those nodes")
    p.add_argument("--stages", default="", help="comma-separated stages (default: configured)")
    p.add_argument("--json", action="store_true", help="print the JSON document")
    p.add_argument("--no-record", action="store_true", help="do not write the state store")
    p.add_argument("--connectivity-result", default=None, help="(used by `run` on each node)")
    p.set_defaults(func=main)


def parse_stages(text: str, default: Sequence[str], allowed: Sequence[str]) -> list[str]:
    """The stage list of ``--stages`` (validated), else the configured default."""
    stages = [s.strip() for s in text.split(",") if s.strip()] if text else list(default)
    bad = [s for s in stages if s not in allowed]
    if bad:
        raise ValueError(f"unknown stage(s) {', '.join(bad)}; stages: {', '.join(allowed)}")
    return stages


def main(args: argparse.Namespace) -> int:
    """The handler: node stages, a connectivity result, or a run across nodes."""
    from hma import assembly

    if args.words and args.words[0] != "run":
        print(
            f"hma deep-check: unknown action {args.words[0]!r} (only: run NODES)", file=sys.stderr
        )
        return EX_USAGE
    try:
        setup = assembly.load(args.config)
    except ConfigError as exc:
        return common.config_failed(exc, EXIT["unknown"], "deep-check" if args.json else "")
    if args.words:
        return _run(setup, args)
    if os.geteuid() != 0 and not args.no_record:
        print(
            "hma deep-check: needs root (it stresses the node and records results in the agent's"
            " state store); run it with sudo, or add --no-record",
            file=sys.stderr,
        )
        return common.EX_NOPERM
    if args.connectivity_result is not None:
        return _connectivity_result(setup, args.connectivity_result)
    return _node(setup, args)


def _node(setup: Setup, args: argparse.Namespace) -> int:
    from hma.deepcheck import node
    from hma.deepcheck.options import NODE_STAGES

    opts = setup.config.section("deep_check")
    try:
        stages = parse_stages(args.stages, opts["stages"], NODE_STAGES)
    except ValueError as exc:
        print(f"hma deep-check: {exc}", file=sys.stderr)
        return EX_USAGE
    out = sys.stderr if sys.stderr.isatty() and not args.json else None
    results = node.run_stages(setup, stages, out=out)
    doc: dict[str, Any] = node.document(setup.node_name, results, setup.instance_type())
    if not args.no_record:
        doc["recorded"] = _record(setup, results)
    print(json.dumps(doc, indent=2, allow_nan=False) if args.json else node.render_text(doc))
    return EXIT[doc["verdict"]]


def _connectivity_result(setup: Setup, text: str) -> int:
    """Record the connectivity verdict ``run`` judged for this node (its findings, if any)."""
    from hma.deepcheck.record import finding_from_json
    from hma.deepcheck.stages import StageResult, finish

    probe, now = "deep_check.connectivity", time.time()
    try:
        findings = [finding_from_json(f, probe, now) for f in json.loads(text)["findings"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"hma deep-check: --connectivity-result: {exc}", file=sys.stderr)
        return EX_USAGE
    findings = [f for f in findings if f.code == "DEEP_BUSBW_LOW"]
    result = StageResult("connectivity", "pass", "", started=now)
    finish(result, findings, "judged by `hma deep-check run`")
    print(_record(setup, [result]))
    return 0


def _run(setup: Setup, args: argparse.Namespace) -> int:
    from hma.cluster.slurm.parse import SlurmError
    from hma.deepcheck import orchestrate
    from hma.deepcheck.node import overall
    from hma.deepcheck.options import STAGES

    opts = setup.config.section("deep_check")
    try:
        stages = parse_stages(args.stages, [*opts["stages"], "connectivity"], STAGES)
    except ValueError as exc:
        print(f"hma deep-check: {exc}", file=sys.stderr)
        return EX_USAGE
    try:
        client = common.slurm_client(setup)
    except ConfigError as exc:
        return common.config_failed(exc, EXIT["unknown"], "deep-check" if args.json else "")
    try:
        names = [n for word in args.words[1:] for n in client.hostnames(word)]
    except SlurmError as exc:
        print(f"hma deep-check: {exc}", file=sys.stderr)
        return EX_USAGE
    if not names:
        print("hma deep-check: run needs node names (e.g. run node[1-4])", file=sys.stderr)
        return EX_USAGE
    label_field = setup.config.section("recovery")["label_field"]
    itype = setup.config.section("agent")["instance_type"]
    runner = orchestrate.Orchestrator(client, opts, label_field, instance_type=itype)
    try:
        reports = runner.run(list(dict.fromkeys(names)), stages)
    except orchestrate.RunRefused as exc:
        print(f"hma deep-check: {exc}", file=sys.stderr)
        return EX_TEMPFAIL
    verdict = overall(r.verdict for r in reports)
    if args.json:
        doc = {
            "verdict": verdict,
            "stages": stages,
            "nodes": [r.to_json() for r in reports],
            "connectivity": runner.connectivity_detail,
        }
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(orchestrate.render_table(reports, runner.connectivity_detail))
    return EXIT[verdict]


def _record(setup: Setup, results: Any) -> str:
    import sqlite3

    from hma.deepcheck.record import record
    from hma.health.store import StateError

    try:
        return record(setup, results, common.operator(), time.time())
    except (StateError, sqlite3.Error) as exc:  # a write that fails after the open (full disk)
        print(f"hma deep-check: results not recorded: {exc}", file=sys.stderr)
        return f"not recorded: {exc}"
