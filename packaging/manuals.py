#!/usr/bin/env python3
"""Man pages and shell completion for ``hma``, generated from its argument parser at build time.

packaging/build runs it in the staged source with the development virtualenv's Python, which has
argparse-manpage and shtab (setup.cfg's ``test`` extra); the packages then only install the files:

    manuals.py OUT    OUT/man/hma.1 (every command), OUT/man/hma-COMMAND.1 (one per command),
                      OUT/completion/hma.bash (bash), OUT/completion/_hma (zsh)

The pages' PROBES section lists the probes of the registry (the entry points of ``hma.probes``);
their EXIT STATUS is each command's row of docs/cli.md's command table (its "exit" column), the
one place the exit codes are written down. The completion offers the probe names after
``hma check`` and the catalogue's codes after ``hma explain``, ``ack`` and ``reset``.

SOURCE_DATE_EPOCH, when set, dates the pages (reproducible builds).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Iterator

SOURCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SOURCE))  # this tree's hma, not one installed elsewhere

from argparse_manpage.manpage import Manpage  # noqa: E402
from shtab import complete  # noqa: E402

from hma import __version__  # noqa: E402
from hma.cli import build_parser  # noqa: E402
from hma.contracts import catalogue  # noqa: E402
from hma.contracts.severity import Severity  # noqa: E402
from hma.detection import registry  # noqa: E402

COMMAND_TABLE = SOURCE / "docs" / "cli.md"

DOC_DIR = "/usr/share/doc/hma"
FILES = rf""".TP
.B /etc/hma/hma.toml
The configuration (every key, commented, with its default); drop-ins in
.BR /etc/hma/hma.d/ ,
executable probes in
.BR /etc/hma/probes.d/ ,
site kernel-log rules in
.BR /etc/hma/rules.d/ .
.TP
.B /run/hma/status.json
The running agent's view of the node, read by
.BR "hma status" .
.TP
.B /var/lib/hma/
State: findings history, reboot counts, the remediation outbox.
.TP
.B {DOC_DIR}/
The documentation; a path
.BI docs/ NAME .md
named in this manual is
.BI {DOC_DIR}/ NAME .md\fR."""


def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """``(name, one-line help, parser)`` of each subcommand, in the order ``hma --help`` shows."""
    for action in parser._actions:  # argparse keeps no public list of subcommands
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


# The page of `hma healthcheck` is also the page of the hma-healthcheck executable.
HEALTHCHECK = r""".B hma-healthcheck
is the same check as an executable of its own, the program to name in slurm.conf:
.B HealthCheckProgram=/usr/bin/hma\-healthcheck
(slurmd passes no arguments); it takes no option but
.BI "\-\-config " FILE .
.B /usr/bin/hma
run by slurmd with no arguments does the same (older configurations)."""


def roff(markdown: str) -> str:
    """A Markdown table cell as roff text: code spans in bold, escaped pipes plain."""
    text = markdown.replace("\\|", "|").replace("\\", "\\e")
    return re.sub(r"`([^`]*)`", lambda m: rf"\fB{m.group(1)}\fR", text)


def exit_statuses(table: str) -> dict[str, list[tuple[str, str]]]:
    """``{command: [(usage, exit column), ...]}`` of docs/cli.md's command table: each row's
    first code span is its usage (``hma config check``: command ``config``)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        usage = re.match(r"`hma ([a-z-]+)[^`]*`", cells[0]) if len(cells) == 3 else None
        if usage:
            out.setdefault(usage.group(1), []).append((usage.group(0).strip("`"), cells[2]))
    return out


def exit_section(rows: list[tuple[str, str]]) -> str:
    """The EXIT STATUS section of a page from its commands' rows."""
    severities = ", ".join(f"{int(s)} {s}" for s in Severity)
    lines = [
        f"A verdict is the worst severity found, as Nagios codes: {severities}.",
        "What each command exits with:",
    ]
    for usage, codes in rows:
        lines += [".TP", rf"\fB{roff(usage)}\fR", roff(codes)]
    return "\n".join(lines)


def probe_section(probes: dict[str, type]) -> str:
    """The PROBES section: the registry's probes and where the others come from."""
    lines = []
    for name, cls in sorted(probes.items()):
        lines += [".TP", rf"\fB{name}\fR", roff(str(getattr(cls, "description", "")))]
    lines += [
        ".PP",
        "Also every root-owned executable in",
        ".B /etc/hma/probes.d/",
        "(named after its file) and the probes of installed plugins;",
        ".B hma check \\-\\-help",
        "lists the probes installed on this host.",
    ]
    return "\n".join(lines)


def page(
    parser: argparse.ArgumentParser,
    name: str,
    summary: str,
    see_also: list[str],
    extra: dict[str, str],
) -> str:
    """One man page (section 1) of ``parser``, titled ``name``, with the sections ``extra``
    (title: roff text) before NOTES, FILES and SEE ALSO."""
    man = Manpage(parser)
    man.prog = name
    man.description = summary
    man.source = f"hma {__version__}"
    man.manual = "hma manual"
    for title, text in extra.items():
        man.add_section(title, ">", text)
    if name == "hma-healthcheck":
        man.add_section("NOTES", ">", HEALTHCHECK)
    man.add_section("FILES", ">", FILES)
    refs = [f".BR {ref} (1)" for ref in see_also]
    man.add_section("SEE ALSO", ">", ",\n".join(refs))
    return str(man)


def builtin_probes() -> dict[str, type]:
    """The registry's probes; SystemExit naming any that does not load (no page lists it)."""
    probes, broken = registry.discover()
    if broken:
        raise SystemExit(f"manuals.py: probes that do not load: {broken}")
    return probes


def completable(parser: argparse.ArgumentParser, probes: list[str]) -> argparse.ArgumentParser:
    """The parser with the shipped finding codes as the choices of ``explain``, ``ack`` and
    ``reset``, and ``probes`` as those of ``check``, so the completion offers them; only this
    copy of the parser is changed (argparse would refuse other values)."""
    codes = [entry.code for entry in catalogue.load_builtin()]
    wanted = {("explain", "code"): codes, ("ack", "code"): codes, ("reset", "code"): codes}
    wanted[("check", "probes")] = probes
    for name, _, sub in commands(parser):
        for action in sub._actions:
            if (name, action.dest) in wanted:
                action.choices = wanted[(name, action.dest)]
    return parser


def main(argv: list[str]) -> int:
    """Write the pages and completion files under ``argv[0]``."""
    if len(argv) != 1:
        print("usage: manuals.py OUT", file=sys.stderr)
        return 2
    out = Path(argv[0])
    (out / "man").mkdir(parents=True, exist_ok=True)
    (out / "completion").mkdir(parents=True, exist_ok=True)
    parser = build_parser()
    probes = builtin_probes()
    statuses = exit_statuses(COMMAND_TABLE.read_text(encoding="utf-8"))
    listed = {name: sub for name, _, sub in commands(parser)}
    missing = sorted(set(listed) - set(statuses))
    if missing:
        raise SystemExit(f"manuals.py: no row in docs/cli.md's command table for {missing}")
    names = [f"hma-{name}" for name in listed]
    every = [row for name in listed for row in statuses[name]]
    extra = {"PROBES": probe_section(probes), "EXIT STATUS": exit_section(every)}
    pages = {"hma": page(parser, "hma", parser.description or "", names, extra)}
    for name, summary, sub in commands(parser):
        extra = {"EXIT STATUS": exit_section(statuses[name])}
        if name == "check":
            extra = {"PROBES": probe_section(probes), **extra}
        pages[f"hma-{name}"] = page(sub, f"hma-{name}", summary, ["hma"], extra)
    for name, text in pages.items():
        (out / "man" / f"{name}.1").write_text(text, encoding="utf-8")
    parser = completable(build_parser(), sorted(probes))
    (out / "completion" / "hma.bash").write_text(complete(parser, "bash"), encoding="utf-8")
    (out / "completion" / "_hma").write_text(complete(parser, "zsh"), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
