"""``hma deep-check [--stages S,...] [--json]``: run the deep-check stages on this node (root).

Prints a per-stage table (or the JSON document), records each stage that ran in the agent's
state store (hma.deepcheck.record) and exits with the Nagios code of the overall verdict:
0 pass, 1 warn, 2 fail, 3 unknown or nothing verified (every stage skipped).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from hma.configfile import ConfigError

if TYPE_CHECKING:
    import argparse

EXIT = {"pass": 0, "warn": 1, "fail": 2, "unknown": 3, "skipped": 3}
EX_USAGE, EX_NOPERM, EX_CANTCREAT = 64, 77, 73


def register(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Add the ``deep-check`` subcommand to the parser (``add`` is the subparsers' add)."""
    p = add(
        "deep-check",
        help="run deep health checks (stress, devices, DCGM, EFA, Neuron) on this node",
        description="Run the deep-check stages on this node, each under its timeout, and record "
        "them in the agent's state store (docs/deep-check.md).",
    )
    p.add_argument(
        "--stages", help="comma-separated stages (default: [deep_check] stages)", default=""
    )
    p.add_argument("--json", action="store_true", help="print the JSON document")
    p.add_argument("--no-record", action="store_true", help="do not write the state store")
    p.set_defaults(func=main)


def parse_stages(text: str, default: list[str]) -> list[str]:
    """The stage list of ``--stages`` (validated), else the configured default."""
    from hma.deepcheck.options import NODE_STAGES

    stages = [s.strip() for s in text.split(",") if s.strip()] if text else list(default)
    bad = [s for s in stages if s not in NODE_STAGES]
    if bad:
        raise ValueError(f"unknown stage(s) {', '.join(bad)}; stages: {', '.join(NODE_STAGES)}")
    return stages


def main(args: argparse.Namespace) -> int:
    """The handler: validate, run, print, record."""
    from hma import assembly
    from hma.deepcheck import node

    try:
        setup = assembly.load(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return EXIT["unknown"]
    try:
        stages = parse_stages(args.stages, list(setup.config.section("deep_check")["stages"]))
    except ValueError as exc:
        print(f"hma deep-check: {exc}", file=sys.stderr)
        return EX_USAGE
    if os.geteuid() != 0 and not args.no_record:
        print(
            "hma deep-check: needs root (it stresses the node and records results in the agent's"
            " state store); run it with sudo, or add --no-record",
            file=sys.stderr,
        )
        return EX_NOPERM
    out = sys.stderr if sys.stderr.isatty() and not args.json else None
    results = node.run_stages(setup, stages, out=out)
    doc: dict[str, Any] = node.document(setup.node_name, results)
    if not args.no_record:
        doc["recorded"] = _record(setup, results)
    print(json.dumps(doc, indent=2, allow_nan=False) if args.json else node.render_text(doc))
    return EXIT[doc["verdict"]]


def _record(setup: Any, results: Any) -> str:
    from hma.ack import operator
    from hma.deepcheck.record import record
    from hma.state import StateError

    try:
        return record(setup, results, operator(), time.time())
    except StateError as exc:
        print(f"hma deep-check: results not recorded: {exc}", file=sys.stderr)
        return f"not recorded: {exc}"
