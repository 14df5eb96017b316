"""``hma logscan``'s line shapes: a line is a kernel message only when its shape says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hma.commands import logscan
from hma.contracts.catalogue import load_builtin
from hma.probes.kernel_log.lines import saved_line
from hma.probes.kernel_log.rules import RuleSet

XID = "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, planted"
RULES = RuleSet.load(None)

# journalctl's output modes (systemd logs-show.c), syslog files and RFC 5424, each with the
# kernel's own line (identifier `kernel`) and what `logger -t TAG` (any user) makes of it.
SHAPES = [
    ("syslog", "Dec 02 10:43:35 worker4 {ident}: {msg}"),  # -o short
    ("syslog", "Dec  2 10:43:35 worker4 {ident}: {msg}"),  # /var/log/messages
    ("syslog", "Dec 02 10:43:35.123456 worker4 {ident}: {msg}"),  # -o short-precise
    ("syslog", "<4>Dec  2 10:43:35 worker4 {ident}: {msg}"),  # RFC 3164 with its priority
    ("iso", "2024-12-02T10:43:35+0000 worker4 {ident}: {msg}"),  # -o short-iso
    ("iso", "2024-12-02T10:43:35+00:00 worker4 {ident}: {msg}"),  # -o short-iso, newer systemd
    ("iso", "2024-12-02T10:43:35.123456+0000 worker4 {ident}: {msg}"),  # -o short-iso-precise
    ("iso", "2024-12-02T10:43:35.123456+00:00 worker4 {ident}: {msg}"),  # rsyslog RFC 3339
    ("full", "Mon 2024-12-02 10:43:35 UTC worker4 {ident}: {msg}"),  # -o short-full
    ("full", "Mon 2024-12-02 10:43:35 +03 worker4 {ident}: {msg}"),  # numeric zone name
    ("unix", "1733136215.123456 worker4 {ident}: {msg}"),  # -o short-unix
    ("monotonic", "[240314.528856] worker4 {ident}: {msg}"),  # -o short-monotonic
    ("monotonic", "[    5.000001] worker4 {ident}: {msg}"),
    ("monotonic", "[240314.528856 <    0.000012>] worker4 {ident}: {msg}"),  # -o short-delta
]
RFC5424 = "<4>1 2024-12-02T10:43:35.123456+00:00 worker4 {app} {pid} - {sd} {msg}"


@pytest.mark.parametrize(("fmt", "shape"), SHAPES)
@pytest.mark.parametrize(
    "ident",
    ["NVRM", "NVRM[12]", "kernel[123]", "xkernel", "kernelx", "my kernel", "kernel foo", "sshd[1]"],
)
def test_user_space_identifiers_are_not_the_kernel(fmt: str, shape: str, ident: str) -> None:
    if fmt == "monotonic" and not ident.endswith("]"):
        # journalctl prints a user-space identifier with the writer's pid (journald records
        # _PID for every user-space entry); `[ts] host a: ...` is a dmesg line (`nvme nvme0: `)
        pytest.skip("journalctl -o short-monotonic prints user-space identifiers with a pid")
    assert saved_line(shape.format(ident=ident, msg=XID)) == (fmt, None)
    later = shape.format(ident=ident, msg=f"user says kernel: {XID}")
    assert saved_line(later) == (fmt, None)


@pytest.mark.parametrize(("fmt", "shape"), SHAPES)
def test_the_kernel_identifier_is_a_kernel_message(fmt: str, shape: str) -> None:
    assert saved_line(shape.format(ident="kernel", msg=XID)) == (fmt, XID)
    stamped = shape.format(ident="kernel", msg=f"[240314.528856] {XID}")
    assert saved_line(stamped) == (fmt, XID)


@pytest.mark.parametrize(
    ("app", "pid", "sd", "kernel"),
    [
        ("kernel", "-", "-", True),
        ("kernel", "-", '[meta seq="1"]', True),
        ("NVRM", "12", "-", False),
        ("kernel[1]", "-", "-", False),
        ("xkernel", "-", '[a b="kernel"][c d="\\]"]', False),
    ],
)
def test_rfc5424_app_name(app: str, pid: str, sd: str, kernel: bool) -> None:
    line = RFC5424.format(app=app, pid=pid, sd=sd, msg=XID)
    assert saved_line(line) == ("rfc5424", XID if kernel else None)


@pytest.mark.parametrize(
    ("line", "fmt", "message"),
    [
        ("   " + XID, "plain", None),  # journalctl's continuation of a multi-line entry
        ("[ 1.0] NVRM[12]: Xid (PCI:0000:01:00): 79", "monotonic", None),  # --no-hostname
        ("[ 1.0] host :x[7]: " + XID, "monotonic", None),
        ("[ 9.1] nvme nvme0: I/O 12 QID 3 timeout", "dmesg", "nvme nvme0: I/O 12 QID 3 timeout"),
        (
            "[ 9.2] mlx5_core 0000:5e:00.0: mlx5_health_check:2 (pid 1)",
            "dmesg",
            "mlx5_core 0000:5e:00.0: mlx5_health_check:2 (pid 1)",
        ),
        ("[ 5.5] Out of memory: Killed process 1", "dmesg", "Out of memory: Killed process 1"),
        ("[ 7.0] {1}[Hardware Error]: fatal", "dmesg", "{1}[Hardware Error]: fatal"),
        ("2024-12-02T10:43:35,123456+00:00 host NVRM: x", "iso", "host NVRM: x"),  # dmesg iso
    ],
)
def test_other_shapes(line: str, fmt: str, message: Optional[str]) -> None:
    assert saved_line(line) == (fmt, message)


HOSTS = st.from_regex(r"\A[a-z][a-z0-9-]{0,20}(\.[a-z0-9-]{1,10}){0,2}\Z")
IDENTS = st.text(
    st.sampled_from(":[] kernelNVRM") | st.characters(blacklist_categories=("Cc", "Cs")),
    min_size=1,
    max_size=20,
).filter(lambda t: t != "kernel" and ": " not in t and not t[0].isspace())
MESSAGES = st.sampled_from(
    [
        XID,
        "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
        "mce: [Hardware Error]: Machine Check Exception: 5 Bank 4",
        "INFO: task python3:1 blocked for more than 120 seconds.",
        "neuron2: NEURON_HW_ERR=DMA_ERROR nd-id=2",
        f"kernel: {XID}",
        f"[ 1.0] {XID}",
        # the issue 21 rules: a user-space line quoting any of them is no kernel evidence
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout",
        "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Data Link",
        "mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached"
        " miss count",
        "efa 0000:00:1d.0 rdmap0s29: Wait for completion (polling) timeout",
        "nvme nvme0: I/O 25 QID 0 timeout, reset controller",
        "EXT4-fs (sdb): Remounting filesystem read-only",
        "XFS (sda4): Corruption of in-memory data (0x8) detected.  Shutting down filesystem.",
        "nfs: server fs1 not responding, still trying",
        "Lustre: fs-OST0000-osc-ffff: Connection to fs-OST0000 (at 10.0.0.1@tcp) was lost",
        "watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [python3:1]",
        "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
    ]
)


@given(
    st.sampled_from(SHAPES), HOSTS, IDENTS, st.one_of(st.none(), st.integers(0, 99999)), MESSAGES
)
def test_property_no_finding_unless_the_identifier_is_kernel(
    shape: tuple[str, str], host: str, ident: str, pid: Optional[int], msg: str
) -> None:
    fmt, template = shape
    if fmt == "monotonic" and pid is None:
        return  # `[ts] host a: ...` without a pid: a dmesg line (documented)
    if fmt == "monotonic" and any(c.isspace() for c in ident):
        return  # `[ts] host a b: ...`: a dmesg line (documented)
    field = ident if pid is None else f"{ident}[{pid}]"
    line = template.replace("worker4", host).format(ident=field, msg=msg)
    got_fmt, message = saved_line(line)
    assert message is None, (line, got_fmt, message)
    assert RULES.matcher("t").feed(message or "") is None


def test_a_flood_of_matching_lines_keeps_bounded_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logscan, "MAX_FINDINGS", 50)
    path = tmp_path / "flood.log"
    with open(path, "w", encoding="utf-8") as out:
        for i in range(20_000):
            out.write(f"[ 1.{i}] NVRM: Xid (PCI:0000:{i % 256:02x}:00): {i % 150 + 1}, pid={i}\n")
    not_kept = [0]
    hits, errors = logscan.scan([str(path)], RULES, not_kept)
    codes = {h.finding.code for h in hits}  # at most 150 (Xids 1-150), one kept each past the cap
    assert not errors and len(codes) <= 150 and 50 <= len(hits) <= 50 + len(codes)
    assert sum(h.count for h in hits) + not_kept[0] == 20_000
    assert all(len(h.last) <= 1000 and len(h.finding.details["raw"]) <= 1000 for h in hits)
    doc = logscan.document(hits, errors, load_builtin(), not_kept[0])
    assert len(doc["findings"]) == len(hits) and doc["not_kept"] == not_kept[0] > 0
    assert f"{not_kept[0]} matching line(s)" in logscan.render_text(doc)


def test_past_the_cap_every_code_still_counts_for_the_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap keeps output bounded; a fault of a code not seen before is still kept, so the
    worst severity is never lowered by what was dropped."""
    monkeypatch.setattr(logscan, "MAX_FINDINGS", 5)
    path = tmp_path / "mixed.log"
    with open(path, "w", encoding="utf-8") as out:
        for i in range(200):  # warnings (Xid 13) on 200 GPUs fill the cap
            out.write(f"[ 1.{i}] NVRM: Xid (PCI:0000:{i:02x}:00): 13, pid={i}\n")
        out.write("[ 2.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    not_kept = [0]
    hits, _errors = logscan.scan([str(path)], RULES, not_kept)
    assert len(hits) == 6 and not_kept[0] == 195
    doc = logscan.document(hits, [], load_builtin(), not_kept[0])
    assert doc["severity"] == "critical"


JOURNAL_JSON = (
    '{{"__REALTIME_TIMESTAMP":"1733136215123456","__MONOTONIC_TIMESTAMP":"240314528856",'
    '"_TRANSPORT":"{transport}","SYSLOG_IDENTIFIER":"{ident}","PRIORITY":"4","MESSAGE":{msg}}}'
)


@pytest.mark.parametrize(
    ("transport", "ident", "kernel"),
    [
        ("kernel", "kernel", True),
        ("kernel", "NVRM", True),  # a root-written /dev/kmsg record, as `hma inject` writes
        ("syslog", "kernel", False),  # `logger -t kernel`: any user
        ("journal", "kernel", False),
        ("stdout", "kernel", False),
    ],
)
def test_journal_json_is_a_kernel_message_only_with_the_kernel_transport(
    transport: str, ident: str, kernel: bool
) -> None:
    msg = XID.split("NVRM: ", 1)[1] if ident == "NVRM" else XID
    line = JOURNAL_JSON.format(transport=transport, ident=ident, msg=json.dumps(msg))
    assert saved_line(line) == ("json", XID if kernel else None)
    assert saved_line("\x1e" + line) == ("json", XID if kernel else None)  # -o json-seq


def test_journal_json_messages_in_bytes_and_broken_json() -> None:
    as_bytes = JOURNAL_JSON.format(transport="kernel", ident="kernel", msg=list(XID.encode()))
    assert saved_line(as_bytes) == ("json", XID)
    cut = '{"_TRANSPORT":"kernel","MESSAGE":"NVRM: Xid (PCI:0000:01:0'
    assert saved_line(cut) == ("json", None)
    assert saved_line('{"_TRANSPORT":"kernel","MESSAGE":null}') == ("json", None)
    assert saved_line('["_TRANSPORT","kernel"]')[1] == '["_TRANSPORT","kernel"]'  # not `{"`
    assert saved_line("{1}[Hardware Error]: event severity: fatal")[1] is not None


@pytest.mark.parametrize(
    ("line", "fmt", "message"),
    [
        ("kern  :warn  : [ 12.5] nvme nvme0: x", "dmesg", "nvme nvme0: x"),  # dmesg -x
        ("kern  :err   : 2025-01-21T04:41:44,285060+00:00 VFS: x", "iso", "VFS: x"),  # -x iso
        ("user  :warn  : [ 3.0] hello", "dmesg", "hello"),  # root-written /dev/kmsg record
        ("kern  :info  : nvme nvme0: x", "dmesg", "nvme nvme0: x"),  # dmesg -x -t
        ("<3>[   21.732871] rcu: INFO: x", "dmesg", "rcu: INFO: x"),  # dmesg -r
        ("[  200.105524][  T292] igb 0000:09:00.0: x", "dmesg", "igb 0000:09:00.0: x"),
        # util-linux dmesg 2.39+ prints the caller id after the time stamp and a blank
        ("[88690.479882] [ T593001] EDAC MC0: 1 UE x", "dmesg", "EDAC MC0: 1 UE x"),
        ("[    4.1] [    C3] nvme nvme0: x", "dmesg", "nvme nvme0: x"),
        ("[    4.1] [drm] x", "dmesg", "[drm] x"),  # a message that starts with brackets
        # dmesg -H / -e: the minute's stamp, then the seconds since the line before
        (
            "[Jul14 10:10] NVRM: Xid (PCI:0000:01:00): 79, x",
            "reltime",
            "NVRM: Xid (PCI:0000:01:00): 79, x",
        ),
        ("[  +0.005115] ena 0000:00:03.0 eth0: x", "reltime", "ena 0000:00:03.0 eth0: x"),
        ("kern  :err   : [  +0.000004] nvme nvme0: x", "reltime", "nvme nvme0: x"),
        ("[+0.5] x", "plain", "[+0.5] x"),  # not six digits: no dmesg stamp
        ("MESSAGE=NVRM: Xid (PCI:0000:01:00): 79", "export", None),  # journalctl -o export
        ("_TRANSPORT=kernel", "export", None),
    ],
)
def test_decoded_raw_caller_and_export_shapes(line: str, fmt: str, message: Optional[str]) -> None:
    assert saved_line(line) == (fmt, message)


def test_export_format_files_are_reported_unread(tmp_path: Path) -> None:
    path = tmp_path / "export.log"
    path.write_text(
        "__CURSOR=s=1\n_TRANSPORT=kernel\nSYSLOG_IDENTIFIER=kernel\n" f"MESSAGE={XID}\n\n"
    )
    hits, errors = logscan.scan([str(path)], RULES)
    assert hits == [] and len(errors) == 1 and "-o export" in errors[0]


THE_GPU = "NVRM: The NVIDIA GPU 0000:b3:00.0"
FALLEN = "NVRM: fallen off the bus and is not responding to commands."


@pytest.mark.parametrize(
    ("head", "found"),
    [
        (f"[ 1843.308145] {THE_GPU}", True),  # dmesg indents a record's later lines
        (f"Jun 11 09:13:00 gb200-n1 kernel: {THE_GPU}", True),  # so does journalctl -o short
        (f"[Jun11 09:13] {THE_GPU}", True),  # dmesg -H
        # the first line is no NVIDIA driver record of the kernel's: its indented lines are not
        (f"Jun 11 09:13:00 gb200-n1 NVRM[7]: {THE_GPU}", False),  # user space (logger -t)
        ("[ 1843.308145] python3[42]: segfault at 0 ip 1 sp 2 error 4 in x[1+2]", False),
        # a record that quotes a user (the Xid line's name=) carries no driver text after it
        ("[ 1843.308145] NVRM: Xid (PCI:0000:b3:00): 13, pid=42, name=" + THE_GPU, False),
    ],
)
def test_indented_lines_of_an_nvidia_driver_record(tmp_path: Path, head: str, found: bool) -> None:
    pad = " " * 15
    path = tmp_path / "dmesg.log"
    path.write_text(
        f"{head}\n{pad}NVRM: (PCI ID: 10de:26b5) installed in this system has\n{pad}{FALLEN}\n"
    )
    hits, errors = logscan.scan([str(path)], RULES)
    assert errors == []
    got = [(h.finding.code, h.finding.component) for h in hits if "FALLEN" in h.finding.code]
    assert got == ([("GPU_FALLEN_OFF_BUS", "gpu:0000:b3:00")] if found else []), got


def test_an_indented_line_after_other_text_is_not_the_drivers(tmp_path: Path) -> None:
    path = tmp_path / "dmesg.log"
    pad = " " * 15
    path.write_text(f"[ 1.0] {THE_GPU}\n{pad}python says: hello\n{pad}{FALLEN}\n")
    assert logscan.scan([str(path)], RULES)[0] == []
