"""The system probe over committed fixture roots, and the golden `hma check --json`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import FIXTURES

ROOTS = FIXTURES / "roots"
GOLDEN = FIXTURES / "golden"


def configure(hma_env, variant: str, extra: str = "") -> None:  # type: ignore[no-untyped-def]
    root = ROOTS / variant
    hma_env.write(
        f'[paths]\nsysfs = "{root}/sys"\nprocfs = "{root}/proc"\n'
        f'[probes.system]\nfilesystems = ["/"]\nexpected_memory_gib = 2000\n'
        f'processes = ["slurmd"]\n' + extra
    )


def normalized(stdout: str) -> dict:
    doc = json.loads(stdout)
    doc["node"] = "<node>"
    for probe in doc["probes"]:
        probe["duration_s"] = 0.0
        for f in probe["findings"]:
            for key in ("free_percent", "inodes_free_percent"):
                f["details"].pop(key, None)
    return doc


@pytest.mark.parametrize("variant, rc", [("healthy", 0), ("faulty", 2)])
def test_golden_check_json(hma_env, variant: str, rc: int) -> None:  # type: ignore[no-untyped-def]
    configure(hma_env, variant)
    res = hma_env.hma("check", "system", "--json")
    assert res.returncode == rc, res.stderr
    doc = normalized(res.stdout)
    golden = GOLDEN / f"check-system-{variant}.json"
    if os.environ.get("HMA_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    assert doc == json.loads(golden.read_text())


def test_evaluate_table() -> None:
    from hma.probes.system.probe import SystemProbe, parse_cpulist

    assert parse_cpulist("0-3,8-11,15") == 9
    assert parse_cpulist("0") == 1
    from hma.adapters.command import CommandRunner
    from hma.adapters.files import RootReader
    from hma.contracts.probe import ProbeContext

    opts = {k: o.default for k, o in SystemProbe.options.items()}
    ctx = ProbeContext(
        opts, RootReader("/nonexistent"), RootReader("/nonexistent"), CommandRunner()
    )
    snap = {
        "errors": {"meminfo": "/x/meminfo: No such file"},
        "mounts": [["/", "ext4", "rw"]],
        "filesystems": {
            "/": {
                "exists": True,
                "free_percent": 1.0,
                "inodes_free_percent": 50.0,
            },
            "/gone": {"exists": False},
        },
        "meminfo": None,
        "processes_wanted": [],
        "processes": [],
        "edac": {"mc0": {"ce_count": 500, "ue_count": 0}},
        "cpus": {"online": 4, "present": 4},
    }
    ctx.previous = {"edac": {"mc0": {"ce_count": 10, "ue_count": 0}}}
    codes = sorted(f.code for f in SystemProbe().evaluate(snap, ctx))
    assert codes == ["SYS_FS_FULL", "SYS_FS_MISSING", "SYS_MEM_ECC_CE", "SYS_READ_FAILED"]


def test_unreadable_roots_give_unknown(hma_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hma_env.write(
        f'[paths]\nsysfs = "{tmp_path}/nosys"\nprocfs = "{tmp_path}/noproc"\n'
        "[probes.system]\nfilesystems = []\n"
    )
    res = hma_env.hma("check", "system", "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 3 and doc["severity"] == "unknown"
    codes = {f["code"] for f in doc["probes"][0]["findings"]}
    assert codes == {"SYS_READ_FAILED"}


@pytest.mark.parametrize(
    "rel, text",
    [
        ("proc/meminfo", "MemTotal: -1 kB\nMemAvailable: 1 kB\n"),
        ("proc/meminfo", "MemTotal: 1e9 kB\nMemAvailable: 1 kB\n"),
        ("proc/meminfo", "MemTotal: \u0663 kB\nMemAvailable: 1 kB\n"),
        ("sys/devices/system/cpu/online", "0-1_0\n"),
        ("sys/devices/system/cpu/online", "7-3\n"),
        ("sys/devices/system/cpu/online", "0-" + "9" * 30 + "\n"),
        ("sys/devices/system/edac/mc/mc0/ue_count", "-1\n"),
        ("sys/devices/system/edac/mc/mc1/ce_count", "9" * 30 + "\n"),
    ],
)
def test_garbage_values_are_read_failures(tmp_path: Path, rel: str, text: str) -> None:
    import shutil

    from hma.adapters.command import CommandRunner
    from hma.adapters.files import RootReader
    from hma.contracts.model import Severity
    from hma.contracts.probe import ProbeContext
    from hma.probes.system.probe import SystemProbe

    root = tmp_path / "root"
    shutil.copytree(ROOTS / "healthy", root, symlinks=True)
    (root / rel).write_text(text)
    opts = {k: o.default for k, o in SystemProbe.options.items()}
    opts.update(filesystems=[], processes=[])
    ctx = ProbeContext(
        opts, RootReader(str(root / "sys")), RootReader(str(root / "proc")), CommandRunner()
    )
    probe = SystemProbe()
    findings = probe.evaluate(probe.collect(ctx), ctx)
    assert [(f.code, f.severity) for f in findings] == [("SYS_READ_FAILED", Severity.UNKNOWN)]


MEMINFO = "MemTotal:       2097152000 kB\nMemAvailable:   1900000000 kB\n"


@pytest.mark.parametrize(
    "rel, text",
    [
        ("proc/meminfo", MEMINFO + "MemTotal:       1 kB\n"),  # written twice: which one?
        ("proc/meminfo", "MemTotal:\u20032097152000 kB\nMemAvailable: 1 kB\n"),
        ("proc/meminfo", "MemTotal: 0x7d000000 kB\nMemAvailable: 1 kB\n"),
        ("proc/meminfo", MEMINFO + "Filler: 0 kB\n" * 6000),  # longer than the read: cut
        ("sys/devices/system/cpu/online", "0-95,0-95\n"),  # 192 counted twice
        ("sys/devices/system/cpu/online", "96-191,0-95\n"),
        ("sys/devices/system/cpu/online", "0-191,100\n"),
        ("sys/devices/system/cpu/present", "0-191,0-191\n"),
        ("sys/devices/system/cpu/online", "0-191\u3000\n"),
        ("sys/devices/system/edac/mc/mc0/ue_count", "0x1\n"),
        ("sys/devices/system/edac/mc/mc0/ue_count", f"{2**32 - 1}\n"),
        ("sys/devices/system/edac/mc/mc1/ce_count", f"{2**64 - 1}\n"),
        ("sys/devices/system/edac/mc/mc0/ue_count", "\u20080\n"),
    ],
)
def test_shapes_that_passed_the_strict_parser_are_read_failures(
    tmp_path: Path, rel: str, text: str
) -> None:
    """Issue 23 (5): a duplicate key, a Unicode space, hex in a decimal file, a read cut at its
    limit, overlapping or unordered CPU ranges and -1 written unsigned are unknown."""
    import shutil

    from hma.adapters.command import CommandRunner
    from hma.adapters.files import RootReader
    from hma.contracts.model import Severity
    from hma.contracts.probe import ProbeContext
    from hma.probes.system.probe import SystemProbe

    root = tmp_path / "root"
    shutil.copytree(ROOTS / "healthy", root, symlinks=True)
    (root / rel).write_text(text)
    opts = {k: o.default for k, o in SystemProbe.options.items()}
    opts.update(filesystems=[], processes=[], expected_memory_gib=2000)
    ctx = ProbeContext(
        opts, RootReader(str(root / "sys")), RootReader(str(root / "proc")), CommandRunner()
    )
    probe = SystemProbe()
    snap = probe.collect(ctx)
    ctx.previous = {"edac": {"mc0": {"ce_count": 0, "ue_count": 0}, "mc1": {"ce_count": 0}}}
    findings = probe.evaluate(snap, ctx)
    assert [(f.code, f.severity) for f in findings] == [("SYS_READ_FAILED", Severity.UNKNOWN)]


@pytest.mark.parametrize("text", ["0-3,2", "4-7,0-3", "0-3,3-5", "0,0", "0-3,", ""])
def test_cpulist_overlapping_or_unordered_is_refused(text: str) -> None:
    from hma.adapters.strict import ParseError
    from hma.probes.system.probe import parse_cpulist

    with pytest.raises(ParseError):
        parse_cpulist(text)
    assert parse_cpulist("0-3,4-7") == 8
