"""docs/nhc.md names only options and finding codes that exist, and its examples are valid."""

from __future__ import annotations

import re
from pathlib import Path

from hma.adapters import tomlcompat
from hma.commands.docs import schema
from hma.config import match
from hma.config.schema import validate

PAGE = Path(__file__).resolve().parents[2] / "docs" / "nhc.md"
OPTION = re.compile(r"`\[([a-z_]+(?:\.[a-z_]+)?)\] ([a-z_]+)`")
CODE = re.compile(r"`((?:GPU|NEURON|EFA|SYS|KERNEL|HMA|SITE)_[A-Z0-9_]+)`")


def table_rows() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    body = text.split("## The checks", 1)[1].split("\n## ", 1)[0]
    return [line for line in body.splitlines() if line.startswith("| `check_")]


def test_every_option_of_the_migration_table_exists() -> None:
    known = schema()
    tables = {
        **known.sections,
        **{f"probes.{n}": o for n, o in known.probes.items()},
        **{f"sources.{n}": o for n, o in known.sources.items()},
        **{f"reporters.{n}": o for n, o in known.reporters.items()},
    }
    rows = table_rows()
    assert len(rows) >= 15
    named = [m for row in rows for m in OPTION.findall(row)]
    assert len(named) >= 15
    missing = [f"[{t}] {k}" for t, k in named if k not in tables.get(t, {})]
    assert not missing, missing
    # every row says where the check went: an option, a plugin, or that there is none
    for row in rows:
        where = row.split("|")[2]
        assert OPTION.search(where) or "probes.d plugin" in where or "none" in where, row


def test_every_code_the_page_names_is_catalogued() -> None:
    catalogue = schema().catalogue
    codes = set(CODE.findall(PAGE.read_text(encoding="utf-8")))
    assert codes
    assert not [c for c in codes if c not in catalogue]


def test_the_drop_in_examples_are_valid() -> None:
    """Each ``# /etc/hma/hma.d/NAME.toml`` example: a valid [match] table and valid options."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    files = [
        part
        for block in blocks
        for part in re.split(r"^# /etc/hma/hma\.d/\S+\n", block, flags=re.M)
        if "[match]" in part
    ]
    assert len(files) == 4  # three for a mixed cluster, one `hma genconf` wrote
    known = schema()
    for part in [*files, *(b for b in blocks if "[match]" not in b)]:
        raw = tomlcompat.loads(part)
        assert match.problems(raw.pop("match", {"hosts": ["x"]})) == []
        if "eth_link" in raw.get("probes", {}):
            continue  # an executable probe of the page's own (not installed here)
        validate(raw, known)


def test_every_option_of_the_nhc_options_table_exists() -> None:
    """docs/nhc.md "NHC's options" (issue 32): each row names NHC's option and its counterpart,
    a configuration key that exists or an option of the command it names."""
    from hma import cli

    text = PAGE.read_text(encoding="utf-8")
    body = text.split("## NHC's options", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| `-") or "`-V`" in line]
    assert len(rows) >= 8, rows
    known = schema().sections
    named = [m for row in rows for m in OPTION.findall(row)]
    assert {("healthcheck", "debug"), ("healthcheck", "timeout"), ("healthcheck", "log")} <= set(
        named
    )
    assert not [f"[{t}] {k}" for t, k in named if k not in known.get(t, {})]
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    flags = {o for a in sub["healthcheck"]._actions for o in a.option_strings}
    for flag in re.findall(r"`hma healthcheck (-[-a-z]+)", body):
        assert flag in flags, flag
    assert {"-d", "-t", "--quiet"} <= flags
