"""The mount table (``/proc/self/mountinfo`` under a procfs root), read as the kernel writes it.

Lines split at ``\\n`` and fields at ASCII blanks only: ``str.split()`` and ``splitlines()`` also
split at Unicode spaces and line separators, which a mount point (a user's FUSE mount) may hold;
the kernel escapes only the ASCII blank, tab, newline and backslash (``\\040``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from hma.adapters.files import ReadError, RootReader

LIMIT = 1 << 22  # bytes of a mount table read
_BLANKS = re.compile(r"[ \t]+")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: the device number (``major:minor``), the folder of the file
    system mounted (``root``), where (``point``), its type, source, the file system's own
    (superblock) options and the per-mount options."""

    devno: str
    root: str
    point: str
    fstype: str
    source: str
    super_options: str
    options: str


def fields(line: str) -> list[str]:
    """The fields of a procfs line, split at ASCII blanks only."""
    return [field for field in _BLANKS.split(line) if field]


def unescape(field: str) -> str:
    """A mount table field as it is (the kernel's octal escapes undone)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mountinfo(procfs: RootReader) -> list[Mount]:
    """The rows of ``self/mountinfo`` in the kernel's order ([] when it cannot be read; a line
    that is not one is skipped)."""
    try:
        text = procfs.text("self/mountinfo", limit=LIMIT)
    except ReadError:
        return []
    rows = []
    for line in text.split("\n"):
        left, sep, right = line.partition(" - ")
        before, after = fields(left), fields(right)
        if sep and len(before) >= 6 and len(after) >= 3:
            rows.append(
                Mount(
                    before[2],
                    unescape(before[3]),
                    unescape(before[4]),
                    after[0],
                    unescape(after[1]),
                    after[2],
                    before[5],
                )
            )
    return rows


def mount_of_device(sysfs: RootReader, procfs: RootReader, name: str) -> Optional[str]:
    """Where the file system on block device ``name`` (as the kernel names it in its messages:
    ``sda1``, ``nvme0n1p1``, ``dm-0``) is mounted: the first mount of its whole file system
    (root ``/``) with its device number (sysfs ``class/block/NAME/dev``), else of source
    ``/dev/NAME``; None when it is not mounted or cannot be told."""
    if not name or "/" in name or name in (".", ".."):
        return None
    try:
        devno: Optional[str] = sysfs.text(f"class/block/{name}/dev")
    except ReadError:
        devno = None
    rows = mountinfo(procfs)
    for wanted in (
        lambda m: m.devno == devno,
        lambda m: m.source == f"/dev/{name}",
    ):
        hits = [m for m in rows if wanted(m)]
        whole = [m for m in hits if m.root == "/"]
        if whole or hits:
            return (whole or hits)[0].point
    return None
