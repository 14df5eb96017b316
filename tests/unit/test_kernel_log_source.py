"""The kernel_log event source, fed through a FIFO in the /dev/kmsg record format."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from hma import assembly
from hma.adapters.command import CommandRunner
from hma.adapters.files import RootReader
from hma.commands import inject
from hma.config.schema import ConfigError
from hma.contracts.model import Finding, Severity
from hma.contracts.source import MemoryKV, SourceContext
from hma.probes.kernel_log import source as kernel_log
from hma.probes.kernel_log.source import CURSOR_KEY, KernelLogSource

BOOT = "0b8d3c1e-boot-a"
XID_79 = (
    "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)
SITE_RULES = """
[[rules]]
name = "ib-cable"
needles = ["Cable unplugged"]
pattern = 'mlx5_core (?P<dev>\\S+): .*Cable unplugged'
code = "SITE_IB_CABLE"
message = "IB cable unplugged on {dev}"

[codes.SITE_IB_CABLE]
summary = "An InfiniBand cable was unplugged."
remedy = "Reseat the cable."
severity = "critical"
action = "none"
clears = "operator"
fatal = true
"""


def record(seq: int, message: str | bytes, pri: int = 3) -> bytes:
    body = message if isinstance(message, bytes) else message.encode()
    return b"%d,%d,%d,-;" % (pri, seq, 1000 * seq) + body + b"\n"


class Running:
    """A source thread reading a FIFO; findings collected in order."""

    def __init__(
        self,
        tmp: Path,
        kv: Optional[MemoryKV] = None,
        boot: str = BOOT,
        roots: tuple[str, str] = ("/nonexistent", "/nonexistent"),
        **opts: Any,
    ):
        self.fifo = tmp / "kmsg"
        if not self.fifo.exists():
            os.mkfifo(self.fifo)
        options = {k: o.default for k, o in KernelLogSource.options.items()}
        options.update(path=str(self.fifo), backend="kmsg", rules_dir=str(tmp / "rules.d"))
        options.update(opts)
        self.ctx = SourceContext(
            options=options,
            sysfs=RootReader(roots[0]),  # (sysfs, procfs): never the host's
            procfs=RootReader(roots[1]),
            runner=CommandRunner(),
            boot_id=boot,
            kv=kv if kv is not None else MemoryKV(),
        )
        self.source = KernelLogSource()
        self.findings: list[Finding] = []
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.writer = os.open(self.fifo, os.O_WRONLY)  # blocks until the source opened it

    def _run(self) -> None:
        try:
            self.source.run(self.ctx, self.findings.append)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.writer, view)
            view = view[n:]

    def wait_for(self, cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 10
        while not cond():
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)

    def stop(self) -> None:
        self.ctx.stop.set()
        self.thread.join(5)
        os.close(self.writer)
        assert not self.thread.is_alive(), "source did not stop"
        assert self.error is None, self.error


@pytest.mark.timeout(30)
def test_fatal_xid_is_emitted_with_its_record(tmp_path: Path) -> None:
    run = Running(tmp_path)
    try:
        run.write(record(1, "usb 1-1: new high-speed USB device") + record(2, XID_79, pri=4))
        run.wait_for(lambda: run.findings, "the Xid finding")
    finally:
        run.stop()
    (f,) = run.findings
    assert (f.code, f.component, f.probe) == ("GPU_XID_79", "gpu:0000:3b:00", "kernel_log")
    assert f.details["seq"] == 2 and f.details["line"] == XID_79 and f.details["count"] == 1
    assert run.ctx.kv.get(CURSOR_KEY) == {"boot_id": BOOT, "seq": 2}


@pytest.mark.timeout(30)
def test_restart_with_stored_cursor_neither_repeats_nor_misses(tmp_path: Path) -> None:
    kv = MemoryKV()
    first = Running(tmp_path, kv)
    try:
        first.write(record(1, "eth0: link up") + record(2, XID_79) + record(3, "eth0: link down"))
        first.wait_for(lambda: first.source.stats["records"] == 3, "three records")
    finally:
        first.stop()
    assert [f.code for f in first.findings] == ["GPU_XID_79"]
    assert kv.get(CURSOR_KEY) == {"boot_id": BOOT, "seq": 3}
    # The ring buffer is read again from the start after a restart: 1-3 are skipped, 4 is new.
    second = Running(tmp_path, kv)
    try:
        second.write(record(1, "eth0: link up") + record(2, XID_79) + record(3, "x"))
        second.write(record(4, "NVRM: Xid (PCI:0000:5d:00): 48, DBE"))
        second.wait_for(lambda: second.findings, "the new Xid")
        second.wait_for(lambda: second.source.stats["skipped"] == 3, "skipped records")
    finally:
        second.stop()
    assert [(f.code, f.details["seq"]) for f in second.findings] == [("GPU_XID_48", 4)]
    # After a reboot (new boot id) the same sequence numbers are new records.
    third = Running(tmp_path, kv, boot="0b8d3c1e-boot-b")
    try:
        third.write(record(1, "eth0: link up") + record(2, XID_79))
        third.wait_for(lambda: third.findings, "the Xid of the new boot")
    finally:
        third.stop()
    assert third.findings[0].code == "GPU_XID_79"


@pytest.mark.timeout(30)
def test_garbage_huge_lines_and_non_utf8_are_survived(tmp_path: Path) -> None:
    run = Running(tmp_path, max_line=4096)
    try:
        run.write(b"\x00\xff\xfe garbage without a header\n")
        run.write(b"abc,def,ghi,-;not numbers\n")
        run.write(record(1, b"caf\xc3\xa9 \xff\xfe\x80 not utf-8 \x1b[31m"))
        run.write(b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")  # continuation lines
        run.write(record(2, "A" * 300_000))  # far longer than max_line, arrives in pieces
        run.write(b"\n\n" + record(3, XID_79))
        run.wait_for(lambda: run.findings, "the Xid after the garbage")
    finally:
        run.stop()
    assert [f.code for f in run.findings] == ["GPU_XID_79"]
    stats = run.source.stats
    assert stats["malformed"] >= 2 and stats["truncated"] >= 1 and stats["records"] == 3


@pytest.mark.timeout(30)
def test_epipe_overrun_is_counted_and_reading_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read = os.read
    calls = {"n": 0}

    def read(fd: int, n: int) -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            raise BrokenPipeError(32, "Broken pipe")  # what /dev/kmsg returns after an overrun
        return real_read(fd, n)

    monkeypatch.setattr(kernel_log.os, "read", read)
    run = Running(tmp_path)
    try:
        run.write(record(1, "first"))
        run.write(record(7, XID_79))
        run.wait_for(lambda: run.findings, "the Xid after the overrun")
    finally:
        run.stop()
    assert run.source.stats["overruns"] == 1


@pytest.mark.timeout(30)
def test_user_facility_and_three_line_fallen_off_the_bus(tmp_path: Path) -> None:
    run = Running(tmp_path)
    try:
        run.write(record(1, "NVRM: The NVIDIA GPU 0000:b3:00.0"))
        run.write(record(2, "NVRM: (PCI ID: 10de:26b5) installed in this system has"))
        run.write(record(3, "NVRM: fallen off the bus and is not responding to commands."))
        run.write(record(4, "NVRM: Xid (PCI:0000:18:00): 119, GSP RPC timeout", pri=12))
        run.wait_for(lambda: len(run.findings) == 2, "two findings")
    finally:
        run.stop()
    bus, user = run.findings
    assert (bus.code, bus.component) == ("GPU_FALLEN_OFF_BUS", "gpu:0000:b3:00")
    assert (user.code, user.details["facility"]) == ("GPU_XID_119", 1)


@pytest.mark.timeout(30)
def test_fallen_off_the_bus_as_one_record_with_newlines_inside(tmp_path: Path) -> None:
    # the driver prints the three lines with one nv_printf(): one record, whose newlines
    # /dev/kmsg prints as \x0a (the PCI ID is left out by older drivers)
    run = Running(tmp_path)
    try:
        run.write(
            record(
                1,
                "NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this"
                " system has\\x0aNVRM: fallen off the bus and is not responding to commands.",
            )
        )
        run.write(
            record(
                2,
                "NVRM: The NVIDIA GPU 0000:c4:00.0\\x0aNVRM: installed in this system has\\x0a"
                "NVRM: fallen off the bus and is not responding to commands.",
            )
        )
        run.wait_for(lambda: len(run.findings) == 2, "two findings")
    finally:
        run.stop()
    assert [(f.code, f.component) for f in run.findings] == [
        ("GPU_FALLEN_OFF_BUS", "gpu:0000:b3:00"),
        ("GPU_FALLEN_OFF_BUS", "gpu:0000:c4:00"),
    ]


@pytest.mark.timeout(30)
def test_hma_inject_into_the_fifo_the_source_reads_raises_the_finding(tmp_path: Path) -> None:
    # `hma inject xid --kmsg <the source's FIFO>` writes what /dev/kmsg takes (`<4>NVRM: ...`);
    # on a path that is no kernel device the source numbers such a write after the last record
    kv = MemoryKV()
    kv.set(CURSOR_KEY, {"boot_id": BOOT, "seq": 41})  # records up to 41 were handled
    run = Running(tmp_path, kv)
    try:
        line = inject.inject_xid("0000:5d:00.0", 79, str(run.fifo))
        run.wait_for(lambda: run.findings, "the injected Xid")
        run.write(record(43, XID_79.replace("3b", "5e")))  # a record after it is read too
        run.wait_for(lambda: len(run.findings) == 2, "the record after the injected line")
    finally:
        run.stop()
    injected, after = run.findings
    assert (injected.code, injected.component) == ("GPU_XID_79", "gpu:0000:5d:00")
    assert injected.details["line"] == line and injected.details["seq"] == 42
    assert injected.details["facility"] == 1  # written from user space: the user facility
    assert (after.component, after.details["seq"]) == ("gpu:0000:5e:00", 43)
    assert run.source.stats["malformed"] == 0


@pytest.mark.timeout(30)
def test_a_file_system_error_names_the_mount_the_device_is_on(tmp_path: Path) -> None:
    # the kernel names the block device (`EXT4-fs error (device sdb1)`, `XFS (dm-0)`); the mount
    # table under the source's roots says where it is mounted: `fs:<mount>`; a device that is
    # not mounted is `dev:<name>`
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    for name, devno in (("sdb1", "8:17"), ("dm-0", "253:0"), ("sdc", "8:32")):
        (sysfs / "class/block" / name).mkdir(parents=True)
        (sysfs / "class/block" / name / "dev").write_text(devno + "\n")
    (procfs / "self").mkdir(parents=True)
    (procfs / "self/mountinfo").write_text(
        "25 1 259:1 / / rw - ext4 /dev/nvme0n1p1 rw\n"
        "40 25 8:17 /jobs /srv/jobs rw - ext4 /dev/sdb1 ro\n"  # a bind of a folder of it first
        "41 25 8:17 / /scratch rw - ext4 /dev/sdb1 ro\n"
        "42 25 253:0 / /my\\040data rw - xfs /dev/mapper/vg-data rw\n"
    )
    run = Running(tmp_path, roots=(str(sysfs), str(procfs)))
    try:
        run.write(
            record(
                1,
                "EXT4-fs error (device sdb1): ext4_find_entry:1455: inode #2: comm ls: "
                "reading directory lblock 0",
            )
        )
        run.write(
            record(
                2,
                'XFS (dm-0): metadata I/O error in "xfs_imap_to_bp+0x5e" at daddr 0x80 len 32 '
                "error 5",
            )
        )
        run.write(record(3, "EXT4-fs (sdc): Remounting filesystem read-only"))
        run.write(record(4, "Aborting journal on device nvme0n1p1-8."))
        run.wait_for(lambda: len(run.findings) == 4, "four file-system findings")
    finally:
        run.stop()
    assert [(f.code, f.component) for f in run.findings] == [
        ("KERNEL_FS_ERROR", "fs:/scratch"),
        ("KERNEL_FS_ERROR", "fs:/my\\040data"),
        ("KERNEL_FS_READONLY", "dev:sdc"),
        ("KERNEL_FS_ERROR", "fs:/"),  # no sysfs entry: by the mount's source, /dev/nvme0n1p1
    ]


@pytest.mark.timeout(30)
def test_repeats_within_the_window_are_one_event(tmp_path: Path) -> None:
    run = Running(tmp_path, dedupe_s=3600.0)
    try:
        for seq in range(1, 51):
            run.write(record(seq, "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception"))
        run.write(record(51, XID_79))
        run.wait_for(lambda: len(run.findings) == 2, "two findings")
    finally:
        run.stop()
    assert [f.code for f in run.findings] == ["GPU_XID_13", "GPU_XID_79"]


@pytest.mark.timeout(30)
def test_site_rules_raise_their_declared_codes(tmp_path: Path) -> None:
    (tmp_path / "rules.d").mkdir()
    (tmp_path / "rules.d" / "ib.toml").write_text(SITE_RULES)
    entries = KernelLogSource.declared_codes({"rules_dir": str(tmp_path / "rules.d")})
    assert [e.code for e in entries] == ["SITE_IB_CABLE"]
    run = Running(tmp_path)
    try:
        run.write(record(1, "mlx5_core 0000:17:00.0: Port module event: module 0, Cable unplugged"))
        run.wait_for(lambda: run.findings, "the site finding")
    finally:
        run.stop()
    (f,) = run.findings
    assert (f.code, f.message) == ("SITE_IB_CABLE", "IB cable unplugged on 0000:17:00.0")


def _config(tmp_path: Path, rules: str) -> str:
    (tmp_path / "rules.d").mkdir(exist_ok=True)
    (tmp_path / "rules.d" / "site.toml").write_text(rules)
    cfg = tmp_path / "hma.toml"
    cfg.write_text(
        f'[sources.kernel_log]\nrules_dir = "{tmp_path / "rules.d"}"\n'
        '[codes.SITE_IB_CABLE]\naction = "reboot"\n'
    )
    return str(cfg)


def test_site_codes_join_the_catalogue_and_take_overrides(tmp_path: Path) -> None:
    setup = assembly.load(_config(tmp_path, SITE_RULES))
    entry = setup.catalogue.get("SITE_IB_CABLE")
    assert entry is not None and str(entry.action) == "reboot"


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        (SITE_RULES.replace('code = "SITE_IB_CABLE"', 'code = "GPU_XID_79"'), "SITE_ codes only"),
        (SITE_RULES.replace("[codes.SITE_IB_CABLE]", "[codes.GPU_MINE]"), "must start with SITE_"),
        (SITE_RULES.replace("pattern = '", "pattern = '(("), "bad regular expression"),
        (SITE_RULES + '[codes.SITE_PROBE_WARNING]\nsummary="x"\n', "SITE_PROBE_WARNING"),
    ],
)
def test_broken_site_rules_are_config_errors(tmp_path: Path, rules: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        assembly.load(_config(tmp_path, rules))
    assert problem in "\n".join(err.value.errors)


@pytest.mark.timeout(30)
def test_a_clearing_line_goes_through_and_reopens_the_repeat_window(tmp_path: Path) -> None:
    run = Running(tmp_path, dedupe_s=3600.0)
    down = "nfs: server fs1 not responding, still trying"
    try:
        run.write(record(1, down) + record(2, down) + record(3, "nfs: server fs1 OK"))
        run.write(record(4, down))  # a new outage: news, not a repeat held back by the window
        run.wait_for(lambda: len(run.findings) == 3, "three findings")
    finally:
        run.stop()
    assert [(f.code, f.component, f.severity) for f in run.findings] == [
        ("KERNEL_NFS_NOT_RESPONDING", "nfs:fs1", None),
        ("KERNEL_NFS_NOT_RESPONDING", "nfs:fs1", Severity.OK),
        ("KERNEL_NFS_NOT_RESPONDING", "nfs:fs1", None),
    ]


@pytest.mark.timeout(30)
def test_storms_count_by_the_kernel_time_of_each_record(tmp_path: Path) -> None:
    """Records read in one go (the ring buffer after a restart) are counted at the time the
    kernel printed them, not the time they were read: corrected errors 20 s apart are no storm,
    10 within 9 s are."""
    line = "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Corrected, type=Data Link Layer"

    def at(seq: int, usec: int) -> bytes:
        return b"3,%d,%d,-;%s\n" % (seq, usec, line.encode())

    run = Running(tmp_path)
    try:
        run.write(b"".join(at(i, i * 20_000_000) for i in range(1, 16)))  # 15 spread over 5 min
        run.write(b"".join(at(100 + i, 400_000_000 + i * 1_000_000) for i in range(10)))
        run.write(record(200, XID_79))
        run.wait_for(lambda: any(f.code == "GPU_XID_79" for f in run.findings), "the marker")
    finally:
        run.stop()
    storms = [f for f in run.findings if f.code == "KERNEL_AER_CORRECTED_STORM"]
    assert [(f.component, f.details["seq"]) for f in storms] == [("gpu:0000:3b:00", 109)]
