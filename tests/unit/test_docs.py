"""Generated reference documents are up to date (run `python -m hma.commands.docs` to refresh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hma.commands.docs import DOCS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(DOCS))
def test_generated_doc_is_current(name: str) -> None:
    assert (ROOT / "docs" / name).read_text() == DOCS[
        name
    ](), f"run: python -m hma.commands.docs ({name})"
