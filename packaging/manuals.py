#!/usr/bin/env python3
"""Man pages and shell completion for ``hma``, generated from its argument parser at build time.

packaging/build runs it in the staged source with the development virtualenv's Python, which has
argparse-manpage and shtab (setup.cfg's ``test`` extra); the packages then only install the files:

    manuals.py OUT    OUT/man/hma.1 (every command), OUT/man/hma-COMMAND.1 (one per command),
                      OUT/completion/hma.bash (bash), OUT/completion/_hma (zsh)

SOURCE_DATE_EPOCH, when set, dates the pages (reproducible builds).
"""

from __future__ import annotations

import argparse
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
is the same check as an executable of its own, for slurm.conf
.B HealthCheckProgram=
(slurmd passes no arguments); it takes no option but
.BI "\-\-config " FILE .
.B /usr/bin/hma
run by slurmd with no arguments does the same."""


def page(parser: argparse.ArgumentParser, name: str, summary: str, see_also: list[str]) -> str:
    """One man page (section 1) of ``parser``, titled ``name``."""
    man = Manpage(parser)
    man.prog = name
    man.description = summary
    man.source = f"hma {__version__}"
    man.manual = "hma manual"
    if name == "hma-healthcheck":
        man.add_section("NOTES", ">", HEALTHCHECK)
    man.add_section("FILES", ">", FILES)
    refs = [f".BR {ref} (1)" for ref in see_also]
    man.add_section("SEE ALSO", ">", ",\n".join(refs))
    return str(man)


def completable(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser with the shipped finding codes as the choices of ``explain`` and ``ack``, so
    the completion offers them; only this copy of the parser is changed."""
    codes = [entry.code for entry in catalogue.load_builtin()]
    for name, _, sub in commands(parser):
        for action in sub._actions:
            if name in ("explain", "ack") and action.dest == "code":
                action.choices = codes
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
    names = [f"hma-{name}" for name, _, _ in commands(parser)]
    pages = {"hma": page(parser, "hma", parser.description or "", names)}
    for name, summary, sub in commands(parser):
        pages[f"hma-{name}"] = page(sub, f"hma-{name}", summary, ["hma"])
    for name, text in pages.items():
        (out / "man" / f"{name}.1").write_text(text, encoding="utf-8")
    parser = completable(build_parser())
    (out / "completion" / "hma.bash").write_text(complete(parser, "bash"), encoding="utf-8")
    (out / "completion" / "_hma").write_text(complete(parser, "zsh"), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
