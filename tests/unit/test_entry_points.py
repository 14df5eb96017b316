"""Entry points (issue 27): hma's own read from its entry_points.txt, a third-party
distribution's through importlib.metadata, only when it names an hma group; the first
distribution of a name on the path wins; which reporters and backends ``assembly.load`` imports."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import pytest

from hma import assembly
from hma.adapters import entrypoints
from hma.detection import registry


def dist(folder: Path, name: str, entry_points: str) -> None:
    meta = folder / f"{name}-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if entry_points:
        (meta / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``sys.path`` with two folders of distributions ahead of the real one."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    entrypoints.rescan()
    yield tmp_path
    entrypoints.rescan()


@pytest.mark.parametrize(
    ("entry_points", "found"),
    [
        ("[hma.probes]\nextra = hma_extra:Probe\n", [("hma.probes", "extra", "hma_extra:Probe")]),
        (
            "[hma.reporters]\nr = m:R\n[console_scripts]\nx = m:main\n",
            [("hma.reporters", "r", "m:R")],
        ),
        ("[console_scripts]\nx = m:main\n", []),  # no hma group: not read through metadata
        ("", []),  # no entry_points.txt
    ],
)
def test_third_party_entry_points(
    path: Path, monkeypatch: pytest.MonkeyPatch, entry_points: str, found: list[Any]
) -> None:
    dist(path / "first", "hma_extra_plugins", entry_points)
    read: list[str] = []
    at = metadata.Distribution.at

    def counted(folder: Any) -> metadata.Distribution:
        read.append(str(folder))
        return at(folder)

    monkeypatch.setattr(metadata.Distribution, "at", staticmethod(counted))
    third = [
        (ep.group, ep.name, ep.value)
        for ep in entrypoints.installed()
        if ep.value.startswith(("hma_extra", "m:"))
    ]
    assert third == found
    ours = [Path(f).parent.name for f in read if f.startswith(str(path))]
    assert ours == (["first"] if found else [])


def test_the_first_distribution_of_a_name_wins(path: Path) -> None:
    dist(path / "first", "hma_twice", "[hma.probes]\nfirst = hma_twice_a:P\n")
    dist(path / "second", "hma_twice", "[hma.probes]\nsecond = hma_twice_b:P\n")
    names = registry.entry_point_names()
    assert "first" in names and "second" not in names


def test_own_entry_points_suffice_for_built_in_names(path: Path) -> None:
    dist(path / "first", "hma_extra_plugins", "[hma.probes]\nextra = hma_extra:Probe\n")
    assert registry.entry_point_names(among=["system"]) == registry.entry_point_names(
        among=["system", "gpu"]
    )
    assert "extra" not in registry.entry_point_names(among=["system"])
    assert "extra" in registry.entry_point_names(among=["system", "extra"])


@pytest.mark.parametrize(
    ("raw", "only", "remediates", "expected"),
    [
        ({}, None, False, (None, None)),  # every installed reporter and backend
        ({}, None, True, (None, None)),
        ({}, ["system"], False, (set(), set())),  # `hma check system` on a bare file: none
        (
            {"reporters": {"journald": {}}, "slurm": {}},
            ["system"],
            False,
            ({"journald"}, {"slurm"}),
        ),
        ({}, ["system"], True, (None, {"slurm"})),  # `hma healthcheck`: the default backend
        ({"cluster": {"backend": "other"}}, ["system"], True, (None, {"other", "slurm"})),
    ],
)
def test_plugin_names_load_imports(
    raw: dict[str, Any], only: Any, remediates: bool, expected: Any
) -> None:
    assert assembly._plugin_names(raw, only, remediates) == expected


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("[hma.probes]\na = m:A\n", [("hma.probes", "a", "m:A")]),
        ("[ hma.probes ]\n  a=m:A.b  \n", [("hma.probes", "a", "m:A.b")]),
        ("a = m:A\n[hma.probes]\n", []),  # before any group: not an entry point
        ("[hma.probes]\n# a = m:A\n; b = m:B\n\n", []),  # comments and blank lines
        (
            "[hma.probes]\na = m:A\n[hma.repairs]\nr = n:R\n",
            [("hma.probes", "a", "m:A"), ("hma.repairs", "r", "n:R")],
        ),
    ],
)
def test_parse_entry_points_txt(text: str, parsed: list[Any]) -> None:
    assert [(ep.group, ep.name, ep.value) for ep in entrypoints.parse(text)] == parsed


def test_one_by_name_hma_s_own_first_then_the_first_on_the_path(path: Path) -> None:
    dist(path / "first", "hma_shadow", "[hma.repairs]\ngpu_reset = elsewhere:R\nx = mod:X\n")
    assert entrypoints.find("hma.repairs", "gpu_reset").value == "hma.probes.nvidia.reset:GpuReset"
    assert entrypoints.find("hma.repairs", "x").value == "mod:X"
    assert entrypoints.find("hma.repairs", "none") is None
    with pytest.raises(LookupError):
        entrypoints.load("hma.repairs", "none")
