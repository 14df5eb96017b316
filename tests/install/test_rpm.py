"""The .rpm: metadata, requirements, scriptlets, and a smoke install into a folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from .chroots import ROOT, hma_version, source_files

pytestmark = pytest.mark.timeout(600)
LIB = "/usr/lib/hma"


def rpmq(rpm: Path, *args: str) -> str:
    res = subprocess.run(
        ["rpm", "-qp", *args, str(rpm)], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_rpm_name_and_arch(rpm: Path) -> None:
    assert rpmq(rpm, "--qf", "%{NAME} %{VERSION} %{ARCH}") == f"hma {hma_version()} noarch"
    assert rpm.name == f"hma-{hma_version()}-1.noarch.rpm"


def test_rpm_files(rpm: Path) -> None:
    files = set(rpmq(rpm, "-l").split())
    missing = [f for f in source_files() if f"{LIB}/{f}" not in files]
    assert not missing, f"not packaged (add them to setup.cfg packages/package_data): {missing}"
    for need in (
        "/usr/bin/hma",
        "/usr/share/doc/hma/packaging.md",  # the unit's Documentation=
        "/etc/hma/hma.toml",
        "/etc/hma/rules.d",
        "/usr/lib/systemd/system/hma.service",
        "/usr/lib/systemd/system/hma-topology.timer",
        "/usr/lib/systemd/system/hma-watch.service",
        "/var/lib/hma",
        f"{LIB}/vendor/pynvml.py",
        f"{LIB}/vendor/tomli/__init__.py",
    ):
        assert need in files
    assert [
        f for f in files if f.startswith("/usr/lib/systemd/catalog/") and f.endswith(".catalog")
    ]
    assert len([f for f in files if f.startswith("/usr/share/licenses/")]) >= 2
    # Nothing of the build host's Python: no version-specific path, no Debian layout.
    assert not [f for f in files if "dist-packages" in f or "python3." in f or ".pyc" in f]
    flags = dict(
        line.split(" ", 1)
        for line in rpmq(rpm, "--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]").splitlines()
    )
    assert flags["/etc/hma/hma.toml"] == "cn"  # %config(noreplace)


def test_rpm_requires(rpm: Path) -> None:
    requires = {line.strip() for line in rpmq(rpm, "--requires").splitlines()}
    assert {"python3 >= 3.9", "python3-psutil", "python3-pyudev", "python3-systemd"} <= requires
    assert "/usr/bin/python3" in requires
    text = " ".join(requires)
    assert "nvidia" not in text and "tomli" not in text  # shipped inside the package
    assert "python(abi)" not in text and "python3." not in text  # no build-host Python version
    assert "python3-prometheus_client" in rpmq(rpm, "--recommends")


def test_rpm_scriptlets(rpm: Path) -> None:
    scripts = rpmq(rpm, "--scripts")
    assert "systemctl --no-reload preset hma.service" in scripts  # enabled (preset file)
    assert "disable --now hma.service" in scripts  # stopped and disabled on erase
    assert "try-restart hma.service" in scripts  # restarted on upgrade
    assert "journalctl --update-catalog" in scripts
    assert "compileall" in scripts


@pytest.fixture(scope="module")
def tree(rpm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("rpmroot")
    res = subprocess.run(
        ["rpm", "-i", "--root", str(root), "--nodeps", "--noscripts", str(rpm)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    yield root


def test_rpm_installed_tree(tree: Path) -> None:
    launcher = (tree / "usr/bin/hma").read_text()
    assert launcher.startswith("#!/usr/bin/python3 -I\n") and f'"{LIB}"' in launcher
    assert (tree / "usr/bin/hma").stat().st_mode & 0o111
    assert (tree / "usr/lib/hma/hma/__init__.py").is_file()
    assert list((tree / "usr/lib/hma").glob("hma-*.dist-info/entry_points.txt"))
    unit = (tree / "usr/lib/systemd/system/hma.service").read_text()
    assert unit == (ROOT / "systemd" / "hma.service").read_text()
    assert (tree / "usr/lib/systemd/system-preset/90-hma.preset").read_text().strip() == (
        "enable hma.service"
    )
    assert oct((tree / "var/lib/hma").stat().st_mode & 0o777) == "0o750"
    assert "# [agent]" in (tree / "etc/hma/hma.toml").read_text()
    for path in (tree / "usr/lib/hma/hma").rglob("*.py"):
        assert "dist-packages" not in path.read_text(), path


def find_python(version: str) -> str:
    res = subprocess.run(
        [str(ROOT / "scripts" / "find-python"), version],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"no Python {version} on this machine")
    return res.stdout.strip()


@pytest.mark.parametrize("version", ["3.9", "3.10", "current"])
def test_rpm_tree_runs_on_python(tree: Path, version: str) -> None:
    """The installed tree on RHEL 9's Python 3.9, Ubuntu 22.04's 3.10 (bare interpreters: only
    the vendored libraries) and the current one."""
    python = sys.executable if version == "current" else find_python(version)
    lib = tree / "usr/lib/hma"
    boot = (
        f"import sys; sys.path[:0] = [{str(lib)!r}, {str(lib / 'vendor')!r}]; "
        "from hma.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    config = str(tree / "etc/hma/hma.toml")
    for args, expect in (
        (["--version"], f"hma {hma_version()}"),
        (["config", "check", "--config", config], "configuration OK"),
        (["explain", "--list"], "HMA_"),
    ):
        res = subprocess.run(
            [python, "-I", "-c", boot, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0 and expect in res.stdout, (args, res.stdout, res.stderr)
