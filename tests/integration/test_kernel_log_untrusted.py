"""An ordinary user cannot raise a kernel-log finding through the journal: a real, namespaced
systemd-journald, a real user created for the test, real ``logger`` and native-protocol entries
with ``SYSLOG_IDENTIFIER=NVRM`` (and, fuzzed, ``kernel``, forged ``_TRANSPORT``, kernel
facilities, ``--id``), and the kernel_log source reading that journal with systemd-python's real
``journal.Reader``; ``hma logscan`` over what ``journalctl`` prints of it raises nothing either."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest
from conftest import User, journald_usable, read_back, users_usable
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.commands import logscan
from hma.contracts.model import Finding
from hma.contracts.source import MemoryKV, SourceContext
from hma.probes.kernel_log import source as kernel_log
from hma.probes.kernel_log.rules import RuleSet
from hma.probes.kernel_log.source import KernelLogSource
from hma.reporters.journal import encode
from tests.unit.mutate import budget

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
    ns, sock = journald
    syslog_sock = sock.rsplit("/", 1)[0] + "/dev-log"
    # the attack: `logger -t NVRM` (syslog) and a native entry, both as the ordinary user
    ordinary_user.run("logger", "--socket", syslog_sock, "-t", "NVRM", XID)
    ordinary_user.run(PYTHON, "-c", NATIVE, sock, XID)
    planted = read_back(ns, "SYSLOG_IDENTIFIER=NVRM", f"_UID={ordinary_user.uid}", count=2)
    assert {e["_TRANSPORT"] for e in planted} == {"syslog", "journal"}
    assert all(e["MESSAGE"] == XID for e in planted)  # what main's journald path took as Xid 79

    assert read_with_source(ns, tmp_path) == []


def read_with_source(ns: str, tmp_path: Any) -> list[Finding]:
    """The findings of the kernel_log source (journal backend, systemd-python's real Reader)
    over the namespace's whole journal, once it has read everything."""
    from systemd import journal

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
    return found


# --- fuzz: `logger -t kernel`, forged fields, kernel facilities, through the real journald --------

# datagrams on stdin (hex, one a line), each sent to the socket its first word names
SENDER = """
import socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for line in sys.stdin:
        where, data = line.split()
        s.sendto(bytes.fromhex(data), sys.argv[1] if where == "native" else sys.argv[2])
"""
FORGED_XID = "NVRM: " + XID
MESSAGES = [
    FORGED_XID,
    "mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: b200000000070005",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
    "watchdog: Watchdog detected hard LOCKUP on cpu 6",
    "EXT4-fs (sdb): Remounting filesystem read-only",
    "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR nd-id=0 action=TERMINATE_INSTANCE",
    "[  12.345678] " + FORGED_XID,  # a dmesg line's time stamp in the message
    "kernel: " + FORGED_XID,
    "line one\n" + FORGED_XID,  # a second line that reads like the kernel
    "_TRANSPORT=kernel\nMESSAGE=" + FORGED_XID,
]
IDENTS = ["kernel", "NVRM", "kernel[0]", "kernel:", "mce", "nvidia-nvswitch1", "", "kernel\t"]
FORGED_FIELDS = [
    ("_TRANSPORT", "kernel"),  # journald's own fields: it drops them from clients
    ("_PID", "0"),
    ("_COMM", "kernel"),
    ("_BOOT_ID", "0" * 32),
    ("SYSLOG_FACILITY", "0"),
    ("SYSLOG_PID", "0"),
    ("PRIORITY", "0"),
    ("_KERNEL_DEVICE", "+pci:0000:3b:00.0"),
    ("_KERNEL_SUBSYSTEM", "pci"),
]


def syslog_datagram(pri: int, ident: str, pid: str, message: str) -> bytes:
    """What ``logger`` sends to /dev/log (RFC 3164): ``<pri>time ident[pid]: message``."""
    head = f"{ident}[{pid}]" if pid else ident
    return f"<{pri}>Dec  2 10:43:35 {head}: {message}".encode()


def native_datagram(fields: list[tuple[str, str]], ident: str, message: str) -> bytes:
    """A native-protocol entry with forged fields (journal.encode: binary-safe values)."""
    return encode([*fields, ("SYSLOG_IDENTIFIER", ident), ("MESSAGE", message)])


DATAGRAMS = st.one_of(
    st.builds(
        lambda pri, ident, pid, message: ("syslog", syslog_datagram(pri, ident, pid, message)),
        st.sampled_from([0, 2, 4, 6, 13, 8 * 23 + 3]),  # kern.emerg .. local7.err
        st.sampled_from(IDENTS),
        st.sampled_from(["", "1", "0", "4242"]),
        st.sampled_from(MESSAGES) | st.text(max_size=40).map(lambda t: t + FORGED_XID),
    ),
    st.builds(
        lambda fields, ident, message: ("native", native_datagram(fields, ident, message)),
        st.lists(st.sampled_from(FORGED_FIELDS), max_size=4, unique=True),
        st.sampled_from(IDENTS),
        st.sampled_from(MESSAGES),
    ),
)
# what journalctl prints (-o cat prints the bare message: docs/kernel-log.md, a known limit)
SHAPES = [
    "short",
    "short-precise",
    "short-iso",
    "short-iso-precise",
    "short-full",
    "short-monotonic",
    "short-delta",
    "short-unix",
    "json",
    "json-seq",
    "json-pretty",
    "verbose",
    "with-unit",
]
SENT = [0]  # datagrams of every example so far (one journal for the whole test)
CASES = 10  # examples of 40 datagrams each (400 entries, and 6 real logger runs)


def logger_entries(user: User, dev_log: str) -> int:
    """Real ``logger`` as the user: ``-t kernel``, ``-t NVRM``, ``--id``, RFC 5424, kern.*"""
    runs = [
        ["-t", "kernel"],
        ["-t", "NVRM"],
        ["-t", "kernel", "--id=1"],
        ["-t", "kernel", "--rfc5424"],
        ["-t", "kernel", "-p", "kern.emerg"],
        ["-t", "kernel", "--rfc3164", "-p", "kern.crit"],
    ]
    for flags in runs:
        message = FORGED_XID[len("NVRM: ") :] if "NVRM" in flags else FORGED_XID
        user.run("logger", "--socket", dev_log, *flags, message)
    return len(runs)


def test_fuzzed_user_entries_raise_nothing_in_the_source_or_logscan(
    journald: tuple[str, str], ordinary_user: User, tmp_path: Any
) -> None:
    ns, sock = journald
    dev_log = sock.rsplit("/", 1)[0] + "/dev-log"
    SENT[0] = logger_entries(ordinary_user, dev_log)
    read_back(ns, f"_UID={ordinary_user.uid}", count=SENT[0])
    rules = RuleSet.load(None)

    @settings(budget(CASES), phases=[Phase.explicit, Phase.generate])  # no shrinking: slow
    @given(batch=st.lists(DATAGRAMS, min_size=40, max_size=40))
    def check(batch: list[tuple[str, bytes]]) -> None:
        lines = "".join(f"{where} {data.hex()}\n" for where, data in batch)
        done = subprocess.run(
            ordinary_user.argv(PYTHON, "-c", SENDER, sock, dev_log),
            input=lines,
            text=True,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        SENT[0] += len(batch)
        landed = read_back(ns, f"_UID={ordinary_user.uid}", count=SENT[0])
        assert len(landed) >= SENT[0] and {e["_TRANSPORT"] for e in landed} <= {
            "syslog",
            "journal",
        }
        assert read_with_source(ns, tmp_path) == []
        for shape in SHAPES:
            saved = tmp_path / f"journal.{shape}"
            with open(saved, "wb") as fh:
                subprocess.run(
                    ["journalctl", f"--namespace={ns}", "-o", shape, "--no-pager"],
                    stdout=fh,
                    timeout=60,
                    check=True,
                )
            hits, errors = logscan.scan([str(saved)], rules)
            assert errors == [] and hits == [], (shape, [h.last for h in hits])
        exported = tmp_path / "journal.export"
        with open(exported, "wb") as fh:
            subprocess.run(
                ["journalctl", f"--namespace={ns}", "-o", "export", "--no-pager"],
                stdout=fh,
                timeout=60,
                check=True,
            )
        hits, errors = logscan.scan([str(exported)], rules)
        assert hits == [] and errors and "export" in errors[0]  # refused, never trusted

    check()
    assert SENT[0] == 6 + 40 * CASES  # every example ran
