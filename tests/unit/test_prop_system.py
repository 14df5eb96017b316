"""Property: the system probe over the healthy fixture root with one value garbled or one file or
folder made unreadable never gives a critical finding, never a traceback (docs/unknown.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import (
    Mutation,
    broken,
    budget,
    file_mutation,
    folder_mutation,
    garbage_text,
    mutated_file,
)

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.contracts.probe import ProbeContext
from hma.probes.system.probe import SystemProbe

HEALTHY = Path(__file__).resolve().parents[1] / "fixtures" / "roots" / "healthy"
PROBE = SystemProbe()
CATALOGUE = load_builtin()
SETTINGS = budget(80)
FILES = [
    "proc/meminfo",
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/present",
    "sys/devices/system/edac/mc/mc0/ce_count",
    "sys/devices/system/edac/mc/mc0/ue_count",
    "sys/devices/system/edac/mc/mc1/ce_count",
]
FOLDERS = ["sys/devices/system/edac/mc", "sys/devices/system/edac/mc/mc1", "sys/devices/system/cpu"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    copy = tmp_path_factory.mktemp("system") / "root"
    shutil.copytree(HEALTHY, copy, symlinks=True)
    yield copy


def critical(root: Path) -> list:
    opts = {k: o.default for k, o in PROBE.options.items()}
    opts.update(filesystems=[], processes=[], expected_memory_gib=2000)
    ctx = ProbeContext(
        opts, RootReader(str(root / "sys")), RootReader(str(root / "proc")), CommandRunner()
    )
    snap = PROBE.collect(ctx)
    ctx.previous = snap  # a garbled counter must not read as growth either
    found = [CATALOGUE.resolve(f) for f in PROBE.evaluate(snap, ctx)]
    return [(f.code, f.message) for f in found if f.severity is Severity.CRITICAL]


def test_healthy_root_is_healthy(root: Path) -> None:
    assert critical(root) == []


@SETTINGS
@given(line=st.integers(min_value=0), value=garbage_text())
def test_garbled_meminfo_value_is_never_critical(root: Path, line: int, value: str) -> None:
    path = root / "proc/meminfo"
    original = path.read_text()
    lines = original.splitlines()
    index = line % len(lines)
    key, _, _rest = lines[index].partition(":")
    lines[index] = f"{key}: {value} kB"
    path.write_text("\n".join(lines) + "\n")
    try:
        assert critical(root) == [], f"{key}: {value!r}"
    finally:
        path.write_text(original)


@SETTINGS
@given(which=st.sampled_from(FILES), mutation=file_mutation())
def test_garbled_file_is_never_critical(root: Path, which: str, mutation: Mutation) -> None:
    with mutated_file(root / which, mutation):
        assert critical(root) == [], f"{which}: {mutation!r}"


@SETTINGS
@given(which=st.sampled_from(FOLDERS), shape=folder_mutation())
def test_unreadable_folder_is_never_critical(root: Path, which: str, shape: str) -> None:
    with broken(root / which, shape):
        assert critical(root) == [], f"{which}: {shape}"
