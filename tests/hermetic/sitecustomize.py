"""Test guard (on PYTHONPATH for every Python process the tests start, tests/conftest.py): no test
reads the machine's real kernel log. Opening /dev/kmsg is refused (PermissionError) and written
to the file ``HMA_TEST_KMSG_LOG`` names, which fails the test that did it; only a test that sets
``HMA_TEST_REAL_KMSG=1`` (tests/integration/test_kernel_log_devkmsg.py, the real device's test)
may open it."""

from __future__ import annotations

import os
import sys
from typing import Any

DEVICE = "/dev/kmsg"


def _is_device(path: Any) -> bool:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or not path.endswith("kmsg"):
        return False  # the cheap test first: this runs for every open of the process
    return os.path.realpath(path) == DEVICE


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not args or not _is_device(args[0]):
        return
    if os.environ.get("HMA_TEST_REAL_KMSG") == "1":
        return
    log = os.environ.get("HMA_TEST_KMSG_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:300]}\n")
    raise PermissionError(13, "a test may not read the real kernel log", DEVICE)


def install() -> None:
    """Refuse /dev/kmsg in this process (an audit hook: it stays for the process's life)."""
    if os.environ.get("HMA_TEST_KMSG_LOG"):
        sys.addaudithook(_hook)


install()
