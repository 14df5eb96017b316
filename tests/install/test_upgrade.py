"""Upgrades in a Debian 12 chroot, from this version's .deb and .rpm to the next one's (the same
source with the version bumped and every unit file changed: conftest ``next_source``).

A chroot runs no systemd: tests/install/systemctl stands in for systemctl (recording each call,
loading unit files as systemd does: on first use and at daemon-reload) and /run/systemd/system
exists, so the maintainer scripts act as on a booted node. What an admin expects: an upgrade
keeps what runs running (the agent, and the controller's topology timer where it was enabled) on
the new unit files and the new code; the first install starts nothing; removal stops it all."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from .chroots import ROOT, Chroot, hma_version, run
from .conftest import UNIT_CHANGE, UPGRADE_SUFFIX, chroot_fixture
from .installed import check_docs, check_executables, check_manuals, dead_doc_links

pytestmark = pytest.mark.timeout(1500)
UNITS = ("hma.service", "hma-topology.timer", "hma-topology.service")
SHIM = "/var/lib/systemctl-shim"


@pytest.fixture()
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    """A fresh bookworm chroot with the systemctl stand-in and a "running" systemd."""
    for box in chroot_fixture("bookworm", tmp_path_factory):
        shutil.copy(ROOT / "tests" / "install" / "systemctl", box.path("/usr/bin/systemctl"))
        box.path("/usr/bin/systemctl").chmod(0o755)
        box.path("/run/systemd/system").mkdir(parents=True)
        yield box


def calls(box: Chroot) -> list[str]:
    """The systemctl calls so far, one string each."""
    log = box.path("/var/log/systemctl.log")
    return log.read_text().splitlines() if log.exists() else []


def running(box: Chroot) -> dict[str, str]:
    """``{unit: the unit file text it runs with}`` for the hma units that run."""
    active = box.path(f"{SHIM}/active")
    return {u: (active / u).read_text() for u in UNITS if (active / u).exists()}


def admin_starts_units(box: Chroot) -> None:
    """What the lifecycle script and a controller's admin do after the first install."""
    box.run(["systemctl", "restart", "hma.service"])
    box.run(["systemctl", "enable", "--now", "hma-topology.timer"])
    assert set(running(box)) == {"hma.service", "hma-topology.timer"}


def expect_upgraded(box: Chroot, before: list[str]) -> None:
    """Nothing was stopped; the units that ran run on the new unit files."""
    during = calls(box)[len(before) :]
    assert not [c for c in during if {"stop", "disable"} & set(c.split())], during
    now = running(box)
    assert set(now) == {"hma.service", "hma-topology.timer"}, during
    for unit, text in now.items():
        assert text.endswith(UNIT_CHANGE), f"{unit} still runs its old unit file: {during}"


def test_deb_upgrade(deb: Path, next_deb: Path, node: Chroot) -> None:
    for pkg in (deb, next_deb):
        shutil.copy(pkg, node.path(f"/tmp/{pkg.name}"))
    node.run(["apt-get", "install", "-y", "-q", f"/tmp/{deb.name}"], timeout=600)
    assert not running(node), calls(node)  # enabled, not started: the site config comes first
    assert node.path("/etc/systemd/system/multi-user.target.wants/hma.service").is_symlink()
    admin_starts_units(node)
    before = calls(node)
    node.run(["apt-get", "install", "-y", "-q", f"/tmp/{next_deb.name}"], timeout=600)
    expect_upgraded(node, before)
    res = node.run(["hma", "--version"])
    assert res.stdout.strip() == f"hma {hma_version()}{UPGRADE_SUFFIX}"
    node.run(["apt-get", "remove", "-y", "-q", "hma"], timeout=300)
    assert not running(node), calls(node)


def test_rpm_install_run_upgrade_erase(rpm: Path, next_rpm: Path, node: Chroot) -> None:
    """rpm with its scriptlets into a root that has python3 and the dependencies (from Debian's
    archive: rpm cannot resolve them here, hence --nodeps), then every executable runs there."""
    node.run(
        ["apt-get", "install", "-y", "-q", "python3", "python3-psutil", "python3-pyudev",
         "python3-systemd"],
        timeout=600,
    )  # fmt: skip

    def rpm_cmd(*args: str) -> None:
        run(["rpm", "--root", str(node.root), "--nodeps", *args], timeout=300, env={})

    rpm_cmd("-i", str(rpm))
    assert not running(node), calls(node)
    assert "preset hma.service" in " ".join(calls(node))  # enabled by the vendor preset
    assert node.path("/etc/systemd/system/multi-user.target.wants/hma.service").is_symlink()
    assert list(node.path("/usr/lib/hma/hma").glob("__pycache__/cli.cpython-311.pyc"))
    files = subprocess.run(
        ["rpm", "-qlp", str(rpm)], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    check_executables(lambda *argv: node.run(argv, timeout=300, check=False), files, hma_version())
    check_docs(node.root)
    assert not dead_doc_links(node.root, files)
    check_manuals(node.root, files)
    admin_starts_units(node)
    before = calls(node)
    rpm_cmd("-U", str(next_rpm))
    expect_upgraded(node, before)
    res = node.run(["hma", "--version"])
    assert res.stdout.strip() == f"hma {hma_version()}{UPGRADE_SUFFIX}"
    rpm_cmd("-e", "hma")
    assert not running(node), calls(node)
    assert not node.path("/usr/bin/hma").exists() and not node.path("/usr/lib/hma").exists()
