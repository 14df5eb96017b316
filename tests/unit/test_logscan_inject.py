"""``hma logscan`` over saved logs in every format, and ``hma inject xid``."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
from pathlib import Path

import pytest

from hma import cli
from hma.commands import inject
from hma.commands import logscan as logscan_mod
from hma.probes.kernel_log.rules import RuleSet, compile_rule

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel-log"


@pytest.fixture
def config(tmp_path: Path) -> str:
    cfg = tmp_path / "hma.toml"
    cfg.write_text(f'[sources.kernel_log]\nrules_dir = "{tmp_path / "rules.d"}"\n')
    return str(cfg)


def logscan(capsys: pytest.CaptureFixture[str], config: str, *argv: str) -> tuple[int, dict]:
    rc = cli.main(["--config", config, "logscan", "--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


def site_rules(tmp_path: Path, text: str) -> Path:
    """A rules folder with one site rule file."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "x.toml").write_text(text)
    return site


def codes(doc: dict) -> list[tuple[str, str, str]]:
    return [(f["code"], f["component"], f["severity"]) for f in doc["findings"]]


@pytest.mark.parametrize(
    ("name", "expected", "rc"),
    [
        (
            "dmesg.log",
            [
                ("GPU_XID_32", "gpu:0000:01:00", "warning"),
                ("GPU_XID_31", "gpu:0000:01:00", "warning"),
                ("KERNEL_HUNG_TASK", "node", "warning"),
            ],
            1,
        ),
        (
            "dmesg-ctime.log",
            [
                ("GPU_XID_48", "gpu:0000:8a:00", "critical"),
                ("GPU_XID_63", "gpu:0000:8a:00", "warning"),
                ("GPU_XID_13", "gpu:0000:cb:00", "warning"),
                ("GPU_XID_109", "gpu:0000:cb:00", "critical"),
                ("GPU_XID_119", "gpu:0000:9b:00", "critical"),
            ],
            2,
        ),
        (
            "syslog.log",
            [
                ("GPU_XID_48", "gpu:0000:07:00", "critical"),
                ("GPU_XID_45", "gpu:0000:dc:00", "warning"),
                # `worker4 NVRM: Xid ...: 79` was written by user space: not a kernel line
                ("KERNEL_MCE_HW_ERROR", "node", "warning"),
            ],
            2,
        ),
        (
            "iso.log",
            [
                ("GPU_XID_149", "gpu:0019:01:00", "critical"),
                ("GPU_XID_145", "gpu:0018:01:00", "warning"),
                ("GPU_FALLEN_OFF_BUS", "gpu:0000:b3:00", "critical"),
                ("GPU_FALLEN_OFF_BUS", "gpu:0000:18:00", "critical"),
            ],
            2,
        ),
        (
            "kmsg.log",
            [
                ("GPU_XID_79", "gpu:0000:44:00", "critical"),
                ("GPU_XID_71", "gpu:0000:b9:00", "critical"),
                ("KERNEL_MCE_HW_ERROR", "node", "critical"),
                ("NEURON_KERNEL_HW_ERROR", "neuron:0", "critical"),
            ],
            2,
        ),
    ],
)
def test_logscan_each_format(
    capsys: pytest.CaptureFixture[str], config: str, name: str, expected: list, rc: int
) -> None:
    got_rc, doc = logscan(capsys, config, str(FIXTURES / name))
    assert codes(doc) == expected
    assert got_rc == rc and doc["severity"] == ["ok", "warning", "critical"][rc]
    for f in doc["findings"]:  # the matching line is the evidence
        assert f["details"]["raw"] in (FIXTURES / name).read_text()


def test_logscan_counts_repeats_and_keeps_the_last_line(
    capsys: pytest.CaptureFixture[str], config: str
) -> None:
    _rc, doc = logscan(capsys, config, str(FIXTURES / "dmesg.log"))
    xid31 = next(f for f in doc["findings"] if f["code"] == "GPU_XID_31")
    assert xid31["details"]["count"] == 2
    assert xid31["details"]["lineno"] == 4 and xid31["details"]["last_at"].endswith(":5")


def test_logscan_text_output_gzip_and_clean_logs(
    capsys: pytest.CaptureFixture[str], config: str, tmp_path: Path
) -> None:
    packed = tmp_path / "syslog.1.gz"
    packed.write_bytes(gzip.compress((FIXTURES / "syslog.log").read_bytes()))
    assert cli.main(["--config", config, "logscan", str(packed)]) == 2
    out = capsys.readouterr().out
    assert "[critical] GPU_XID_48 gpu:0000:07:00" in out
    assert "Dec  2 10:43:35 worker4 kernel: [240314.528856] NVRM: Xid (PCI:0000:07:00): 48" in out
    assert "GPU_XID_79" not in out
    clean = tmp_path / "clean.log"
    clean.write_bytes(b"[ 1.0] all good\n\xff\xfe binary \x00 junk\n")
    assert cli.main(["--config", config, "logscan", str(clean)]) == 0


def test_logscan_unreadable_file_is_unknown(
    capsys: pytest.CaptureFixture[str], config: str, tmp_path: Path
) -> None:
    rc, doc = logscan(capsys, config, str(tmp_path / "missing.log"))
    assert rc == 3 and doc["errors"] and doc["severity"] == "unknown"


def test_logscan_site_rules_from_rules_dir(
    capsys: pytest.CaptureFixture[str], config: str, tmp_path: Path
) -> None:
    site = site_rules(
        tmp_path,
        '[[rules]]\nname = "oom"\npattern = "Out of memory: Killed process (?P<pid>\\\\d+)"\n'
        'code = "SITE_OOM_KILL"\nformats = ["oom-kill"]\n\n'  # the format quotes the user
        '[codes.SITE_OOM_KILL]\nsummary = "OOM kill"\n'
        'remedy = "Look at the job."\nseverity = "warning"\naction = "none"\n'
        'clears = "window"\nwindow_s = 600.0\n',
    )
    log = tmp_path / "oom.log"
    log.write_text("[ 5.5] Out of memory: Killed process 4242 (python3)\n")
    rc, doc = logscan(capsys, config, "--rules-dir", str(site), str(log))
    assert rc == 1 and codes(doc) == [("SITE_OOM_KILL", "node", "warning")]
    assert doc["findings"][0]["details"]["pid"] == "4242"


XID_LINE = "[ 9.0] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, off the bus"
FALLEN = [
    "[ 9.1] NVRM: The NVIDIA GPU 0000:b3:00.0",
    "[ 9.1] NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "[ 9.1] NVRM: fallen off the bus and is not responding to commands.",
]


@pytest.mark.parametrize("block", [64, 97, 4096, logscan_mod.BLOCK])
def test_streamed_blocks_keep_line_numbers_and_multi_line_context(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """Whatever the block size, line numbers and the three-line rule (its PCI id two lines up,
    possibly in an earlier block) come out as if read line by line."""
    monkeypatch.setattr(logscan_mod, "BLOCK", block)
    noise = [f"[ 1.{i}] eth0: renamed from veth{i}" for i in range(40)]
    text = "\n".join([*noise, XID_LINE, *noise[:7], *FALLEN, *noise[:3], XID_LINE]) + "\n"
    stream = io.BytesIO(text.encode())
    hits: dict = {}
    one = logscan_mod._Scan("mem", RuleSet.load(None), hits)
    for chunk in logscan_mod.blocks(stream):
        assert chunk.endswith(b"\n")
        one.block(chunk)
    got = {h.finding.code: h for h in hits.values()}
    assert got["GPU_XID_79"].finding.details["lineno"] == 41 and got["GPU_XID_79"].count == 2
    assert got["GPU_XID_79"].last_where == "mem:55"
    fallen = got["GPU_FALLEN_OFF_BUS"].finding
    assert fallen.component == "gpu:0000:b3:00" and fallen.details["lineno"] == 51
    assert one.lineno == 55


def test_over_long_lines_are_cut_and_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logscan_mod, "BLOCK", 4096)
    monkeypatch.setattr(logscan_mod, "MAX_LINE", 1000)
    data = b"x" * 50_000 + b"NVRM: Xid (PCI:0000:02:00): 79, hidden\n" + XID_LINE.encode()
    out = list(logscan_mod.blocks(io.BytesIO(data)))  # no newline at the end: still a line
    assert max(len(b) for b in out) <= 4096 + 1000 + 1
    assert b"".join(out) == b"x" * 1000 + b"\n" + XID_LINE.encode() + b"\n"


def test_gzip_of_newlines_is_streamed(
    capsys: pytest.CaptureFixture[str], config: str, tmp_path: Path
) -> None:
    packed = tmp_path / "nl.gz"
    with gzip.open(packed, "wb", compresslevel=1) as out:
        for _ in range(16):
            out.write(b"\n" * (1 << 20))
        out.write(XID_LINE.encode() + b"\n")
    rc, doc = logscan(capsys, config, str(packed))
    assert rc == 2 and doc["findings"][0]["details"]["lineno"] == 16 * (1 << 20) + 1


def test_a_rule_without_a_literal_turns_the_prefilter_off(
    capsys: pytest.CaptureFixture[str], config: str, tmp_path: Path
) -> None:
    rule = '[[rules]]\nname = "any"\npattern = "(?:ab|cd)[0-9]{3}z"\ncode = "SITE_X"\n'
    code = 'summary = "x"\nremedy = "x"\nseverity = "warning"\naction = "none"\n'
    site = site_rules(tmp_path, f"{rule}\n[codes.SITE_X]\n{code}clears = 'observation'\n")
    rules = RuleSet.load(str(site))
    assert rules.needles is None
    log = tmp_path / "x.log"
    log.write_text("[ 1.0] eth0 up\n[ 1.1] cd123z\n" + XID_LINE + "\n")
    rc, doc = logscan(capsys, config, "--rules-dir", str(site), str(log))
    assert codes(doc) == [
        ("SITE_X", "node", "warning"),
        ("GPU_XID_79", "gpu:0000:01:00", "critical"),
    ]


def test_needles_are_derived_from_a_rule_without_them() -> None:
    rule = compile_rule(
        {"name": "c", "pattern": r"mlx5_core (?P<pci>\S+): Cable unplugged", "code": "SITE_C"}, "t"
    )
    assert rule.needles == (": Cable unplugged",)
    loose = compile_rule({"name": "d", "pattern": "(?i)cable unplugged", "code": "SITE_D"}, "t")
    assert loose.needles == ()  # case-insensitive: no literal to rely on


def test_prefilter_and_context_of_the_matcher() -> None:
    matcher = RuleSet.load(None).matcher("t")
    assert matcher.feed("NVRM: GPU at PCI:0000:3b:00: GPU-5e4c0b1a") is None
    matcher.context([f.split("] ", 1)[1] for f in FALLEN[:2]])
    found = matcher.feed(FALLEN[2].split("] ", 1)[1])
    assert found is not None and found.component == "gpu:0000:b3:00"


def _args(**kw: object) -> argparse.Namespace:
    base = {"gpu": "0000:3b:00.0", "xid": 79, "text": None, "yes_really_drain": True}
    base.update(kw)
    return argparse.Namespace(**base)


def test_inject_writes_a_well_formed_record_that_logscan_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str
) -> None:
    target = tmp_path / "kmsg"
    assert inject.main(_args(kmsg=str(target)), euid=0) == 0
    data = target.read_bytes()
    assert data.startswith(b"<4>NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, ")
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    capsys.readouterr()
    rc, doc = logscan(capsys, config, str(target))
    assert rc == 2 and codes(doc) == [("GPU_XID_79", "gpu:0000:3b:00", "critical")]


@pytest.mark.timeout(20)
def test_inject_into_a_fifo_is_one_write(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert inject.main(_args(kmsg=str(fifo), xid=48, text="DBE"), euid=0) == 0
        got = os.read(reader, 4096)
    finally:
        os.close(reader)
    assert got == b"<4>NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, DBE\n"


@pytest.mark.parametrize(
    ("kw", "euid", "say"),
    [
        ({"yes_really_drain": False}, 0, "really drains"),
        ({}, 1000, "only root"),
        ({"gpu": "not-a-pci-id"}, 0, "not a PCI bus id"),
        ({"xid": -1}, 0, "out of range"),
    ],
)
def test_inject_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kw: dict, euid: int, say: str
) -> None:
    target = tmp_path / "kmsg"
    assert inject.main(_args(kmsg=str(target), **kw), euid=euid) == 2
    assert say in capsys.readouterr().err
    assert not target.exists()


def test_inject_cli_parses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "kmsg"
    argv = ["inject", "xid", "--gpu", "0000:3b:00.0", "--xid", "13", "--kmsg", str(target)]
    assert cli.main(argv) == 2  # no confirmation flag
    assert cli.main([*argv, "--yes-really-drain"]) == (0 if os.geteuid() == 0 else 2)


def test_a_look_back_rule_sees_the_lines_before_it_past_other_candidates(tmp_path: Path) -> None:
    # the Xid line in between is matched without its context (no rule of it looks back); the
    # fallen-off-the-bus line still finds its GPU two lines up
    log = tmp_path / "kern.log"
    log.write_text(
        "[ 1.000000] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "[ 1.000001] NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=x, Graphics Exception\n"
        "[ 1.000002] NVRM: fallen off the bus and is not responding to commands.\n"
    )
    hits, errors = logscan_mod.scan([str(log)], RuleSet.load(None))
    got = {(h.finding.code, h.finding.component) for h in hits}
    assert errors == [] and got == {
        ("GPU_XID_13", "gpu:0000:01:00"),
        ("GPU_FALLEN_OFF_BUS", "gpu:0000:b3:00"),
    }
