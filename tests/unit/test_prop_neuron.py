"""Property: a generated Neuron sysfs tree with one file or folder made unreadable or garbled never
gives a critical finding, never a traceback (docs/unknown.md). Each example mutates one path of a
shared tree and puts it back. Garbled includes what ``int(text.strip())`` would read as a number
(Unicode spaces, hex, -1 written unsigned, a read cut at its limit), and a path unreadable in the
previous run only (its lifetime totals establish a baseline, never growth).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import (
    Mutation,
    broken,
    budget,
    file_mutation,
    files_under,
    folder_mutation,
    lenient_number,
    mutated_file,
)
from trn_support import gen_sysfs, make_ctx

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.probes.neuron.probe import BASE, NeuronProbe

PROBE = NeuronProbe()
CATALOGUE = load_builtin()
SETTINGS = budget(100)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two trn2 devices, their healthy snapshot as the previous run, and the paths to mutate."""
    root = gen_sysfs.build(tmp_path_factory.mktemp("neuron"), "trn2.48xlarge", neuron_devices=2)
    base = root / BASE
    ctx = make_ctx(NeuronProbe, root, None, expected_devices=2)
    healthy = PROBE.collect(ctx)
    assert PROBE.evaluate(healthy, ctx) == []
    folders = [base, *sorted(p for p in base.rglob("*") if p.is_dir() and not p.is_symlink())]
    yield {"root": root, "previous": healthy, "files": files_under(base), "folders": folders}


def critical(tree: dict[str, Any]) -> list:
    ctx = make_ctx(NeuronProbe, tree["root"], None, previous=tree["previous"], expected_devices=2)
    if PROBE.applies(ctx) is not None:
        return []
    found = [CATALOGUE.resolve(f) for f in PROBE.evaluate(PROBE.collect(ctx), ctx)]
    return [(f.code, f.message) for f in found if f.severity is Severity.CRITICAL]


@SETTINGS
@given(position=st.integers(min_value=0), mutation=file_mutation())
def test_garbled_file_is_never_critical(
    tree: dict[str, Any], position: int, mutation: Mutation
) -> None:
    path: Path = tree["files"][position % len(tree["files"])]
    with mutated_file(path, mutation):
        assert critical(tree) == [], f"{path}: {mutation!r}"


@SETTINGS
@given(position=st.integers(min_value=0), shape=folder_mutation())
def test_unreadable_folder_is_never_critical(
    tree: dict[str, Any], position: int, shape: str
) -> None:
    path: Path = tree["folders"][position % len(tree["folders"])]
    with broken(path, shape):
        assert critical(tree) == [], f"{path}: {shape}"


@SETTINGS
@given(position=st.integers(min_value=0), value=lenient_number())
def test_leniently_numeric_file_is_never_critical(
    tree: dict[str, Any], position: int, value: str
) -> None:
    path: Path = tree["files"][position % len(tree["files"])]
    with mutated_file(path, ("text", value)):
        assert critical(tree) == [], f"{path}: {value[:40]!r}"


TOTALS = 7  # lifetime error totals the driver counted before hma first read them


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two trn2 devices whose every lifetime total is non-zero, and the paths to mutate."""
    root = gen_sysfs.build(tmp_path_factory.mktemp("counted"), "trn2.48xlarge", neuron_devices=2)
    base = root / BASE
    for total in base.glob("neuron*/neuron_core*/stats/*/*/total"):
        total.write_text(f"{TOTALS}\n")
    folders = [base, *sorted(p for p in base.rglob("*") if p.is_dir() and not p.is_symlink())]
    yield {"root": root, "files": files_under(base), "folders": folders}


def critical_after(counted: dict[str, Any], first: Any) -> list:
    """Critical findings of a healthy run whose previous snapshot is ``first``."""
    ctx = make_ctx(NeuronProbe, counted["root"], None, previous=first, expected_devices=2)
    found = [CATALOGUE.resolve(f) for f in PROBE.evaluate(PROBE.collect(ctx), ctx)]
    return [(f.code, f.message) for f in found if f.severity is Severity.CRITICAL]


def first_sample(counted: dict[str, Any]) -> Any:
    return PROBE.collect(make_ctx(NeuronProbe, counted["root"], None, expected_devices=2))


@SETTINGS
@given(position=st.integers(min_value=0), shape=folder_mutation())
def test_folder_unreadable_in_the_first_sample_is_never_growth(
    counted: dict[str, Any], position: int, shape: str
) -> None:
    path: Path = counted["folders"][position % len(counted["folders"])]
    with broken(path, shape):
        first = first_sample(counted)
    assert critical_after(counted, first) == [], f"{path}: {shape}"


@SETTINGS
@given(position=st.integers(min_value=0), mutation=file_mutation())
def test_file_unreadable_in_the_first_sample_is_never_growth(
    counted: dict[str, Any], position: int, mutation: Mutation
) -> None:
    path: Path = counted["files"][position % len(counted["files"])]
    with mutated_file(path, mutation):
        first = first_sample(counted)
    assert critical_after(counted, first) == [], f"{path}: {mutation!r}"
