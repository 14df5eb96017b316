"""Slurm 24.11 for tests/slurmcluster.py: Debian 13's slurm-wlm, run from a cached trixie root.

The root is built once by tests/install/chroots.py (``ensure_tree``: debootstrap trixie, then
``apt-get install`` of PACKAGES; cached under /var/cache/hma-test, rebuilt when PACKAGES change).
Each cluster sees it through its own overlay (``<base>/root``, writes go to ``<base>/upper``, the
cache stays pristine), with /proc, a read-only /sys, /dev, the host's /tmp (so the cluster's base
folder and the tests' work folders have the same path inside and out) and the source tree
(read-only, for jobs that run hma) mounted in. The host's users and groups are copied in, so
uids agree on both sides. Daemons and clients run with ``chroot <base>/root /usr/...``; the
``bin/`` folder of the base holds one wrapper script per client for callers that take a path
(the agent's ``[slurm]`` options, a job's PATH).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Optional

from tests.install import chroots
from tests.install.chroots import Chroot, ensure_tree, mirror, tree_cached

VERSIONS = ("22.05", "24.11")
SUITE = "trixie"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "python3", "python3-psutil")
CLIENTS = ("scontrol", "sinfo", "squeue", "sbatch", "scancel", "srun", "sdiag", "sacct")
DAEMONS = {name: f"/usr/sbin/{name}" for name in ("slurmctld", "slurmd", "munged")}
SOURCE = Path(__file__).resolve().parents[1]
# This process's outcome of ensure_tree: seconds the build took (None: it was cached), or why
# it failed (then later clusters fail at once with that message instead of building again).
BUILD_SECONDS: dict[str, Optional[float]] = {}
BUILD_ERROR: dict[str, str] = {}


def why_not() -> Optional[str]:
    """None when the 24.11 root is cached or can be built; else why not (only an unreachable
    Debian mirror, a reason to skip: missing tools are the caller's error to report)."""
    if os.geteuid() != 0:
        return "needs root"
    if tree_cached(SUITE, PACKAGES):
        return None
    try:
        url = f"{mirror().rstrip('/')}/dists/{SUITE}/Release"
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=15):
            return None
    except OSError as exc:
        return f"Slurm 24.11 needs a {SUITE} root and the Debian mirror is unreachable: {exc}"


def image() -> Path:
    """The cached trixie root with Slurm 24.11, built first if needed (about 45 s); raises
    RuntimeError saying why when it cannot be built."""
    if SUITE in BUILD_ERROR:
        raise RuntimeError(BUILD_ERROR[SUITE])
    try:
        root, seconds = ensure_tree(SUITE, PACKAGES)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        BUILD_ERROR[SUITE] = f"building the {SUITE} root for Slurm 24.11 failed: {exc}"
        raise RuntimeError(BUILD_ERROR[SUITE]) from exc
    BUILD_SECONDS.setdefault(SUITE, seconds)
    return root


def describe() -> Optional[str]:
    """One line on this process's root: built (and how long it took), cached, or failed."""
    if SUITE in BUILD_ERROR:
        return BUILD_ERROR[SUITE].splitlines()[0]
    if SUITE not in BUILD_SECONDS:
        return None
    seconds = BUILD_SECONDS[SUITE]
    where = chroots.CACHE / f"{SUITE}-tree"
    return f"{where}: built in {seconds:.1f} s" if seconds is not None else f"{where}: cached"


class SlurmRoot:
    """One cluster's overlay of the cached root, with its mounts; see the module doc."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "root"
        self.bin = base / "bin"

    def argv(self, tool: str) -> list[str]:
        """The command line prefix that runs ``tool`` (a client or daemon) inside the root."""
        inside = DAEMONS.get(tool, f"/usr/bin/{tool}")
        chroot = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "chroot"
        return [chroot, str(self.root), inside]

    def mount(self) -> None:
        """Mount the overlay and everything inside it, copy users in, write the wrappers."""
        lower = image()
        for sub in ("root", "upper", "work", "bin"):
            (self.base / sub).mkdir(exist_ok=True)
        _mount(
            "-t", "overlay", "overlay", "-o",
            f"lowerdir={lower},upperdir={self.base / 'upper'},workdir={self.base / 'work'}",
            str(self.root),
        )  # fmt: skip
        _mount("--make-private", str(self.root))  # submounts stay out of other namespaces
        Chroot(self.root, SUITE).mount_proc()
        for source in ("/dev", "/tmp", str(SOURCE)):
            target = self.root / source.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            _mount("--bind", source, str(target))
        _mount("-o", "remount,bind,ro", str(self.root / str(SOURCE).lstrip("/")))
        for name in ("passwd", "group"):
            shutil.copyfile(f"/etc/{name}", self.root / "etc" / name)
        for tool in CLIENTS:
            wrapper = self.bin / tool
            wrapper.write_text('#!/bin/sh\nexec {} "$@"\n'.format(" ".join(self.argv(tool))))
            wrapper.chmod(0o755)

    def umount(self) -> None:
        """Unmount everything under the base folder (also what a killed run left)."""
        umount_under(self.base)


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or below ``folder``, deepest first."""
    top = str(folder)
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh]
    return [p for p in reversed(points) if p == top or p.startswith(top + "/")]


def umount_under(folder: Path) -> None:
    """Lazily unmount every mount at or below ``folder``; raises if one stays (so that a later
    ``rmtree`` can never walk into /tmp or the source tree through a bind mount)."""
    for point in mounts_under(folder):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)
    left = mounts_under(folder)
    if left:
        raise RuntimeError(f"still mounted under {folder}: {left}")


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"mount {' '.join(args)}: {proc.stderr.strip()}")
