"""The docs match what a user sees: generated reference documents are up to date (run `python -m
hma.commands.docs` to refresh), one HealthCheckProgram everywhere, `sinfo -R` shown whole."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hma.commands.docs import DOCS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(DOCS))
def test_generated_doc_is_current(name: str) -> None:
    assert (ROOT / "docs" / name).read_text() == DOCS[
        name
    ](), f"run: python -m hma.commands.docs ({name})"


def shipped_texts() -> dict[str, str]:
    """What a user reads about hma: README.md, docs/, CONTRIBUTING.md, the parser's help and the
    man pages' sources (packaging/manuals.py)."""
    paths = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    paths += [ROOT / "hma" / "cli.py", ROOT / "packaging" / "manuals.py"]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


def test_one_health_check_program_everywhere() -> None:
    named = {
        (name, program.replace("\\", ""))  # roff escapes the hyphen
        for name, text in shipped_texts().items()
        for program in re.findall(r"HealthCheckProgram=(/\S+?)[`\s]", text)
    }
    assert {name for name, _ in named} >= {"README.md", "docs/slurm.md", "hma/cli.py"}
    assert {program for _, program in named} == {"/usr/bin/hma-healthcheck"}, named


def test_sinfo_reasons_are_shown_whole() -> None:
    """Every `sinfo -R` a page tells a user to run prints the reason whole: `%E` with no width
    (plain `sinfo -R` cuts it at 20 characters)."""
    found = []
    for name, text in shipped_texts().items():
        for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
            for line in block.splitlines():
                command = line.split("#")[0].strip()
                if re.match(r"(\$ )?sinfo\b.*\s-R\b", command):
                    found.append(name)
                    assert re.search(r'-o "[^"]*%E\b', command), (name, line)
                    assert not re.search(r"%\.?\d+E", command), (name, line)
    assert "docs/slurm.md" in found
