"""The systemd units as packaged: `systemd-analyze verify` clean, exposure scores kept low."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from .chroots import ROOT

pytestmark = pytest.mark.timeout(300)
UNIT = ROOT / "systemd" / "hma.service"
# docs/packaging.md explains what keeps each where it is (systemd 252: 2.4, 1.7 and 1.7)
MAX_EXPOSURE = {"hma.service": 3.0, "hma-topology.service": 2.0, "hma-watch.service": 2.0}


@pytest.fixture(scope="module")
def root(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A root folder with the host's systemd units, /bin/kill, and the .deb's files."""
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing (scripts/bootstrap installs systemd)")
    top = tmp_path_factory.mktemp("unitroot")
    (top / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", top / "usr/lib/systemd/system", symlinks=True)
    (top / "bin").symlink_to("usr/bin")
    (top / "lib").symlink_to("usr/lib")
    tree = top / "pkg"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True, timeout=60)
    (top / "usr/bin").mkdir()
    shutil.copy2(tree / "usr/bin/hma", top / "usr/bin/hma")
    shutil.copy2(shutil.which("kill") or "/usr/bin/kill", top / "usr/bin/kill")
    for unit in MAX_EXPOSURE:
        shutil.copy2(tree / "lib/systemd/system" / unit, top / "usr/lib/systemd/system")
    yield top


def analyze(root: Path, *args: str, unit: str = "hma.service") -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemd-analyze", *args, f"--root={root}", unit],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("unit", MAX_EXPOSURE)
def test_packaged_unit_is_the_source_unit(root: Path, unit: str) -> None:
    source = (ROOT / "systemd" / unit).read_text()
    assert (root / "usr/lib/systemd/system" / unit).read_text() == source


@pytest.mark.parametrize("unit", MAX_EXPOSURE)
def test_verify_is_clean(root: Path, unit: str) -> None:
    res = analyze(root, "verify", unit=unit)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == "", res.stderr


def test_verify_notices_a_missing_binary(root: Path) -> None:
    """The check above can fail: without the launcher, verify complains."""
    (root / "usr/bin/hma").rename(root / "hma.away")
    try:
        res = analyze(root, "verify")
    finally:
        (root / "hma.away").rename(root / "usr/bin/hma")
    assert res.returncode != 0 and "/usr/bin/hma" in res.stderr


@pytest.mark.parametrize("unit", MAX_EXPOSURE)
def test_security_exposure(root: Path, unit: str, record_property) -> None:  # type: ignore[no-untyped-def]
    res = analyze(root, "security", "--offline=true", "--no-pager", unit=unit)
    match = re.search(rf"Overall exposure level for {re.escape(unit)}: ([0-9.]+)", res.stdout)
    assert match, res.stdout + res.stderr
    exposure = float(match.group(1))
    record_property("exposure", exposure)
    print(f"systemd-analyze security --offline=true {unit}: exposure {exposure}")
    assert exposure <= MAX_EXPOSURE[unit]


def test_unit_keeps_what_the_probes_need() -> None:
    """The lines docs/packaging.md explains as required by probes or remediation."""
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "RestartPreventExitStatus=78",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "DeviceAllow=/dev/kmsg r",
        "DeviceAllow=char-nvidia* rw",
        "DeviceAllow=char-infiniband_verbs rw",
        "LimitMEMLOCK=infinity",
        "ProtectKernelLogs=no",
        "CapabilityBoundingSet=CAP_SYSLOG",
        "RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6",
    ):
        assert line in text.splitlines(), line


@pytest.mark.parametrize("unit", MAX_EXPOSURE)
def test_every_key_is_explained(unit: str) -> None:
    """docs/packaging.md has a table of each unit's lines: every key is in it."""
    text = (ROOT / "systemd" / unit).read_text()
    doc = (ROOT / "docs" / "packaging.md").read_text()
    section = doc.split(f"(`systemd/{unit}`)", 1)[1].split("\n## ", 1)[0]
    for key in {ln.split("=", 1)[0] for ln in text.splitlines() if re.match(r"^[A-Z]\w+=", ln)}:
        assert f"`{key}=" in section, f"{key}= of {unit} is not explained in docs/packaging.md"


def test_topology_unit_may_write_the_default_topology_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """`hma topology` writes next to slurm.conf by default: that folder is writable in the unit."""
    from hma.commands.topology import target

    monkeypatch.delenv("SLURM_CONF", raising=False)
    text = (ROOT / "systemd" / "hma-topology.service").read_text()
    writable = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("ReadWritePaths=")]
    assert "ProtectSystem=strict" in text.splitlines()
    for fmt in ("block", "yaml", "tree"):
        assert f"-{target({}, {}, fmt).parent}" in writable
