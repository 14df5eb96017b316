"""An ordinary user cannot raise a kernel-log finding through the journal: a real, namespaced
systemd-journald, a real user created for the test, real ``logger`` and native-protocol entries
with ``SYSLOG_IDENTIFIER=NVRM``, and the kernel_log source reading that journal with
systemd-python's real ``journal.Reader``."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest
from conftest import User, journald_usable, read_back, users_usable

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.contracts.model import Finding
from hma.contracts.source import MemoryKV, SourceContext
from hma.probes.kernel_log import source as kernel_log
from hma.probes.kernel_log.source import KernelLogSource

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not (journald_usable() and users_usable()),
        reason="needs root, systemd-journald, journalctl, useradd and setpriv",
    ),
]

# the system's interpreter: a virtual environment's may lie under a folder the user cannot enter
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
XID = "Xid (PCI:0000:01:00): 79, pid=1, name=x, GPU has fallen off the bus."
NATIVE = """
import socket, sys
entry = b"SYSLOG_IDENTIFIER=NVRM\\nMESSAGE=" + sys.argv[2].encode() + b"\\n"
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.sendto(entry, sys.argv[1])
"""


def test_user_written_nvrm_entries_raise_nothing(
    journald: tuple[str, str], ordinary_user: User, tmp_path: Any
) -> None:
    from systemd import journal

    ns, sock = journald
    syslog_sock = sock.rsplit("/", 1)[0] + "/dev-log"
    # the attack: `logger -t NVRM` (syslog) and a native entry, both as the ordinary user
    ordinary_user.run("logger", "--socket", syslog_sock, "-t", "NVRM", XID)
    ordinary_user.run(PYTHON, "-c", NATIVE, sock, XID)
    planted = read_back(ns, "SYSLOG_IDENTIFIER=NVRM", f"_UID={ordinary_user.uid}", count=2)
    assert {e["_TRANSPORT"] for e in planted} == {"syslog", "journal"}
    assert all(e["MESSAGE"] == XID for e in planted)  # what main's journald path took as Xid 79

    waited = threading.Event()

    class Reader(journal.Reader):  # type: ignore[misc]
        """The real reader on the test's namespace; notes when it has read everything."""

        def __init__(self) -> None:
            super().__init__(namespace=ns)

        def get_timeout_ms(self) -> int:  # asked when idle, right before the source blocks
            waited.set()
            return int(super().get_timeout_ms())

    class Module:
        pass

    module = Module()
    module.Reader = Reader  # type: ignore[attr-defined]
    options = {k: o.default for k, o in KernelLogSource.options.items()}
    options.update(backend="journal", rules_dir=str(tmp_path / "none"))
    ctx = SourceContext(
        options, RootReader("/sys"), RootReader("/proc"), CommandRunner(), "b", MemoryKV()
    )
    found: list[Finding] = []
    source = KernelLogSource()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            source.run(ctx, found.append)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel_log, "_journal_module", lambda: module)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert waited.wait(60), "the source never reached the end of the journal"
        ctx.stop.set()
        thread.join(30)
    assert not thread.is_alive() and errors == []
    assert source.backend_used == "journal"
    assert found == []
