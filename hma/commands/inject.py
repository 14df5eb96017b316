"""``hma inject xid``: write a well-formed NVRM Xid line to /dev/kmsg to test alerting end to end.

The line goes through the same path as a real one: the kernel_log source matches it, the health
model raises the fault and, for a draining Xid under recovery policy ``automatic``, the node is
really drained and rebooted. Hence root only and an explicit confirmation flag.
"""

from __future__ import annotations

import argparse
import os
import sys

from hma.contracts.model import gpu_component
from hma.probes.nvidia import xid

DEFAULT_TEXT = "injected by hma inject (test of alerting and drain, not a hardware fault)"
KMSG_LEVEL = 4  # warning; the kernel files writes from user space under the user facility


def kmsg_record(pci: str, number: int, text: str = DEFAULT_TEXT) -> bytes:
    """The bytes written to /dev/kmsg: ``<4>NVRM: Xid (PCI:...): N, pid=..., name=..., text``."""
    return f"<{KMSG_LEVEL}>{xid.format_xid_line(pci, number, text)}\n".encode()


def inject_xid(pci: str, number: int, path: str = "/dev/kmsg", text: str = DEFAULT_TEXT) -> str:
    """Write one record to ``path`` (one write call, as /dev/kmsg requires); returns the line."""
    data = kmsg_record(pci, number, text)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
    if not path.startswith("/dev/"):
        flags |= os.O_CREAT  # tests point it at a plain file
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return data.decode().rstrip("\n")[3:]


def main(args: argparse.Namespace, euid: int = -1) -> int:
    """``hma inject xid`` handler: 0 written, 2 refused or invalid, 1 write failed."""
    euid = os.geteuid() if euid < 0 else euid
    try:
        component = gpu_component(args.gpu)
    except (ValueError, IndexError):
        print(
            f"hma inject: --gpu {args.gpu!r} is not a PCI bus id (e.g. 0000:3b:00.0)",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.xid < 100000:
        print(f"hma inject: --xid {args.xid} is out of range", file=sys.stderr)
        return 2
    code = xid.xid_code(args.xid)
    if not args.yes_really_drain:
        print(
            f"hma inject: this writes an Xid {args.xid} line for {component} to {args.kmsg};"
            f" the agent raises {code} and, if that code drains and recovery policy is"
            " automatic, really drains and reboots this node. Add --yes-really-drain to go ahead.",
            file=sys.stderr,
        )
        return 2
    if euid != 0:
        print("hma inject: only root may write to /dev/kmsg", file=sys.stderr)
        return 2
    try:
        line = inject_xid(args.gpu, args.xid, args.kmsg, args.text or DEFAULT_TEXT)
    except OSError as exc:
        print(f"hma inject: cannot write {args.kmsg}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote to {args.kmsg}: {line}\nexpect {code} on {component} (`hma status`)")
    return 0
