"""Repository layout rules that pytest and packaging rely on."""

from __future__ import annotations

import configparser
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


def test_builtin_plugins_live_in_their_group_folder() -> None:
    """Each built-in entry point of ``hma.probes``/``hma.sources`` names a module of probes/ or
    sources/ (the folders setup.cfg installs under those names): event sources are not probes."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    folders = dict(
        line.replace(" ", "").split("=")
        for line in cfg["options"]["package_dir"].strip().splitlines()
    )
    entry_points = cfg["options.entry_points"]
    for group in ("hma.probes", "hma.sources"):
        folder = ROOT / folders[group]
        names = [
            line.partition("=")[2].strip() for line in entry_points[group].strip().splitlines()
        ]
        assert names, group
        for target in names:
            module = target.partition(":")[0]
            assert module.rpartition(".")[0] == group, target
            assert (folder / f"{module.rpartition('.')[2]}.py").is_file(), target


def test_every_package_is_installed() -> None:
    """Each folder of hma/ with an ``__init__.py`` is in setup.cfg ``packages`` (the editable
    install finds a missing one, the .deb and .rpm do not)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    listed = set(cfg["options"]["packages"].split())
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hma").rglob("__init__.py")
    }
    assert found - listed == set()
