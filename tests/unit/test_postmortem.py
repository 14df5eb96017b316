"""The post-mortem source: real pstore captures, the once-per-boot memory, bad records."""

from __future__ import annotations

import json
import os
import shutil
import threading
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import pytest

from hma.adapters.command import CommandResult, CommandRunner
from hma.adapters.files import RootReader
from hma.contracts import catalogue, label
from hma.contracts.label import POSTMORTEM_CODE
from hma.contracts.model import Action, Finding, Severity
from hma.contracts.source import MemoryKV, SourceContext
from hma.probes.kernel_log import postmortem
from hma.probes.kernel_log.postmortem import KV_KEY, UNKNOWN_CODE, PostmortemSource
from hma.remediation import remediations
from tests.faults import fault
from tests.unit.test_remediation_engine import FakeSlurm, make, run, writes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "postmortem"
PANIC = FIXTURES / "dmesg-erst-7530486857247752193"  # gpud: "Kernel panic - not syncing"
OOPS = FIXTURES / "dmesg-erst-oops.txt"  # gpud: sysrq crash, NULL pointer oops
JOINED = FIXTURES / "systemd-pstore-dmesg.txt"  # gpud: systemd-pstore's dmesg.txt
BOOT = "0f2b9f3f-5d0e-4d69-a5e5-3c1d0b0c6d11"


class Journal(CommandRunner):
    """journalctl answering ``entries`` (JSON lines) or failing."""

    def __init__(
        self,
        entries: Optional[list[dict[str, Any]]] = None,
        rc: Optional[int] = 0,
        stderr: str = "boom",
    ) -> None:
        super().__init__()
        self.entries, self.rc, self.stderr = entries or [], rc, stderr

    def run(self, argv: Any, timeout: float, env: Any = None, stdin: Any = None) -> CommandResult:
        if self.rc is None:
            return CommandResult(tuple(argv), None, "", "", 0.0, error="journalctl: not found")
        out = "".join(json.dumps(e) + "\n" for e in self.entries)
        return CommandResult(tuple(argv), self.rc, out if self.rc == 0 else "", self.stderr, 0.1)


def context(tmp: Path, kv: MemoryKV, boot: str = BOOT, runner: Optional[CommandRunner] = None):
    options = {
        "pstore_dir": str(tmp / "pstore"),
        "systemd_pstore_dir": str(tmp / "systemd"),
        "kdump_dir": str(tmp / "crash"),
        "journal": True,
        "journalctl": "journalctl",
        "journal_lines": 1000,
        "timeout": 5.0,
        "max_record_bytes": 1024 * 1024,
        "rules_dir": str(tmp / "rules.d"),
    }
    for key in ("pstore", "systemd", "crash"):
        (tmp / key).mkdir(exist_ok=True)
    stop = threading.Event()
    stop.set()  # run() returns after its one read
    return SourceContext(
        options,
        RootReader(str(tmp)),
        RootReader(str(tmp)),
        runner or Journal(rc=None),
        boot,
        kv=kv,
        stop=stop,
    )


def read_once(ctx: SourceContext) -> list[Finding]:
    out: list[Finding] = []
    PostmortemSource().run(ctx, out.append)
    return out


def test_the_codes_are_in_the_catalogue_and_never_drain() -> None:
    cat = catalogue.load_builtin()
    for code in (POSTMORTEM_CODE, UNKNOWN_CODE):
        assert not cat.entry(code).drains
        assert str(cat.entry(code).action) == "none"


def test_a_real_pstore_panic_is_a_crash_finding_with_its_lines(tmp_path: Path) -> None:
    ctx = context(tmp_path, MemoryKV())
    shutil.copy(PANIC, tmp_path / "pstore" / PANIC.name)
    found = read_once(ctx)
    assert [(f.code, f.component) for f in found] == [(POSTMORTEM_CODE, "node")]
    details = found[0].details
    assert details["previous_boot"] is True
    assert details["cause"] == "KERNEL_PANIC"
    assert details["lines"][-1].startswith("Kernel panic - not syncing: Test panic")
    assert details["record"].endswith(PANIC.name)


def test_a_real_oops_and_a_systemd_pstore_record_and_kdump(tmp_path: Path) -> None:
    ctx = context(tmp_path, MemoryKV())
    shutil.copy(OOPS, tmp_path / "pstore" / "dmesg-erst-6000000000000000001")
    (tmp_path / "systemd" / "7530486857247").mkdir()
    shutil.copy(JOINED, tmp_path / "systemd" / "7530486857247" / "dmesg.txt")
    (tmp_path / "crash" / "127.0.0.1-2026-12-01-03:00:00").mkdir()
    # kdump's vmcore-dmesg.txt: the same kernel lines without the <level> prefix
    vmcore = "".join(line.split(">", 1)[-1] + "\n" for line in PANIC.read_text().splitlines())
    (tmp_path / "crash" / "127.0.0.1-2026-12-01-03:00:00" / "vmcore-dmesg.txt").write_text(vmcore)
    found = read_once(ctx)
    causes = sorted((f.details["cause"], Path(f.details["record"]).name) for f in found)
    assert causes == [
        ("KERNEL_OOPS", "dmesg-erst-6000000000000000001"),
        ("KERNEL_PANIC", "dmesg.txt"),
        ("KERNEL_PANIC", "vmcore-dmesg.txt"),
    ]


def test_a_compressed_record_is_read(tmp_path: Path) -> None:
    ctx = context(tmp_path, MemoryKV())
    data = zlib.compress(PANIC.read_bytes())
    (tmp_path / "pstore" / "dmesg-ramoops-0.enc.z").write_bytes(data)
    raw = zlib.compressobj(wbits=-15)
    (tmp_path / "pstore" / "dmesg-ramoops-1.enc.z").write_bytes(
        raw.compress(OOPS.read_bytes()) + raw.flush()
    )
    causes = sorted(f.details["cause"] for f in read_once(ctx))
    assert causes == ["KERNEL_OOPS", "KERNEL_PANIC"]


def test_once_per_boot_and_an_old_record_is_not_raised_again(tmp_path: Path) -> None:
    kv = MemoryKV()
    ctx = context(tmp_path, kv)
    shutil.copy(PANIC, tmp_path / "pstore" / PANIC.name)
    assert len(read_once(ctx)) == 1
    assert kv.get(KV_KEY)["boot_id"] == BOOT
    assert read_once(context(tmp_path, kv)) == []  # the agent restarted in the same boot
    assert read_once(context(tmp_path, kv, boot="another-boot")) == []  # the record is old news
    shutil.copy(OOPS, tmp_path / "pstore" / "dmesg-erst-6000000000000000002")
    found = read_once(context(tmp_path, kv, boot="a-third-boot"))
    assert [f.details["cause"] for f in found] == ["KERNEL_OOPS"]


def test_the_previous_boots_journal(tmp_path: Path) -> None:
    prev = "5" * 32
    entries = [
        {"_TRANSPORT": "kernel", "_BOOT_ID": prev, "MESSAGE": "NVRM: loading"},
        {
            "_TRANSPORT": "kernel",
            "_BOOT_ID": prev,
            "MESSAGE": "Watchdog detected hard LOCKUP on cpu 7",
        },
        # user space writing the kernel's words: never read
        {"_TRANSPORT": "syslog", "_BOOT_ID": prev, "MESSAGE": "Kernel panic - not syncing: x"},
    ]
    kv = MemoryKV()
    journal = Journal(entries)
    found = read_once(context(tmp_path, kv, runner=journal))
    assert [f.details["cause"] for f in found] == ["KERNEL_HARD_LOCKUP"]
    assert read_once(context(tmp_path, kv, boot="next", runner=Journal(entries))) == []


def test_a_first_boot_and_a_failing_journalctl(tmp_path: Path) -> None:
    first = Journal(rc=1, stderr="Data from the specified boot (-1) is not available: No such boot")
    assert read_once(context(tmp_path, MemoryKV(), runner=first)) == []
    found = read_once(context(tmp_path, MemoryKV(), runner=Journal(rc=1)))
    assert [(f.code, f.severity) for f in found] == [(UNKNOWN_CODE, Severity.UNKNOWN)]
    assert read_once(context(tmp_path, MemoryKV(), runner=Journal([]))) == []


@pytest.mark.parametrize(
    "bad", ["symlink", "huge", "binary", "truncated_z", "unreadable", "dir_link"]
)
def test_bad_records_are_unknown_never_a_crash(tmp_path: Path, bad: str) -> None:
    ctx = context(tmp_path, MemoryKV())
    pstore = tmp_path / "pstore"
    outside = tmp_path / "outside"
    outside.write_bytes(PANIC.read_bytes())
    if bad == "symlink":
        (pstore / "dmesg-erst-1").symlink_to(outside)
    elif bad == "huge":
        (pstore / "dmesg-erst-1").write_bytes(PANIC.read_bytes() * 100)
    elif bad == "binary":
        (pstore / "dmesg-erst-1").write_bytes(os.urandom(4096) + b"\0\0" + os.urandom(64))
    elif bad == "truncated_z":
        (pstore / "dmesg-ramoops-1.enc.z").write_bytes(zlib.compress(PANIC.read_bytes())[:200])
    elif bad == "unreadable":
        (pstore / "dmesg-erst-1").write_bytes(PANIC.read_bytes())
        if os.geteuid() == 0:  # root reads a 0000 file: a FIFO cannot be read as a record
            (pstore / "dmesg-erst-1").unlink()
            os.mkfifo(pstore / "dmesg-erst-1")
        else:
            (pstore / "dmesg-erst-1").chmod(0)
    elif bad == "dir_link":
        (tmp_path / "systemd" / "1234").symlink_to(pstore.parent / "elsewhere")
        (pstore.parent / "elsewhere").mkdir()
        shutil.copy(PANIC, pstore.parent / "elsewhere" / "dmesg.txt")
    found = read_once(ctx)
    assert all(f.code == UNKNOWN_CODE for f in found)
    assert len(found) == (0 if bad == "dir_link" else 1)


def test_corrected_machine_checks_and_warnings_are_no_crash(tmp_path: Path) -> None:
    rules = postmortem.RuleSet.load(None)
    lines = [
        "[  10.1] mce: [Hardware Error]: Machine check events logged",
        "[  11.2] INFO: task kworker/1:1:42 blocked for more than 120 seconds.",
    ]
    assert postmortem.crash_findings(rules, "r", lines) == []
    fatal = ["[  12.0] mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: b200"]
    assert [f.details["cause"] for f in postmortem.crash_findings(rules, "r", fatal)] == [
        "KERNEL_MCE_HW_ERROR"
    ]


def crash_fault(cause: str = "KERNEL_PANIC", component: str = "node") -> Any:
    """The post-mortem's finding as the health model holds it: a warning that never drains."""
    base = fault(POSTMORTEM_CODE, component, Action.NONE, message="previous boot ended")
    details = {"previous_boot": True, "cause": cause}
    return replace(base, severity=Severity.WARNING, drains=False, details=details)


def test_a_crash_counts_once_per_boot_in_hmah_and_names_its_cause_in_hmap(tmp_path: Path) -> None:
    fake = FakeSlurm("n1", "n2")
    rem = make(tmp_path, fake, max_remediations=1)
    run(rem, (crash_fault(),), boot="b2")
    run(rem, (crash_fault(),), boot="b2")  # the same boot: counted once
    crashes = [r for r in remediations.rows(rem.store) if r["action"] == "crash"]
    assert [(r["code"], r["boot_id"]) for r in crashes] == [("KERNEL_PANIC", "b2")]
    extra = fake.state["n1"].field("extra")
    history = label.find_history(extra)
    assert history is not None and [code for _ts, code in history.entries] == ["KERNEL_PANIC"]
    post = label.find_postmortem(extra)
    assert post is not None and post.cause == "KERNEL_PANIC"
    assert "DRAIN" not in writes(fake)  # evidence, not a current fault: no drain
    run(rem, (crash_fault("KERNEL_MCE_HW_ERROR", "cpu:3"),), boot="b3")  # crashed again
    post = label.find_postmortem(fake.state["n1"].field("extra"))
    assert post is not None and post.cause == "KERNEL_MCE_HW_ERROR"
    assert rem.status()["remediations"] == 2  # over max_remediations: the next episode is held
    run(rem, (fault(),), boot="b3")
    assert "repeat offender" in fake.state["n1"].reason


def test_the_postmortem_token_is_read_strictly() -> None:
    token = label.PostMortem(1764410040, "KERNEL_PANIC").token()
    assert token == "hmap=1764410040:KERNEL_PANIC"
    assert label.find_postmortem(f"hma=x:Y:none {token} rest") is not None
    for bad in ("hmap=1764410040:panic", "hmap=12:KERNEL_PANIC", "hmap=1764410040", "hmap=x:Y"):
        assert label.parse_postmortem(bad) is None
    assert label.parse_postmortem("hmap=4000000000:KERNEL_PANIC", now=1764410040) is None
    assert label.edit_postmortem(f"a {token} b", None) == "a b"


def test_the_memory_is_bounded_and_keeps_the_newest(tmp_path: Path) -> None:
    old = [f"pstore:dmesg-erst-{i}:1:1" for i in range(600)]
    kv = MemoryKV()
    kv.set(KV_KEY, {"boot_id": "earlier", "keys": old})
    ctx = context(tmp_path, kv)
    shutil.copy(PANIC, tmp_path / "pstore" / PANIC.name)
    assert len(read_once(ctx)) == 1
    kept = kv.get(KV_KEY)["keys"]
    assert len(kept) == postmortem.MAX_KEYS and kept[-1].startswith(f"pstore:{PANIC.name}:")
    assert kept[0] == old[600 - postmortem.MAX_KEYS + 1]
