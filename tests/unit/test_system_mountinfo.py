"""The system probe under the hardened unit: ProtectSystem=strict makes every path read-only at
the mount level; only the filesystem's own (superblock) read-only flag is a node fault."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.catalogue import load_builtin
from hma.contracts.model import ProbeRun, RunStatus
from hma.contracts.probe import ProbeContext
from hma.health.model import HealthModel
from hma.probes.system.probe import SystemProbe, _mounts
from hma.remediation import planner

# What /proc/self/mountinfo shows inside a ProtectSystem=strict service: the host's root mount,
# then the read-only bind mount of it that systemd stacks on top.
SANDBOX = """\
25 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw,errors=remount-ro
300 25 259:1 / / ro,relatime shared:200 - ext4 /dev/nvme0n1p1 rw,errors=remount-ro
301 300 0:5 / /my\\040data rw,nosuid master:2 - xfs /dev/nvme1n1 rw
"""
# A disk remounted read-only by the kernel after I/O errors: the superblock says ro.
FAILED = """\
25 1 259:1 / / ro,relatime shared:1 - ext4 /dev/nvme0n1p1 ro,errors=remount-ro
"""


def context(tmp_path: Path, mountinfo: str) -> ProbeContext:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountinfo").write_text(mountinfo)
    opts = {k: o.default for k, o in SystemProbe.options.items()}
    return ProbeContext(
        opts, RootReader("/nonexistent"), RootReader(str(tmp_path)), CommandRunner()
    )


def snapshot(mounts: list, mount_readonly: bool) -> dict:
    fs = {"exists": True, "free_percent": 50.0, "inodes_free_percent": 50.0}
    return {
        "errors": {},
        "mounts": mounts,
        "filesystems": {"/": {**fs, "mount_readonly": mount_readonly}},
        "meminfo": None,
        "processes_wanted": [],
        "processes": [],
        "edac": {},
        "cpus": {"online": 4, "present": 4},
    }


def fs_codes(mountinfo: str, tmp_path: Path, mount_readonly: bool) -> list[str]:
    ctx = context(tmp_path, mountinfo)
    findings = SystemProbe().evaluate(snapshot(_mounts(ctx), mount_readonly), ctx)
    return sorted(f.code for f in findings if f.code.startswith("SYS_FS"))


def test_mountinfo_rows_carry_filesystem_and_mount_options(tmp_path: Path) -> None:
    rows = _mounts(context(tmp_path, SANDBOX))
    assert rows[1] == ["/", "ext4", "rw,errors=remount-ro", "ro,relatime"]
    assert rows[2][0] == "/my data"


@pytest.mark.parametrize(
    "mountinfo, mount_readonly, codes",
    [
        (SANDBOX, True, []),  # the agent's sandbox: not the node's problem
        (FAILED, True, ["SYS_FS_READONLY"]),  # the disk itself went read-only
        ("25 1 259:1 / / rw - ext4 /dev/sda1 rw\n", False, []),
    ],
)
def test_only_a_read_only_filesystem_is_a_fault(
    tmp_path: Path, mountinfo: str, mount_readonly: bool, codes: list
) -> None:
    assert fs_codes(mountinfo, tmp_path, mount_readonly) == codes


def test_a_read_only_mount_without_a_mount_table_is_unknown(tmp_path: Path) -> None:
    ctx = context(tmp_path, "")
    findings = SystemProbe().evaluate(snapshot([], mount_readonly=True), ctx)
    assert [(f.code, str(f.severity)) for f in findings] == [("SYS_FS_READONLY", "unknown")]


def _collect_as(uid: int, root: str) -> dict:
    """The probe's collect run in a child that dropped to ``uid`` (as an NRPE wrapper runs)."""
    import json

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, collect, send the snapshot, exit without cleanup
        code = 1
        try:
            os.close(rfd)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            opts = {k: o.default for k, o in SystemProbe.options.items()}
            opts["filesystems"], opts["processes"] = [root], []
            ctx = ProbeContext(opts, RootReader("/sys"), RootReader("/proc"), CommandRunner())
            os.write(wfd, json.dumps(SystemProbe().collect(ctx)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_a_folder_the_user_cannot_write_is_not_a_read_only_filesystem() -> None:
    snap = _collect_as(65534, "/")  # `hma check system` as nobody: / is root's, rw
    assert snap["filesystems"]["/"]["exists"] and not snap["filesystems"]["/"]["mount_readonly"]
    opts = {k: o.default for k, o in SystemProbe.options.items()}
    ctx = ProbeContext(opts, RootReader("/sys"), RootReader("/proc"), CommandRunner())
    codes = [f.code for f in SystemProbe().evaluate(snap, ctx) if f.code.startswith("SYS_FS_")]
    assert "SYS_FS_READONLY" not in codes and "SYS_FS_MISSING" not in codes, codes


# A user's FUSE mount (fusermount needs no root) at a folder whose name holds U+2028 (a line
# separator to str.splitlines) and U+2003 spaces (blanks to str.split): read that way, the rest of
# its line posed as a read-only filesystem mounted on /tmp. The kernel escapes only ASCII blanks.
FUSE_PATH = "/home/u/x\u20289\u20031\u20030:1\u2003/\u2003/tmp"
FORGED = f"""\
25 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw,errors=remount-ro
90 25 0:77 / {FUSE_PATH} rw,nosuid,nodev shared:50 - fuse.sshfs host:/x ro,user_id=1000
"""


def test_unicode_line_and_space_separators_do_not_forge_a_mount(tmp_path: Path) -> None:
    ctx = context(tmp_path, FORGED)
    rows = _mounts(ctx)
    assert [row[0] for row in rows] == ["/", FUSE_PATH]
    snap = snapshot(rows, mount_readonly=False)
    snap["filesystems"]["/tmp"] = dict(snap["filesystems"]["/"])
    findings = SystemProbe().evaluate(snap, ctx)
    assert [f.code for f in findings] == []


# Two disks that went read-only under their own mount points (one with a blank in its name),
# and a healthy root.
TWO_BROKEN = """\
25 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
40 25 259:2 / /scratch rw,relatime shared:2 - xfs /dev/nvme1n1 ro
41 25 259:3 / /my\\040data rw,relatime shared:3 - ext4 /dev/nvme2n1 ro,errors=remount-ro
"""


def test_each_broken_mount_is_its_own_fault_named_by_its_mount(tmp_path: Path) -> None:
    ctx = context(tmp_path, TWO_BROKEN)
    fs = {"exists": True, "free_percent": 1.0, "inodes_free_percent": 50.0}
    snap = snapshot(_mounts(ctx), mount_readonly=True)
    snap["filesystems"] = {"/": {**fs, "free_percent": 50.0}, "/scratch/jobs": fs, "/my data": fs}
    findings = SystemProbe().evaluate(snap, ctx)
    got = sorted((f.code, f.component) for f in findings if f.code.startswith("SYS_FS"))
    assert got == [
        ("SYS_FS_FULL", "fs:/my\\040data"),
        ("SYS_FS_FULL", "fs:/scratch"),
        ("SYS_FS_READONLY", "fs:/my\\040data"),
        ("SYS_FS_READONLY", "fs:/scratch"),
    ]
    # two mounts, two faults; the drain reason names the mount
    model = HealthModel(load_builtin(), "boot")
    resolved = load_builtin().resolve_all([f.with_(probe="system") for f in findings])
    for now in (1, 2):  # SYS_FS_READONLY fails after two runs
        verdict = model.observe_run(ProbeRun("system", RunStatus.RAN, 0, 0, tuple(resolved)), now)
    readonly = sorted(f.component for f in verdict.faults if f.code == "SYS_FS_READONLY")
    assert readonly == ["fs:/my\\040data", "fs:/scratch"]
    reasons = {planner.reason_for(f) for f in verdict.faults if f.code == "SYS_FS_READONLY"}
    assert "HMA: SYS_FS_READONLY fs:/scratch" in reasons


def test_a_path_without_a_mount_table_is_named_by_itself(tmp_path: Path) -> None:
    ctx = context(tmp_path, "")
    snap = snapshot([], mount_readonly=True)
    snap["filesystems"]["/gone"] = {"exists": False}
    findings = SystemProbe().evaluate(snap, ctx)
    assert sorted((f.code, f.component) for f in findings) == [
        ("SYS_FS_MISSING", "fs:/gone"),
        ("SYS_FS_READONLY", "fs:/"),
    ]
