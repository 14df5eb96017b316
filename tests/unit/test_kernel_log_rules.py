"""Table tests: every kernel line format through the line readers and the built-in rules."""

from __future__ import annotations

from typing import Optional

import pytest

from hma.contracts.catalogue import load_builtin
from hma.contracts.model import Severity
from hma.probes.kernel_log.lines import parse_record, saved_line
from hma.probes.kernel_log.rules import RulesError, RuleSet, compile_rule

# (saved line, format, expected code, component, severity decided by the line or None)
TABLE: list[tuple[str, str, Optional[str], str, Optional[str]]] = [
    # REFERENCE 2.1 examples, each in the format it was published in
    (
        "[Mon Oct 29 12:07:39 2018] NVRM: Xid (PCI:0000:8a:00): 48, An uncorrectable double bit"
        " error (DBE) has been detected on GPU in the framebuffer at partition 4, subpartition 1.",
        "ctime",
        "GPU_XID_48",
        "gpu:0000:8a:00",
        None,
    ),
    (
        "Dec  2 10:43:35 worker4 kernel: [240314.528856] NVRM: Xid (PCI:0000:07:00): 48,"
        " pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE)",
        "syslog",
        "GPU_XID_48",
        "gpu:0000:07:00",
        None,
    ),
    (
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>',"
        " name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0)",
        "ctime",
        "GPU_XID_13",
        "gpu:0000:cb:00",
        None,
    ),
    (
        "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused"
        " by previous Xid 149",
        "plain",
        "GPU_XID_45",
        "gpu:0000:dc:00",
        None,
    ),
    (
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)",
        "plain",
        "GPU_XID_149",
        "gpu:0019:01:00",
        None,
    ),
    (
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x8)",
        "plain",
        "GPU_XID_145",
        "gpu:0018:01:00",
        "warning",
    ),
    (
        "[24128.828315] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000",
        "dmesg",
        "GPU_XID_32",
        "gpu:0000:01:00",
        None,
    ),
    (
        "6,3973,227996636,-;NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
        "kmsg",
        "GPU_XID_79",
        "gpu:0000:44:00",
        None,
    ),
    (
        "2024-08-30T11:43:09,123456+00:00 NVRM: Xid (PCI:0000:b9:00): 71, pid=<unknown>,"
        " name=<unknown>, NVLink: fatal error detected on link 6(0x10000, 0x0)",
        "iso",
        "GPU_XID_71",
        "gpu:0000:b9:00",
        None,
    ),
    (
        "2025-01-01T00:00:00+0000 n1 kernel: NVRM: Xid (PCI:0000:44:00): 999, unknown kind",
        "iso",
        "GPU_XID_OTHER",
        "gpu:0000:44:00",
        None,
    ),
    (
        "12,5,100,-;NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None)"
        " to 0x1 (GPU Reset Required)",
        "kmsg",
        "GPU_XID_154",
        "gpu:0000:3b:00",
        "critical",
    ),
    # fallen off the bus without an Xid, one-line form
    (
        "[  99.1] NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
        "dmesg",
        "GPU_FALLEN_OFF_BUS",
        "gpu:0000:18:00",
        None,
    ),
    (
        "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has"
        " fallen off the bus and is not responding to commands.",
        "plain",
        "GPU_FALLEN_OFF_BUS",
        "gpu:0000:b3:00",
        None,
    ),
    # machine checks: corrected -> catalogue warning, exception/fatal -> critical
    (
        "Dec  2 10:46:12 w4 kernel: [240471.0] mce: [Hardware Error]: Machine check events logged",
        "syslog",
        "KERNEL_MCE_HW_ERROR",
        "node",
        None,
    ),
    (
        "[ 5.0] mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 5: be00000000800400",
        "dmesg",
        "KERNEL_MCE_HW_ERROR",
        "node",
        None,
    ),
    (
        "0,3975,227996800,-;[Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: b2000000",
        "kmsg",
        "KERNEL_MCE_HW_ERROR",
        "node",
        "critical",
    ),
    (
        "[ 7.0] {1}[Hardware Error]: event severity: fatal",
        "dmesg",
        "KERNEL_MCE_HW_ERROR",
        "node",
        "critical",
    ),
    (
        "[24200.1] INFO: task python3:48213 blocked for more than 120 seconds.",
        "dmesg",
        "KERNEL_HUNG_TASK",
        "node",
        None,
    ),
    (
        "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0592464924bd45322"
        " hostname=ip-172-31-61-252 nd-id=3 nc-id=0 serial-num=19fcda00f5ff6eb9"
        " action=TERMINATE_INSTANCE",
        "plain",
        "NEURON_KERNEL_HW_ERROR",
        "neuron:3",
        None,
    ),
    (
        "Jan  1 00:00:00 trn1 kernel: neuron2: NEURON_HW_ERR=DMA_ERROR device=2",
        "syslog",
        "NEURON_KERNEL_HW_ERROR",
        "neuron:2",
        None,
    ),
    # the 6.16+ AER severity words reach the same rules
    (
        "pcieport 0000:00:1c.5: AER: PCIe Bus Error: severity=Correctable, type=Physical Layer,"
        " (Receiver ID)",
        "plain",
        None,  # one corrected error: only a storm raises
        "",
        None,
    ),
    # a task name is user text: an oops or panic wording inside it raises nothing
    ("CPU: 3 PID: 1 Comm: Oops: 0000 [#1] Tainted: G D 6.8.0 #1", "plain", None, "", None),
    ("CPU: 3 UID: 0 PID: 1 Comm: Kernel panic - not Not tainted 6.12 #1", "plain", None, "", None),
    (
        "INFO: task kernel BUG at x.c:1!:42 blocked for more than 120 seconds.",
        "plain",
        "KERNEL_HUNG_TASK",
        "node",
        None,
    ),
    # lines that must not match
    ("[ 1.0] nvidia-nvlink: Nvlink Core is being initialized", "dmesg", None, "", None),
    ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07", "plain", None, "", None),
]
# Lines user space wrote (`logger -t NVRM ...` needs no privilege): never a kernel message.
USER_SPACE = [
    ("Dec  2 10:43:35 worker4 NVRM[4242]: Xid (PCI:0000:01:00): 79, pid=1", "syslog"),
    ("Dec  2 10:43:35 worker4 NVRM: Xid (PCI:0000:01:00): 79, pid=1", "syslog"),
    ("Dec  2 10:43:35 worker4 sshd[1]: Invalid user NVRM: Xid (PCI:0000:01:00): 79, x", "syslog"),
    ("2024-12-02T10:43:35+0000 worker4 NVRM[4242]: Xid (PCI:0000:01:00): 79, pid=1", "iso"),
    ("NVRM[4242]: Xid (PCI:0000:01:00): 79, pid=1", "plain"),
    ("sshd[1]: Invalid user NVRM: Xid (PCI:0000:01:00): 79, pid=1", "plain"),
    ("Dec  2 10:43:30 worker4 systemd[1]: Started Session 12.", "syslog"),
    ("Dec  2 10:43:35 worker4 mce[7]: [Hardware Error]: Machine Check Exception: 5", "syslog"),
]


@pytest.mark.parametrize(("line", "fmt", "code", "component", "severity"), TABLE)
def test_line_formats_and_rules(
    line: str, fmt: str, code: Optional[str], component: str, severity: Optional[str]
) -> None:
    got_fmt, message = saved_line(line)
    assert got_fmt == fmt and message is not None
    finding = RuleSet.load(None).matcher("test").feed(message)
    if code is None:
        assert finding is None
        return
    assert finding is not None
    assert (finding.code, finding.component) == (code, component)
    assert finding.severity == (Severity.parse(severity) if severity else None)
    assert finding.details["line"] == message


@pytest.mark.parametrize(("line", "fmt"), USER_SPACE)
def test_user_space_lines_are_not_kernel_messages(line: str, fmt: str) -> None:
    assert saved_line(line) == (fmt, None)


def test_iso_dmesg_kernel_lines_are_not_taken_for_a_host_and_tag() -> None:
    line = "2024-12-02T10:43:35,123456+00:00 NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."
    fmt, message = saved_line(line)
    assert (fmt, message) == ("iso", line.split(" ", 1)[1])
    f = RuleSet.load(None).matcher("test").feed(message or "")
    assert f is not None and f.code == "GPU_FALLEN_OFF_BUS"


def test_three_line_fallen_off_the_bus_takes_the_pci_id_from_a_previous_line() -> None:
    matcher = RuleSet.load(None).matcher("test")
    assert matcher.feed("NVRM: The NVIDIA GPU 0000:b3:00.0") is None
    assert matcher.feed("NVRM: (PCI ID: 10de:26b5) installed in this system has") is None
    f = matcher.feed("NVRM: fallen off the bus and is not responding to commands.")
    assert f is not None and (f.code, f.component) == ("GPU_FALLEN_OFF_BUS", "gpu:0000:b3:00")
    alone = RuleSet.load(None).matcher("test")
    g = alone.feed("NVRM: fallen off the bus and is not responding to commands.")
    assert g is not None and g.component == "node"  # no PCI id in sight: the node


def test_every_rule_code_is_catalogued() -> None:
    rules = RuleSet.load(None)
    assert rules.check(load_builtin()) == []
    assert rules.codes() <= {e.code for e in load_builtin()}


def test_kmsg_record_parser() -> None:
    rec = parse_record(b"12,3973,227996636,-,caller=T1;NVRM: x \xff")
    assert rec is not None
    assert (rec.seq, rec.ts_usec, rec.facility, rec.level) == (3973, 227996636, 1, 4)
    assert rec.message == "NVRM: x \ufffd"
    assert parse_record(b"no header") is None and parse_record(b"a,b,c,d;x") is None


def test_huge_messages_are_cut_before_matching() -> None:
    f = RuleSet.load(None).matcher("t").feed("x" * 100_000 + "NVRM: Xid (PCI:0000:01:00): 79, y")
    assert f is None  # beyond MAX_MESSAGE: not scanned (bounded cost per line)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"name": "x", "pattern": "(", "code": "SITE_X"}, "bad regular expression"),
        ({"name": "x", "pattern": "a", "code": "SITE_X", "component": "gpu:{nope}"}, "nope"),
        ({"name": "x", "pattern": "a", "code": "SITE_X", "colour": 1}, "unknown key"),
        ({"name": "x", "pattern": "a", "code": "SITE_X", "severity": "bad"}, "severity"),
        ({"pattern": "a", "code": "SITE_X"}, "name"),
    ],
)
def test_bad_rules_are_rejected_with_the_reason(raw: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        compile_rule(raw, "site.toml")


def test_duplicate_rule_names_are_an_error() -> None:
    rule = compile_rule({"name": "x", "pattern": "a", "code": "SITE_X"}, "f")
    with pytest.raises(RulesError):
        RuleSet([rule, rule])


def test_a_storm_of_6_16_correctable_errors_raises_the_storm() -> None:
    # drivers/pci/pcie/aer.c 6.16+ prints "severity=Correctable" where older kernels print
    # "Corrected": the tenth within 60 s on one device raises the storm, as before
    matcher = RuleSet.load(None).matcher("test")
    line = (
        "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Correctable, type=Data Link Layer,"
        " (Transmitter ID)"
    )
    got = [matcher.feed(line, ts=float(i)) for i in range(10)]
    assert got[:9] == [None] * 9
    assert got[9] is not None
    assert (got[9].code, got[9].component) == ("KERNEL_AER_CORRECTED_STORM", "gpu:0000:3b:00")
