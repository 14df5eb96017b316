"""Required processes against the kernel's 15-character ``comm`` (issue 23): a running
``nv-fabricmanager`` (16 characters) is found, under the configured procfs root."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import pytest
from conftest import FIXTURES

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader, running_processes
from hma.contracts.probe import ProbeContext
from hma.probes.nvidia.gpu import process_running
from hma.probes.system.probe import SystemProbe

FM = "nv-fabricmanager"


def procfs(tmp_path: Path, comm: str, cmdline: Optional[bytes]) -> Path:
    """The healthy fixture root with one more process (``cmdline`` None: no such file)."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "roots" / "healthy", root, symlinks=True)
    pid = root / "proc" / "4242"
    pid.mkdir()
    (pid / "comm").write_text(comm + "\n")
    if cmdline is not None:
        (pid / "cmdline").write_bytes(cmdline)
    return root


def missing(root: Path, wanted: list[str]) -> list[str]:
    opts = {k: o.default for k, o in SystemProbe.options.items()}
    opts.update(filesystems=[], processes=wanted)
    ctx = ProbeContext(
        opts, RootReader(str(root / "sys")), RootReader(str(root / "proc")), CommandRunner()
    )
    probe = SystemProbe()
    findings = probe.evaluate(probe.collect(ctx), ctx)
    return [f.details["process"] for f in findings if f.code == "SYS_PROCESS_MISSING"]


@pytest.mark.parametrize(
    "cmdline",
    [b"/usr/bin/nv-fabricmanager\0-c\0/usr/share/nvidia/nvswitch/fabricmanager.cfg\0", b"", None],
)
def test_long_name_runs_under_its_truncated_comm(tmp_path: Path, cmdline: Optional[bytes]) -> None:
    root = procfs(tmp_path, FM[:15], cmdline)
    assert missing(root, [FM]) == []
    assert process_running(RootReader(str(root / "proc")), FM) is True


@pytest.mark.parametrize(
    "comm, cmdline",
    [
        (FM[:15], b"./nv-fabricmanagerX\0"),  # another program with the same 15 characters
        ("nv-fabricmanag", b"/usr/bin/nv-fabricmanager\0"),  # comm shorter than the kernel's
    ],
)
def test_other_programs_are_not_the_long_name(tmp_path: Path, comm: str, cmdline: bytes) -> None:
    root = procfs(tmp_path, comm, cmdline)
    assert missing(root, [FM]) == [FM]
    assert process_running(RootReader(str(root / "proc")), FM) is False


def test_names_of_15_characters_or_less_match_comm(tmp_path: Path) -> None:
    root = procfs(tmp_path, "nv-fabricmanage", b"/opt/x/other\0")
    reader = RootReader(str(root / "proc"))
    assert running_processes(reader, ["nv-fabricmanage", FM, "slurmd"]) == {
        "nv-fabricmanage",
        "slurmd",
    }


@pytest.mark.parametrize(
    "comm", [" munged ", "munged ", " munged", "\tmunged", "munged\r", "munged\n"]
)
def test_blanks_around_a_name_are_another_process(tmp_path: Path, comm: str) -> None:
    # the kernel's comm is compared exactly (only the newline /proc/PID/comm ends with goes)
    root = procfs(tmp_path, comm, b"munged\0")
    assert missing(root, ["munged"]) == ["munged"]
    assert running_processes(RootReader(str(root / "proc")), ["munged"]) == set()
    assert process_running(RootReader(str(root / "proc")), "munged") is False


def test_a_long_name_s_comm_is_compared_exactly(tmp_path: Path) -> None:
    root = procfs(tmp_path, f" {FM[:15]}", b"/usr/bin/nv-fabricmanager\0")
    assert missing(root, [FM]) == [FM]
    assert missing(procfs(tmp_path / "b", "munged", None), ["munged"]) == []
