"""The SPANK plugin's packages (hma-slurm-plugin .deb and .rpm, built with hma's by
packaging/build): metadata, the .so where Slurm looks for plugins, and that the packaged .so is
the working plugin (unpacked and driven by the srun stand-in of tests/unit/test_spank_plugin.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import spankplugin

from .chroots import ROOT, hma_version

pytestmark = pytest.mark.timeout(600)


def series() -> str:
    """The Slurm release of the headers the packages were built with (22.05 here)."""
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(spankplugin.SOURCE), "series"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip


def triplet() -> str:
    """Debian's multiarch triplet of this machine (x86_64-linux-gnu)."""
    return subprocess.run(
        ["dpkg-architecture", "-qDEB_HOST_MULTIARCH"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip


@pytest.fixture(scope="module")
def plugin_deb(deb: Path) -> Path:
    """dist/hma-slurm-plugin_<version>_<arch>.deb, built with the .deb."""
    found = sorted((ROOT / "dist").glob(f"hma-slurm-plugin_{hma_version()}_*.deb"))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def plugin_rpm(rpm: Path) -> Path:
    """dist/hma-slurm-plugin-<version>-1.<arch>.rpm, built with the .rpm."""
    found = sorted((ROOT / "dist").glob(f"hma-slurm-plugin-{hma_version()}-1.*.rpm"))
    assert len(found) == 1, found
    return found[0]


def out(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


def works(so: Path, tmp: Path) -> None:
    """The unpacked plugin rewrites an srun command line into the hma srun one."""
    hma = tmp / "hma"
    hma.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    hma.chmod(0o755)
    harness = spankplugin.build_harness(tmp)
    env = {"PATH": "/usr/bin:/bin", "HARNESS_PLUGIN": str(so), "HARNESS_PLUGARGS": f"hma={hma}"}
    proc = subprocess.run([str(harness), "--auto-resume=2", "-N2", "train.sh"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["srun", "--auto-resume=2", "--", "-N2", "train.sh"]


def test_deb_plugin_package(plugin_deb: Path, tmp_path: Path) -> None:
    v, s = hma_version(), series()
    assert out("dpkg-deb", "-f", str(plugin_deb), "Architecture").strip() != "all"
    depends = out("dpkg-deb", "-f", str(plugin_deb), "Depends")
    assert f"hma (= {v})" in depends
    assert f"slurm-client (>= {s}), slurm-client (<< {s}.99)" in depends
    so = f"usr/lib/{triplet()}/slurm-wlm/hma_auto_resume.so"  # Debian's Slurm PluginDir
    assert f"./{so}" in out("dpkg-deb", "-c", str(plugin_deb))
    subprocess.run(["dpkg-deb", "-x", str(plugin_deb), str(tmp_path / "root")], check=True,
                   timeout=60)  # fmt: skip
    works(tmp_path / "root" / so, tmp_path)


def test_rpm_plugin_package(plugin_rpm: Path, tmp_path: Path) -> None:
    v, s = hma_version(), series()
    assert (
        out("rpm", "-qp", "--qf", "%{NAME} %{ARCH}", str(plugin_rpm)) == "hma-slurm-plugin x86_64"
    )
    requires = out("rpm", "-qp", "--requires", str(plugin_rpm)).splitlines()
    for need in (f"hma = {v}-1", f"slurm >= {s}", f"slurm < {s}.99"):
        assert need in requires
    so = "/usr/lib64/slurm/hma_auto_resume.so"  # RHEL's Slurm PluginDir (%{_libdir}/slurm)
    assert so in out("rpm", "-qlp", str(plugin_rpm)).split()
    root = tmp_path / "root"  # installed as test_rpm.py does: no scriptlets, no dependencies
    out("rpm", "-i", "--root", str(root), "--nodeps", "--noscripts", str(plugin_rpm))
    works(root / so.lstrip("/"), tmp_path)
