"""The system probe under the hardened unit: ProtectSystem=strict makes every path read-only at
the mount level; only the filesystem's own (superblock) read-only flag is a node fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.probe import ProbeContext
from hma.probes.system.probe import SystemProbe, _mounts

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


def snapshot(mounts: list, writable: bool, mount_readonly: bool = True) -> dict:
    fs = {"exists": True, "free_percent": 50.0, "inodes_free_percent": 50.0}
    return {
        "errors": {},
        "mounts": mounts,
        "filesystems": {
            "/": {**fs, "writable": writable, "mount_readonly": mount_readonly and not writable}
        },
        "meminfo": None,
        "processes_wanted": [],
        "processes": [],
        "edac": {},
        "cpus": {"online": 4, "present": 4},
    }


def fs_codes(mountinfo: str, tmp_path: Path, writable: bool) -> list[str]:
    ctx = context(tmp_path, mountinfo)
    findings = SystemProbe().evaluate(snapshot(_mounts(ctx), writable), ctx)
    return sorted(f.code for f in findings if f.code.startswith("SYS_FS"))


def test_mountinfo_rows_carry_filesystem_and_mount_options(tmp_path: Path) -> None:
    rows = _mounts(context(tmp_path, SANDBOX))
    assert rows[1] == ["/", "ext4", "rw,errors=remount-ro", "ro,relatime"]
    assert rows[2][0] == "/my data"


@pytest.mark.parametrize(
    "mountinfo, writable, codes",
    [
        (SANDBOX, False, []),  # the agent's sandbox: not the node's problem
        (FAILED, False, ["SYS_FS_READONLY"]),  # the disk itself went read-only
        (FAILED, True, ["SYS_FS_READONLY"]),
    ],
)
def test_only_a_read_only_filesystem_is_a_fault(
    tmp_path: Path, mountinfo: str, writable: bool, codes: list
) -> None:
    assert fs_codes(mountinfo, tmp_path, writable) == codes


def test_not_writable_on_a_writable_mount_is_still_a_fault(tmp_path: Path) -> None:
    ctx = context(tmp_path, "25 1 259:1 / / rw - ext4 /dev/sda1 rw\n")
    findings = SystemProbe().evaluate(snapshot(_mounts(ctx), False, mount_readonly=False), ctx)
    assert [f.code for f in findings if f.code.startswith("SYS_FS")] == ["SYS_FS_READONLY"]


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
    snap = snapshot(rows, writable=True)
    snap["filesystems"]["/tmp"] = dict(snap["filesystems"]["/"])
    findings = SystemProbe().evaluate(snap, ctx)
    assert [f.code for f in findings] == []
