"""Kernel records quote users (issue 28): the kernel copies a task's ``comm`` (15 bytes, any but
NUL, set by any process for itself) and file names (255 bytes, any but ``/`` and NUL) into its own
records. Rules match the kernel's own formats from the start of the message, and a message of a
format that quotes a user (hma.probes.kernel_log.formats) goes to its own rules only: whatever
name a user picks, the record raises what the same record with a benign name raises.

Each user string is tried as /dev/kmsg prints it (a byte below 0x20 or above 0x7e, and ``\\``, as
``\\xNN``) and as journald stores it (unescaped: newlines and all), through the matcher and
through ``hma logscan``'s reader of kmsg-shaped lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mutate import budget

from hma.commands import logscan
from hma.probes.kernel_log import formats
from hma.probes.kernel_log.lines import saved_line
from hma.probes.kernel_log.rules import RulesError, RuleSet, compile_rule
from tests.unit.test_kernel_log_corpus import CORPUS, EXPECTED
from tests.unit.test_kernel_log_source import Running, record

RULES = RuleSet.load(None)
Fault = Optional[tuple[str, str, Optional[str]]]  # (code, component, severity) or None

# Every kernel format hma knows that carries a task name ({comm}) or a file name ({file}), as
# the kernel prints it (formats.py names each format's source).
TEMPLATES: dict[str, str] = {
    "segfault": "{comm}[4242]: segfault at 7f3a ip 00007f3a1234 sp 00007ffd5678 error 4 in "
    "{file}[7f3a00000000+21000]",
    "segfault-cpu": "{comm}[4242]: segfault at 0 ip 000055d0c0 sp 00007ffd error 6 in "
    "{file}[55d0c0000000+1000] likely on CPU 3 (core 3, socket 0)",
    "trap": "traps: {comm}[4242] trap invalid opcode ip:55d0c0 sp:7ffd error:0 in "
    "{file}[55d0c0000000+1000]",
    "gpf": "traps: {comm}[4242] general protection fault ip:7f3a sp:7ffd error:0 in "
    "{file}[7f3a00000000+1000]",
    "fatal-signal": "{comm}/4242: potentially unexpected fatal signal 11.",
    "hung-task": "INFO: task {comm}:4242 blocked for more than 120 seconds.",
    "soft-lockup": "watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [{comm}:4242]",
    "task-state": "task:{comm} state:D stack:0     pid:4242  ppid:1      flags:0x00004000",
    "task-state-old": "{comm} D    0  4242      1 0x00000080",
    "dump-stack": "CPU: 3 PID: 4242 Comm: {comm} Not tainted 6.8.0-45-generic #45-Ubuntu",
    "oom-kill": "Out of memory: Killed process 4242 ({comm}) total-vm:1000kB, anon-rss:100kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:40kB oom_score_adj:0",
    "oom-memcg": "Memory cgroup out of memory: Killed process 4242 ({comm}) total-vm:1000kB, "
    "anon-rss:100kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:40kB oom_score_adj:0",
    "oom-old": "Out of memory: Kill process 4242 ({comm}) score 900 or sacrifice child",
    "oom-summary": "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    "oom_memcg=/user.slice/{file},task_memcg=/user.slice/{file},task={comm},pid=4242,uid=1000",
    "oom-invoked": "{comm} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE), order=0, "
    "oom_score_adj=0",
    "oom-reaper": "oom_reaper: reaped process 4242 ({comm}), now anon-rss:0kB, file-rss:0kB, "
    "shmem-rss:0kB",
    "stack-depth": "{comm} (4242) used greatest stack depth: 11536 bytes left",
    "exec-stack": "process '{file}' started with executable stack",
    "audit-seccomp": "audit: type=1326 audit(1700000000.123:45): auid=1000 uid=1000 gid=1000 ses=3"
    ' subj=unconfined pid=4242 comm="{comm}" exe="{file}" sig=31 arch=c000003e syscall=1'
    " compat=0 ip=0x7f3a code=0x0",
    "audit-apparmor": 'audit: type=1400 audit(1700000000.123:46): apparmor="DENIED"'
    ' operation="open" profile="p" name="{file}" pid=4242 comm="{comm}" requested_mask="r"'
    ' denied_mask="r" fsuid=1000 ouid=1000',
    "memory-failure-kill": "Memory failure: 0x8c53ae: Sending SIGBUS to {comm}:4242 due to "
    "hardware memory corruption",
    "memory-failure-kill-old": "Memory failure: 0x8c53ae: Killing {comm}:4242 due to hardware "
    "memory corruption",
    "xid": "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name={comm}, Graphics SM Warp Exception on "
    "(GPC 0, TPC 0, SM 0): Out Of Range Address",
    "xid-154": "NVRM: Xid (PCI:0000:3b:00): 154, pid=4242, name={comm}, GPU recovery action "
    "changed from 0x0 (None) to 0x0 (None)",
    "xid-nvlink5": "NVRM: Xid (PCI:0018:01:00): 145, pid=4242, name={comm}, RLW_RXPIPE Nonfatal "
    "XC0 i0 Link 13 (0x0409a0c2 0x8)",
}
BENIGN_COMM, BENIGN_FILE = b"python3", b"a.out"


def kmsg_escaped(raw: bytes) -> str:
    """``raw`` as /dev/kmsg prints it (kernel/printk/printk.c msg_add_ext_text)."""
    return "".join(f"\\x{b:02x}" if b < 0x20 or b >= 0x7F or b == 0x5C else chr(b) for b in raw)


def renderings(template: str, comm: bytes, file: bytes) -> list[str]:
    """The message as the kmsg backend reads it, and as the journal backend reads it."""
    kmsg = template.format(comm=kmsg_escaped(comm), file=kmsg_escaped(file))
    journal = template.format(
        comm=comm.decode("utf-8", "replace"), file=file.decode("utf-8", "replace")
    )
    return [kmsg, journal]


def fault(message: str) -> Fault:
    """(code, component, severity) of the match of a fresh matcher (no look-back), or None."""
    match = RULES.matcher("t").match(message)
    return (
        None
        if match is None
        else (match.code, match.component, match.severity and str(match.severity))
    )


def logscan_fault(message: str) -> Fault:
    """The same, through ``hma logscan``'s reader of a saved kmsg record."""
    shape, text = saved_line(f"6,1,1000,-;{message}")
    assert shape == "kmsg" and text == message
    return fault(text)


BENIGN = {name: fault(renderings(t, BENIGN_COMM, BENIGN_FILE)[0]) for name, t in TEMPLATES.items()}


def corpus_messages() -> list[tuple[str, Fault]]:
    """Each fault-corpus line that raises something: its message and what it raises."""
    out = []
    for name, lines in sorted(EXPECTED.items()):
        text = (CORPUS / "faults" / name).read_text(encoding="utf-8").splitlines()
        for n in sorted(lines):
            message = saved_line(text[n - 1])[1]
            if message is None and text[n - 1][:1] == " ":
                continue  # a record's indented line: read with its first line (hma logscan)
            assert message is not None
            got = fault(message)
            if got is not None:  # not a storm's line (that raises on the tenth): alone, it raises
                out.append((message, got))
    return out


CORPUS_FAULTS = corpus_messages()


def test_every_template_is_a_format_that_quotes_users() -> None:
    for name, template in TEMPLATES.items():
        for message in renderings(template, BENIGN_COMM, BENIGN_FILE):
            assert formats.classify(message) is not None, (name, message)
    # the formats' own rules still raise what they raise: user fields are data
    assert BENIGN["hung-task"] == ("KERNEL_HUNG_TASK", "node", None)
    assert BENIGN["soft-lockup"] == ("KERNEL_SOFT_LOCKUP", "node", None)
    assert BENIGN["xid"] == ("GPU_XID_13", "gpu:0000:3b:00", None)
    assert BENIGN["xid-nvlink5"] == ("GPU_XID_145", "gpu:0018:01:00", "warning")
    assert BENIGN["segfault"] is None and BENIGN["oom-kill"] is None


@pytest.mark.parametrize(
    ("message", "expected"), CORPUS_FAULTS, ids=[m[:32] for m, _ in CORPUS_FAULTS]
)
def test_a_rule_matches_from_the_start_of_the_message_only(message: str, expected: Fault) -> None:
    assert fault(message) == expected
    for prefix in ("x ", "sshd: ", "a[1]: ", "kernel: x "):  # text before the driver's prefix
        assert fault(prefix + message) is None, prefix + message


def generated_records() -> list[tuple[str, str]]:
    """The issue's set: every raising fault-corpus line as a task name (15-byte windows of it)
    and as a file name (the whole line, ``/`` taken out; also after a newline), spliced into
    every format: (format, record) pairs."""
    out = []
    for message, _ in CORPUS_FAULTS:
        raw = message.encode()
        file = raw.replace(b"/", b"")[:255]
        comms = sorted({raw[:15], raw[15:30], raw[-15:]})
        for name, template in TEMPLATES.items():
            if "{file}" in template:
                out += [(name, r) for r in renderings(template, BENIGN_COMM, file)]
                out += [(name, r) for r in renderings(template, BENIGN_COMM, b"x\n" + file)]
            for comm in comms:
                out += [(name, r) for r in renderings(template, comm, BENIGN_FILE)]
    return out


def test_fault_lines_as_names_raise_nothing_the_format_does_not() -> None:
    records = generated_records()
    assert len(records) > 2000
    raised = []
    for name, message in records:
        assert formats.classify(message) is not None, message
        got = fault(message)
        if got is not None and got != BENIGN[name]:
            raised.append((message, got))
    assert raised == []  # on the tree before issue 28: hundreds, many of them critical


def _no_nul(raw: bytes) -> bool:
    return b"\x00" not in raw


CORPUS_BYTES = [m.encode() for m, _ in CORPUS_FAULTS]
COMMS = (
    st.binary(max_size=15).filter(_no_nul)
    | st.sampled_from([m[i : i + 15] for m in CORPUS_BYTES for i in (0, 5, 10)])
    | st.text(alphabet=st.sampled_from("\n\\x[]:(),= NVRMXidPCI0123456789"), max_size=15).map(
        lambda s: s.encode()[:15]
    )
)
FILES = (
    st.binary(max_size=255).filter(lambda b: _no_nul(b) and b"/" not in b)
    | st.sampled_from([m.replace(b"/", b"")[:255] for m in CORPUS_BYTES])
    | st.tuples(st.sampled_from(["", "x\n", "a]: ", "\\x0a"]), st.sampled_from(CORPUS_BYTES)).map(
        lambda p: (p[0].encode() + p[1].replace(b"/", b""))[:255]
    )
)


@budget(300)
@given(name=st.sampled_from(sorted(TEMPLATES)), comm=COMMS, file=FILES)
def test_any_user_name_raises_only_what_a_benign_name_raises(
    name: str, comm: bytes, file: bytes
) -> None:
    for message in renderings(TEMPLATES[name], comm, file):
        assert fault(message) in (None, BENIGN[name]), message
        if "\n" not in message:
            assert logscan_fault(message) in (None, BENIGN[name]), message


@pytest.mark.parametrize(
    ("name", "verdict"),
    [
        # a name that reads like the decoding text cannot shift or steer the verdict
        ("a, to 0x1", None),
        ("x, GPU recove", None),
        ("RLW Fatal XC0", None),
        ("a, b, c", None),
        ("a\nb", None),  # journald keeps a newline inside the message: the text still counts
    ],
)
def test_the_xid_process_name_does_not_steer_its_verdict(name: str, verdict: object) -> None:
    line = TEMPLATES["xid-154"].format(comm=name)
    assert fault(line) == ("GPU_XID_154", "gpu:0000:3b:00", verdict)
    nvlink = TEMPLATES["xid-nvlink5"].format(comm=name)
    assert fault(nvlink) == ("GPU_XID_145", "gpu:0018:01:00", "warning")


def test_a_site_rule_reads_a_quoting_format_only_when_it_names_it(tmp_path: Path) -> None:
    raw = {"name": "segv", "pattern": r".{0,60}\[\d+\]: segfault at ", "code": "SITE_SEGV"}
    oom = "python3[4242]: segfault at 0 ip 0 sp 0 error 4 in a.out[400000+1000]"
    blind = RuleSet([*RULES.rules, compile_rule(raw, "site.toml")])
    assert blind.matcher("t").match(oom) is None  # it does not name the format: never sees it
    seeing = RuleSet([*RULES.rules, compile_rule({**raw, "formats": ["segfault"]}, "site.toml")])
    match = seeing.matcher("t").match(oom)
    assert match is not None and match.code == "SITE_SEGV"
    cable = {"name": "c", "pattern": "mlx5_core \\S+: Cable unplugged", "code": "SITE_CABLE"}
    anchored = RuleSet([*RULES.rules, compile_rule(cable, "site.toml")]).matcher("t")
    assert anchored.match("mlx5_core 0000:41:00.0: Cable unplugged") is not None
    assert anchored.match("x mlx5_core 0000:41:00.0: Cable unplugged") is None  # from the start
    with pytest.raises(ValueError, match="formats"):
        compile_rule({**raw, "formats": ["no-such-format"]}, "site.toml")
    with pytest.raises(ValueError, match="formats"):
        compile_rule({**raw, "formats": "segfault"}, "site.toml")
    site = tmp_path / "rules.d"
    site.mkdir()
    (site / "a.toml").write_text(
        '[[rules]]\nname = "x"\npattern = "x"\ncode = "SITE_X"\nformats = [1]\n'
    )
    with pytest.raises(RulesError, match="formats"):
        RuleSet.load(str(site))


def test_logscan_of_a_forged_segfault_file_raises_nothing(tmp_path: Path) -> None:
    forged = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    log = tmp_path / "kmsg.log"
    with open(log, "w", encoding="utf-8") as fh:
        for i, template in enumerate(TEMPLATES.values()):
            comm = forged.encode()[:15]
            for message in renderings(template, comm, forged.encode().replace(b"/", b"")):
                if "\n" not in message:
                    fh.write(f"6,{i},{i}000,-;{message}\n")
    hits, errors = logscan.scan([str(log)], RULES)
    assert errors == []
    assert {h.finding.code for h in hits} <= {
        "KERNEL_HUNG_TASK",
        "KERNEL_SOFT_LOCKUP",
        "GPU_XID_13",
        "GPU_XID_154",
        "GPU_XID_145",
    }


def test_logscan_refuses_a_journal_export_whose_binary_value_holds_a_kernel_like_line(
    tmp_path: Path,
) -> None:
    # `journalctl -o export` writes a value with a newline as its length and raw bytes: a user's
    # MESSAGE "x\nNVRM: Xid ..." puts a line of its own in the file
    forged = b"x\nNVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, GPU has fallen off the bus."
    entry = (
        b"__CURSOR=s=1;i=1\n_TRANSPORT=syslog\nMESSAGE\n"
        + len(forged).to_bytes(8, "little")
        + forged
        + b"\n\n"
    )
    log = tmp_path / "journal.export"
    log.write_bytes(entry)
    hits, errors = logscan.scan([str(log)], RULES)
    assert hits == [] and len(errors) == 1 and "export" in errors[0]


@pytest.mark.timeout(60)
def test_forged_records_in_the_ring_buffer_raise_nothing_at_any_start(tmp_path: Path) -> None:
    # the attack: crashing programs named like fault lines; their records stay in the
    # ring buffer, which every start reads from its oldest record (here: a fresh state each time)
    forged = [
        renderings(TEMPLATES[name], message.encode()[:15], message.encode().replace(b"/", b""))[0]
        for name in ("segfault", "trap", "hung-task", "soft-lockup", "oom-kill", "xid-154")
        for message, _ in CORPUS_FAULTS[::7]
    ]
    real = "NVRM: Xid (PCI:0000:5d:00): 48, pid=1, name=python3, DBE"  # then a real fault
    every = len(forged) + 1
    for start in range(2):
        (tmp_path / str(start)).mkdir()
        run = Running(tmp_path / str(start))
        try:
            run.write(b"".join(record(i + 1, m) for i, m in enumerate(forged)))
            run.write(record(len(forged) + 1, real))
            run.wait_for(lambda r=run: r.source.stats["records"] == every, "every record")
            run.wait_for(lambda r=run: r.findings, "the real Xid")
        finally:
            run.stop()
        codes = {f.code for f in run.findings}
        assert codes - {"KERNEL_HUNG_TASK", "KERNEL_SOFT_LOCKUP", "GPU_XID_154"} == {"GPU_XID_48"}
        # what their own formats raise with any name: GPU_XID_154 at the catalogue's warning
        assert all(f.severity is None for f in run.findings if f.code == "GPU_XID_154")
        assert run.findings[-1].details["seq"] == len(forged) + 1
