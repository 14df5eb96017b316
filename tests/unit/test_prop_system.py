"""Property: the system probe over the healthy fixture root with one value garbled or one file or
folder made unreadable never gives a critical finding, never a traceback (docs/unknown.md). Garbled
includes what ``int(text.strip())`` would read as a number (Unicode spaces, hex, -1 written
unsigned, a read cut at its limit), a meminfo key written twice, and a cpulist whose ranges
overlap or are out of order.
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
    lenient_number,
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


@SETTINGS
@given(which=st.sampled_from(FILES), value=lenient_number())
def test_leniently_numeric_file_is_never_critical(root: Path, which: str, value: str) -> None:
    path = root / which
    if which == "proc/meminfo":  # the value of MemTotal (the first line)
        first, rest = path.read_text().split("\n", 1)
        value = f"{first.partition(':')[0]}: {value} kB\n{rest}"
    with mutated_file(path, ("text", value)):
        assert critical(root) == [], f"{which}: {value[:40]!r}"


@SETTINGS
@given(
    line=st.integers(min_value=0),
    key=st.sampled_from(("MemTotal", "MemAvailable")),
    kib=st.integers(min_value=0, max_value=2**40),
)
def test_meminfo_key_written_twice_is_never_critical(
    root: Path, line: int, key: str, kib: int
) -> None:
    path = root / "proc/meminfo"
    lines = path.read_text().splitlines()
    lines.insert(line % (len(lines) + 1), f"{key}:  {kib} kB")
    with mutated_file(path, ("text", "\n".join(lines) + "\n")):
        assert critical(root) == [], f"{key} {kib} at {line % (len(lines))}"


CPUS = 192  # the healthy root's 0-191


@st.composite
def covering_cpulist(draw: st.DrawFn) -> str:
    """A cpulist naming exactly CPUs 0-191, its ranges possibly overlapping or out of order."""
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=CPUS - 1), max_size=6)))
    bounds = [0, *cuts, CPUS]
    ranges = [(lo, hi - 1) for lo, hi in zip(bounds, bounds[1:])]
    cpu = st.integers(min_value=0, max_value=CPUS - 1)
    ranges += [(min(a, b), max(a, b)) for a, b in draw(st.lists(st.tuples(cpu, cpu), max_size=3))]
    ranges = draw(st.permutations(ranges))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges) + "\n"


@SETTINGS
@given(which=st.sampled_from(("online", "present")), text=covering_cpulist())
def test_overlapping_or_unordered_cpulist_is_never_critical(
    root: Path, which: str, text: str
) -> None:
    with mutated_file(root / "sys/devices/system/cpu" / which, ("text", text)):
        assert critical(root) == [], f"{which}: {text!r}"
