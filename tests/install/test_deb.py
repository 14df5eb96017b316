"""The .deb: its contents, then `apt-get install ./hma_*.deb` in Debian 12 and 11 chroots."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .chroots import ROOT, SYSPATH, Chroot, hma_version, source_files
from .installed import check_docs, check_executables, check_manuals, dead_doc_links

pytestmark = pytest.mark.timeout(1500)  # a first run builds both chroot tarballs
LIB = "usr/lib/hma"


def deb_field(deb: Path, field: str) -> str:
    res = subprocess.run(
        ["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True, timeout=60, check=False
    )
    return res.stdout.strip()


def deb_files(deb: Path) -> set[str]:
    res = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, timeout=60, check=True
    )
    listing = subprocess.run(
        ["tar", "-t"], input=res.stdout, capture_output=True, timeout=60, check=True
    )
    return {n.decode().lstrip("./").rstrip("/") for n in listing.stdout.splitlines()}


def test_deb_metadata(deb: Path) -> None:
    assert deb.name == f"hma_{hma_version()}_all.deb"
    depends = deb_field(deb, "Depends")
    for dep in ("python3 (>= 3.9)", "python3-psutil", "python3-pyudev", "python3-systemd"):
        assert dep in depends
    assert "nvidia" not in depends and "tomli" not in depends  # shipped inside instead
    assert deb_field(deb, "Recommends") == "python3-prometheus-client"
    assert deb_field(deb, "Architecture") == "all"


def test_deb_carries_every_module_and_data_file(deb: Path) -> None:
    files = deb_files(deb)
    missing = [f for f in source_files() if f"{LIB}/{f}" not in files]
    assert not missing, f"not packaged (add them to setup.cfg packages/package_data): {missing}"
    assert not [f for f in files if "__pycache__" in f]  # compiled on the target
    for need in (
        "usr/bin/hma",
        "usr/share/doc/hma/packaging.md",
        "etc/hma/hma.toml",
        "etc/hma/rules.d",
        "lib/systemd/system/hma.service",
        "lib/systemd/system/hma-topology.service",
        "lib/systemd/system/hma-topology.timer",
        "lib/systemd/system/hma-watch.service",
        "var/lib/hma",
        f"{LIB}/vendor/pynvml.py",
        f"{LIB}/vendor/tomli/__init__.py",
    ):
        assert need in files
    assert [f for f in files if f.startswith(f"{LIB}/hma-") and f.endswith("entry_points.txt")]
    licenses = [f for f in files if f.startswith(f"{LIB}/vendor/") and f.endswith("/LICENSE")]
    assert len(licenses) == 2
    catalogs = sorted(p.name for p in ROOT.glob("hma/**/*.catalog"))
    assert [f for f in files if f.startswith("usr/lib/systemd/catalog/")] == [
        f"usr/lib/systemd/catalog/{name}" for name in catalogs
    ]
    assert not [f for f in files if "dist-packages" in f or "site-packages" in f]


def test_vendor_pins_match_setup_cfg() -> None:
    vendored = (ROOT / "packaging" / "vendor.txt").read_text()
    setup = (ROOT / "setup.cfg").read_text()
    pin = next(line.strip() for line in setup.splitlines() if "nvidia-ml-py==" in line)
    assert f"\n{pin} " in vendored


def install(box: Chroot, deb: Path) -> None:
    """`apt-get install ./hma_*.deb`; once more after `apt-get update` if the lists went stale."""
    shutil.copy(deb, box.path(f"/tmp/{deb.name}"))
    argv = ["apt-get", "install", "-y", "-q", f"/tmp/{deb.name}"]
    res = box.run(argv, timeout=600, check=False)
    if res.returncode != 0:
        box.run(["apt-get", "update", "-qq"], timeout=300)
        box.run(argv, timeout=600)


def hma(box: Chroot, *args: str) -> subprocess.CompletedProcess:
    return box.run(["hma", *args], timeout=120, check=False)


def shipped(box: Chroot) -> list[str]:
    """The files the installed package owns (``dpkg -L``)."""
    return box.run(["dpkg", "-L", "hma"]).stdout.splitlines()


def exercise(box: Chroot, deb: Path, python: str) -> None:
    """Install, then the agent's own commands on the distribution's Python."""
    install(box, deb)
    assert box.run(["python3", "-c", "import sys; print(sys.version)"]).stdout.startswith(python)
    files = shipped(box)
    check_executables(lambda *argv: box.run(argv, timeout=300, check=False), files, hma_version())
    check_docs(box.root)
    assert not dead_doc_links(box.root, files)
    check_manuals(box.root, files)
    res = hma(box, "config", "check")
    assert res.returncode == 0, res.stderr
    assert "/etc/hma/hma.toml" in res.stdout
    res = hma(box, "check", "system", "--json")
    doc = json.loads(res.stdout)
    assert [p["name"] for p in doc["probes"]] == ["system"]
    assert doc["probes"][0]["status"] == "ran"
    severities = {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}
    assert res.returncode == severities[doc["severity"]], res.stderr
    # Every probe, including those isolated in worker processes (they must find the tree too).
    res = hma(box, "check", "--json")
    doc = json.loads(res.stdout)
    failed = {p["name"]: p for p in doc["probes"] if p["status"] == "failed"}
    assert not failed, failed
    daemon(box)
    # The vendored libraries are the ones imported, from the private tree.
    probe = (
        "import sys; sys.path[:0] = ['/usr/lib/hma', '/usr/lib/hma/vendor']; "
        "import pynvml, tomli; print(pynvml.__file__, tomli.__file__)"
    )
    out = box.run(["python3", "-I", "-c", probe]).stdout
    assert out.split() == ["/usr/lib/hma/vendor/pynvml.py", "/usr/lib/hma/vendor/tomli/__init__.py"]
    tag = "cpython-" + python.replace(".", "")
    assert list(box.path(f"/{LIB}/hma").glob(f"__pycache__/cli.{tag}.pyc"))  # py3compile ran
    conffiles = box.run(["dpkg-query", "-W", "-f=${Conffiles}", "hma"]).stdout
    assert "/etc/hma/hma.toml" in conffiles
    assert box.path("/etc/systemd/system/multi-user.target.wants/hma.service").is_symlink()
    assert not box.path("/etc/systemd/system/timers.target.wants/hma-topology.timer").exists()
    assert list(box.path("/usr/lib/systemd/catalog").glob("*.catalog"))


def daemon(box: Chroot) -> None:
    """`hma run` from the package: READY=1 over sd_notify, then status.json for `hma status`."""
    box.path("/run/hma").mkdir(parents=True, exist_ok=True)  # RuntimeDirectory= on a real node
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(box.path("/run/hma-test-notify")))
    sock.settimeout(60)
    env = {"PATH": SYSPATH, "LC_ALL": "C.UTF-8", "NOTIFY_SOCKET": "/run/hma-test-notify"}
    proc = subprocess.Popen(
        ["chroot", str(box.root), "hma", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        messages = [sock.recv(4096).decode()]
        while "READY=1" not in messages[-1]:
            messages.append(sock.recv(4096).decode())
        status: dict = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until every probe has run once
            res = hma(box, "status", "--json")
            status = json.loads(res.stdout) if res.stdout.startswith("{") else {}
            if status.get("probes") and all(p.get("last_run") for p in status["probes"]):
                break
            time.sleep(0.5)
        assert status.get("pid", 0) > 0 and status["version"] == hma_version(), status
        failed = [p for p in status["probes"] if p.get("status") == "failed"]
        assert not failed, failed
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        sock.close()
        box.path("/run/hma-test-notify").unlink()
    assert proc.stderr is not None
    with proc.stderr:  # closed here: a leaked pipe is a ResourceWarning, an error in the tests
        err = proc.stderr.read()
    assert proc.returncode == 0, err


def purge(box: Chroot) -> None:
    box.path("/var/lib/hma/state.db").write_text("")  # state written by a run of the agent
    box.run(["apt-get", "purge", "-y", "-q", "hma"], timeout=300)
    assert not box.path("/var/lib/hma").exists()
    assert not box.path("/etc/hma/hma.toml").exists()
    assert not box.path("/usr/bin/hma").exists() and not box.path(f"/{LIB}").exists()
    assert not box.path("/etc/systemd/system/multi-user.target.wants/hma.service").exists()


def sandboxed(box: Chroot, *args: str) -> subprocess.CompletedProcess:
    """Run hma the way hma.service confines it, as far as a machine without systemd allows.

    In a private mount namespace: the root read-only (ProtectSystem=strict) with /proc, a
    read-only /sys, a read-only /run but for /run/hma and /run/lock, a writable /var/lib/hma; the
    capability bounding set reduced to CAP_SYSLOG (CapabilityBoundingSet=) and no new privileges
    (NoNewPrivileges=).
    """
    r = str(box.root)
    script = f"""set -e
mount --make-rprivate /
mount --bind {r} {r}
mount -o remount,bind,ro {r}
mount -t proc proc {r}/proc
mount -t sysfs -o ro sysfs {r}/sys
mount -t tmpfs tmpfs {r}/run
mkdir {r}/run/hma {r}/run/lock
mount -t tmpfs tmpfs {r}/run/hma
mount -t tmpfs tmpfs {r}/run/lock
mount -o remount,bind,ro {r}/run
mount -t tmpfs tmpfs {r}/var/lib/hma
exec chroot {r} setpriv --bounding-set=-all,+syslog --inh-caps=-all --no-new-privs hma "$@"
"""
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sandbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": SYSPATH, "LC_ALL": "C.UTF-8"},
        check=False,
    )


def confined(box: Chroot) -> None:
    """Under the unit's confinement: the config loads, every probe runs, and the read-only root
    of the sandbox is not reported as a failed filesystem."""
    res = sandboxed(box, "config", "check")
    assert res.returncode == 0, res.stderr
    res = sandboxed(box, "check", "--json")
    doc = json.loads(res.stdout)
    assert not [p for p in doc["probes"] if p["status"] == "failed"], doc
    codes = [f["code"] for p in doc["probes"] for f in p["findings"]]
    assert "SYS_FS_READONLY" not in codes, doc
    with open("/proc/self/mounts") as mounts:  # the sandbox's mounts died with its namespace
        assert not [m for m in mounts if m.split()[1] == str(box.path("/run"))]


def test_bookworm_install_run_purge(deb: Path, bookworm: Chroot) -> None:
    exercise(bookworm, deb, "3.11")
    confined(bookworm)
    lifecycle(bookworm)
    purge(bookworm)


def test_bullseye_python39_install_run_purge(deb: Path, bullseye: Chroot) -> None:
    exercise(bullseye, deb, "3.9")
    keeps_local_config_and_state(bullseye, deb)
    purge(bullseye)


def keeps_local_config_and_state(box: Chroot, deb: Path) -> None:
    """Reinstall keeps an edited conffile without asking; remove (not purge) keeps config and
    state, only purge drops them."""
    conf = box.path("/etc/hma/hma.toml")
    conf.write_text(conf.read_text() + '\n[agent]\nnode_name = "local-edit"\n')
    box.run(["apt-get", "install", "--reinstall", "-y", "-q", f"/tmp/{deb.name}"], timeout=300)
    assert 'node_name = "local-edit"' in conf.read_text()
    box.run(["apt-get", "remove", "-y", "-q", "hma"], timeout=300)
    assert not box.path("/usr/bin/hma").exists()
    assert conf.exists() and box.path("/var/lib/hma").is_dir()
    install(box, deb)
    assert hma(box, "config", "check").returncode == 0


def lifecycle(box: Chroot) -> None:
    """packaging/lifecycle/install_hma.sh on a node where the package is (re)installed."""
    script = box.path("/tmp/install_hma.sh")
    shutil.copy(ROOT / "packaging" / "lifecycle" / "install_hma.sh", script)
    deb = next(box.path("/tmp").glob("hma_*.deb"))
    knows_recovery = "# [recovery]" in hma(box, "config", "defaults").stdout
    res = box.run(["bash", "/tmp/install_hma.sh", "--help"], check=False)
    assert res.returncode == 0 and "Usage: install_hma.sh" in res.stdout, res.stderr
    env = {
        "HMA_APT_UPDATE": "0",
        "HMA_RECOVERY_POLICY": "none",
        "HMA_INSTANCE_TYPE": "p5.48xlarge",
        "HMA_EXTRA_TOML": "[probes.system]\nexpected_cpus = 2",
    }
    bad = {**env, "HMA_EXPECTED_GPUS": "eight"}  # refused before anything is installed
    res = box.run(["bash", "/tmp/install_hma.sh", f"/tmp/{deb.name}"], env=bad, check=False)
    assert res.returncode == 1 and "HMA_EXPECTED_GPUS must be a whole number" in res.stderr
    assert "installed hma" not in res.stderr
    res = box.run(["bash", "/tmp/install_hma.sh", f"/tmp/{deb.name}"], env=env, check=False)
    dropin = box.path("/etc/hma/hma.d/50-lifecycle.toml")
    if not knows_recovery:  # until the remediation module lands: refused and rolled back
        assert res.returncode == 1 and "recovery" in res.stderr, res.stderr
        assert not dropin.exists()
        return
    assert res.returncode == 0, res.stderr
    text = dropin.read_text()
    assert 'policy = "none"' in text and 'instance_type = "p5.48xlarge"' in text
    assert "systemd is not running here" in res.stderr
    # An invalid setting is refused and the previous drop-in restored.
    env["HMA_EXTRA_TOML"] = "[probes.system]\nno_such_key = 1"
    res = box.run(["bash", "/tmp/install_hma.sh", f"/tmp/{deb.name}"], env=env, check=False)
    assert res.returncode == 1 and "probes.system.no_such_key" in res.stderr
    assert dropin.read_text() == text
