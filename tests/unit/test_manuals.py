"""packaging/manuals.py's man pages and shell completion, generated here as the package build
does and checked as the install tests check the installed ones (tests/install/installed.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.install import installed

ROOT = Path(__file__).resolve().parents[2]
MANUALS = ROOT / "packaging" / "manuals.py"
pytest.importorskip("argparse_manpage")
pytest.importorskip("shtab")


@pytest.fixture(scope="module")
def manuals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("manuals")
    res = subprocess.run(
        [sys.executable, str(MANUALS), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "SOURCE_DATE_EPOCH": "0"},
    )
    assert res.returncode == 0 and not res.stderr, res.stderr
    return out


def test_pages_list_the_probes_and_every_exit_status(manuals: Path) -> None:
    pages = {page: manuals / "man" / f"{page}.1" for page in installed.parsers()}
    assert sorted(p.name for p in (manuals / "man").iterdir()) == sorted(
        f"{page}.1" for page in pages
    )
    installed.check_pages(pages)


def test_completion_offers_probes_and_codes(manuals: Path) -> None:
    installed.check_bash(manuals / "completion" / "hma.bash")
    installed.check_zsh(manuals / "completion" / "_hma")


def test_the_exit_column_of_every_command(manuals: Path) -> None:
    page = (manuals / "man" / "hma-ack.1").read_text()
    assert r"0, 1 nothing to ack, 2 misuse" in page
    assert r"\fBhma ack CODE [COMPONENT]\fR" in page
