"""systemd/hma.service as packaged: `systemd-analyze verify` clean, exposure score kept low."""

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
MAX_EXPOSURE = 3.0  # docs/packaging.md explains what keeps it where it is


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
    shutil.copy2(tree / "lib/systemd/system/hma.service", top / "usr/lib/systemd/system")
    yield top


def analyze(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemd-analyze", *args, f"--root={root}", "hma.service"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_packaged_unit_is_the_source_unit(root: Path) -> None:
    assert (root / "usr/lib/systemd/system/hma.service").read_text() == UNIT.read_text()


def test_verify_is_clean(root: Path) -> None:
    res = analyze(root, "verify")
    assert res.returncode == 0 and res.stdout == "" and res.stderr == "", res.stderr


def test_verify_notices_a_missing_binary(root: Path) -> None:
    """The check above can fail: without the launcher, verify complains."""
    (root / "usr/bin/hma").rename(root / "hma.away")
    try:
        res = analyze(root, "verify")
    finally:
        (root / "hma.away").rename(root / "usr/bin/hma")
    assert res.returncode != 0 and "/usr/bin/hma" in res.stderr


def test_security_exposure(root: Path, record_property) -> None:  # type: ignore[no-untyped-def]
    res = analyze(root, "security", "--offline=true", "--no-pager")
    match = re.search(r"Overall exposure level for hma.service: ([0-9.]+)", res.stdout)
    assert match, res.stdout + res.stderr
    exposure = float(match.group(1))
    record_property("exposure", exposure)
    print(f"systemd-analyze security --offline=true: exposure {exposure}")
    assert exposure <= MAX_EXPOSURE


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
    doc = (ROOT / "docs" / "packaging.md").read_text()
    for key in {ln.split("=", 1)[0] for ln in text.splitlines() if re.match(r"^[A-Z]\w+=", ln)}:
        assert f"`{key}=" in doc, f"{key}= is not explained in docs/packaging.md"
