"""Repository layout rules that pytest and packaging rely on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_test_module_basenames_are_unique() -> None:
    """pytest imports test modules by basename (no __init__.py): duplicates fail collection."""
    names = Counter(
        p.name
        for p in (ROOT / "tests").rglob("test_*.py")
        if "__init__.py" not in {q.name for q in p.parent.iterdir()}
    )
    assert [n for n, c in names.items() if c > 1] == []
