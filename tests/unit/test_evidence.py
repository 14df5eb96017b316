"""Evidence before a repair: the bundle's pieces, its bounds, a full disk, HMA_EVIDENCE."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hma.config.schema import ConfigError
from hma.remediation import evidence
from tests.faults import fault
from tests.unit.test_remediation_engine import FakeSlurm, make, run

pytestmark = pytest.mark.timeout(60)


def program(tmp: Path, name: str, body: str) -> str:
    """A stand-in program (a Python script) named ``name``."""
    path = tmp / name
    path.write_text(f"#!{sys.executable}\nimport os, sys\n{body}\n")
    path.chmod(0o755)
    return str(path)


def settings(tmp: Path, **changes: Any) -> evidence.Settings:
    bug = program(
        tmp,
        "nvidia-bug-report.sh",
        "out = sys.argv[sys.argv.index('--output-file') + 1]\n"
        "open(out + '.gz', 'wb').write(b'\\x1f\\x8b report')",
    )
    base = evidence.Settings(
        enabled=True,
        folder=str(tmp / "evidence"),
        status_file=str(tmp / "status.json"),
        keep=3,
        max_bytes=10 * 1024**2,
        piece_bytes=65536,
        min_free_bytes=0,
        timeout=20.0,
        bug_report=(bug,),
        kernel_log=(program(tmp, "kernel-log", "print('[ 1.0] NVRM: Xid 79')"),),
        node_record=(
            program(tmp, "scontrol", "print('NodeName=' + sys.argv[-1] + ' State=DRAIN')"),
        ),
    )
    return replace(base, **changes)


def test_a_bundle_holds_every_piece(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_text('{"verdict": "unhealthy"}')
    s = settings(tmp_path)
    path = evidence.bundle("n1", s.folder, s, "reboot", {"findings": [{"code": "GPU_XID_79"}]})
    bundle = Path(path)
    assert bundle.parent == Path(s.folder) and bundle.name.endswith("-reboot-n1")
    names = sorted(p.name for p in bundle.iterdir())
    assert names == [
        "MANIFEST.json",
        "hma.json",
        "kernel.log",
        "node-record.txt",
        "nvidia-bug-report.log.gz",
    ]
    assert (bundle / "node-record.txt").read_text() == "NodeName=n1 State=DRAIN\n"
    assert "Xid 79" in (bundle / "kernel.log").read_text()
    doc = json.loads((bundle / "hma.json").read_text())
    assert doc["findings"][0]["code"] == "GPU_XID_79"
    assert doc["status_json"] == {"verdict": "unhealthy"}
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert all(piece["error"] == "" for piece in manifest["pieces"].values())


def test_bounded_in_time_and_size(tmp_path: Path) -> None:
    slow = program(tmp_path, "slow", "import time; time.sleep(30)")
    big = program(tmp_path, "big", "sys.stdout.write('x' * 200000)")
    s = settings(tmp_path, node_record=(big,), kernel_log=(slow,), timeout=0.5, bug_report=())
    bundle = Path(evidence.bundle("n1", s.folder, s))
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert (bundle / "node-record.txt").stat().st_size <= s.piece_bytes
    assert manifest["pieces"]["node-record.txt"]["error"].startswith("output cut at")
    assert manifest["pieces"]["kernel.log"]["error"].startswith("timed out after 0.")
    assert "nvidia-bug-report.log.gz" not in manifest["pieces"]


def test_the_commands_share_one_timeout(tmp_path: Path) -> None:
    # a bug report that never ends gets what the quick pieces left, and the bundle is bounded
    # by one timeout, not one per command
    slow = program(tmp_path, "slow-bug-report", "import time; time.sleep(30)")
    s = settings(tmp_path, bug_report=(slow,), timeout=1.0)
    bundle = Path(evidence.bundle("n1", s.folder, s))
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert "Xid 79" in (bundle / "kernel.log").read_text()
    assert manifest["pieces"]["kernel.log"]["error"] == ""
    assert manifest["pieces"]["nvidia-bug-report.log.gz"]["error"].startswith("timed out after")
    # a node record that eats the whole time leaves nothing for the others, which are not run
    hang = program(tmp_path, "hang", "import time; time.sleep(30)")
    s = settings(tmp_path, node_record=(hang,), timeout=0.5)
    manifest = json.loads((Path(evidence.bundle("n1", s.folder, s)) / "MANIFEST.json").read_text())
    assert manifest["pieces"]["node-record.txt"]["error"] == "timed out after 0.5 s"
    for piece in ("kernel.log", "nvidia-bug-report.log.gz"):
        assert manifest["pieces"][piece]["error"] == "not run: the bundle's 0.5 s were spent"


def test_a_missing_bug_report_is_left_out(tmp_path: Path) -> None:
    s = settings(tmp_path, bug_report=("no-such-nvidia-bug-report.sh",))
    bundle = Path(evidence.bundle("n1", s.folder, s))
    assert not (bundle / "nvidia-bug-report.log.gz").exists()
    assert (bundle / "kernel.log").exists()


def test_the_oldest_bundles_go_by_count_and_by_size(tmp_path: Path) -> None:
    s = settings(tmp_path, keep=2)
    made = [evidence.bundle(f"n{i}", s.folder, s) for i in range(4)]
    assert sorted(os.listdir(s.folder)) == sorted(Path(p).name for p in made[-2:])
    one = sum(f.stat().st_size for f in Path(made[-1]).iterdir())
    small = replace(s, keep=10, max_bytes=one + one // 2)
    newest = evidence.bundle("n9", s.folder, small)
    assert os.listdir(s.folder) == [Path(newest).name]  # the others went; never the new one
    (Path(s.folder) / "not-a-bundle").write_text("kept")
    evidence.prune(s.folder, replace(s, keep=1, max_bytes=1))
    assert "not-a-bundle" in os.listdir(s.folder)


def test_a_full_disk_leaves_no_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings(tmp_path, min_free_bytes=1024**4)  # more than any disk here has free
    assert evidence.bundle("n1", s.folder, s) == ""
    assert os.listdir(s.folder) == []

    def full(self: Path, *args: Any, **kwargs: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    s = settings(tmp_path, min_free_bytes=0)
    monkeypatch.setattr(Path, "write_text", full)
    assert evidence.bundle("n1", s.folder, s) == ""
    assert os.listdir(s.folder) == []  # the partial bundle was removed


def test_options_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="evidence_keep"):
        make(tmp_path, FakeSlurm("n1"), evidence_keep=0)


def hook(tmp: Path) -> list[str]:
    """A reboot hook that records HMA_EVIDENCE and what the bundle holds."""
    script = program(
        tmp,
        "reboot-hook",
        f"path = os.environ['HMA_EVIDENCE']\n"
        f"names = sorted(os.listdir(path)) if path and os.path.isdir(path) else []\n"
        f"open({str(tmp / 'seen.json')!r}, 'w').write(__import__('json').dumps([path, names]))",
    )
    return [script]


@pytest.mark.parametrize("disk", ["room", "full"])
def test_the_reboot_hook_sees_the_bundle(tmp_path: Path, disk: str) -> None:
    (tmp_path / "bin").mkdir()
    scontrol = program(tmp_path / "bin", "scontrol", "print('NodeName=n1 State=DRAIN')")
    fake = FakeSlurm("n1", "n2", "n3", "n4")
    rem = make(
        tmp_path,
        fake,
        reboot_mode="command",
        reboot_command=hook(tmp_path),
        evidence_node_record=[scontrol, "-o", "show", "node"],
        evidence_bug_report=[],
        evidence_min_free_bytes=1024**4 if disk == "full" else 0,
    )
    run(rem, (fault(),))
    path, names = json.loads((tmp_path / "seen.json").read_text())
    if disk == "full":  # the repair went on without a bundle
        assert path == "" and names == []
        return
    assert Path(path).parent == tmp_path / "state" / "evidence"
    assert names == ["MANIFEST.json", "hma.json", "node-record.txt"]
    doc = json.loads((Path(path) / "hma.json").read_text())
    assert [f["code"] for f in doc["findings"]] == ["GPU_XID_79"]
    assert doc["remediation"]["node"] == "n1"
    shutil.rmtree(path)
