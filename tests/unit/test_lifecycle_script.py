"""packaging/lifecycle/install_hma.sh's --genconf and --prometheus-textfile, run for real up to
the package manager: a stand-in apt-get on PATH (the install tests, tests/install, run the real
one in a chroot), the real `hma` over a generated p5-like sysfs tree, `HMA_CONFIG` in a scratch
folder, and /etc/systemd/system and /var/lib tmpfs of a private mount namespace (the host's are
untouched).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hma.adapters import tomlcompat

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging/lifecycle/install_hma.sh"
sys.path.insert(0, str(ROOT / "tests/fixtures"))

import gen_sysfs  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="install_hma.sh wants root; the namespace needs unshare",
)
UNIT_DROPIN = "/etc/systemd/system/hma.service.d/50-textfile.conf"
# the script's `hma config check` refuses the textfile reporter without prometheus-client (the
# compatibility venvs have none)
needs_prometheus = pytest.mark.skipif(
    importlib.util.find_spec("prometheus_client") is None,
    reason="the prometheus reporter needs prometheus-client",
)


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    sysfs = gen_sysfs.build(tmp_path / "sys", "p5.48xlarge")
    (sysfs / "devices/system/cpu").mkdir(parents=True)
    for name in ("online", "present"):
        (sysfs / "devices/system/cpu" / name).write_text("0-3\n")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 8388608 kB\nMemAvailable: 4194304 kB\n")
    (proc / "self/mountinfo").write_text("20 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "hma.toml"
    config.write_text(
        tomlcompat.dumps(
            {
                "paths": {"sysfs": str(sysfs), "procfs": str(proc)},
                "slurm": {"enabled": False},
                "probes": {
                    name: {"enabled": False} for name in ("gpu", "nvidia_smi", "efa_mesh", "slurm")
                }
                | {"system": {"processes": [], "min_free_percent": 0.0}},
                "reporters": {"journald": {"enabled": False}},
            }
        )
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "hma").write_text(f'#!/bin/sh\nexec {sys.executable} -m hma "$@"\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    package = tmp_path / "hma_0.1.0_all.deb"
    package.write_bytes(b"")
    return {"config": config, "bin": bin_dir, "log": log, "package": package, "tmp": tmp_path}


def install(node: dict[str, Path], *options: str) -> subprocess.CompletedProcess:
    """The script in a mount namespace whose /etc/systemd/system and /var/lib are tmpfs; the
    unit drop-in it wrote is printed after a line ``--- unit``."""
    inner = "mount -t tmpfs tmpfs /etc/systemd/system && mount -t tmpfs tmpfs /var/lib && "
    inner += '{ bash "$@"; rc=$?; echo "--- unit"; '
    inner += f"cat {UNIT_DROPIN} 2>/dev/null; exit $rc; }}"
    env = {
        **os.environ,
        "PATH": f"{node['bin']}:{os.environ['PATH']}",
        "HMA_CONFIG": str(node["config"]),
        "HMA_APT_UPDATE": "0",
        "HMA_START": "0",
        "PYTHONPATH": str(ROOT),
    }
    argv = ["unshare", "--mount", "bash", "-c", inner, "_", str(SCRIPT), *options]
    return subprocess.run(
        [*argv, str(node["package"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@needs_prometheus
def test_genconf_and_the_prometheus_textfile_switches(node: dict[str, Path]) -> None:
    prom = node["tmp"] / "textfile dir"
    res = install(node, "--genconf", "--prometheus-textfile", str(prom))
    assert res.returncode == 0, res.stderr
    assert node["log"].read_text().split()[-1] == str(node["package"])
    dropins = node["config"].parent / "hma.d"
    settings = tomlcompat.loads((dropins / "50-lifecycle.toml").read_text())
    assert settings["reporters"]["prometheus"] == {
        "enabled": True,
        "textfile": f"{prom}/hma.prom",
    }
    assert prom.is_dir()
    unit = res.stdout.split("--- unit\n", 1)[1]
    assert f"ReadWritePaths={prom}\n" in unit
    recorded = dropins / "50-genconf.toml"
    probes = tomlcompat.loads(recorded.read_text())["probes"]
    assert probes["efa"] == {"expected_adapters": 32}
    assert probes["infiniband"]["expected_ports"] == ["mlx5_0/1"]
    assert probes["system"]["expected_cpus"] == 4

    first = recorded.read_text()
    res = install(node, "--genconf")  # a re-run keeps what was recorded
    assert res.returncode == 0, res.stderr
    assert f"kept {recorded}" in res.stderr and recorded.read_text() == first
    assert "[reporters.prometheus]" not in (dropins / "50-lifecycle.toml").read_text()


@needs_prometheus
def test_the_default_textfile_folder_adds_no_unit_dropin(node: dict[str, Path]) -> None:
    res = install(node, "--prometheus-textfile", "--genconf")  # no DIR: Debian's folder
    lifecycle = node["config"].parent / "hma.d/50-lifecycle.toml"
    settings = tomlcompat.loads(lifecycle.read_text())
    assert res.returncode == 0, res.stderr
    assert settings["reporters"]["prometheus"]["textfile"] == (
        "/var/lib/prometheus/node-exporter/hma.prom"
    )
    assert res.stdout.split("--- unit\n", 1)[1] == ""


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--prometheus-textfile", "relative/dir"), "needs an absolute folder"),
        (("--genconf", "--bogus"), "unknown option --bogus"),
    ],
)
def test_bad_switches_are_refused_before_anything_is_installed(
    node: dict[str, Path], options: tuple[str, ...], says: str
) -> None:
    res = install(node, *options)
    assert res.returncode == 1 and says in res.stderr
    assert not node["log"].exists()
