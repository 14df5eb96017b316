"""Slurm 24.11 for tests/slurmcluster.py: Debian 13's slurm-wlm, run from a cached trixie root.

The root is built once by tests/install/chroots.py (``ensure_tree``: debootstrap trixie, then
``apt-get install`` of PACKAGES; cached under /var/cache/hma-test, rebuilt when PACKAGES change).
Each cluster sees it through its own overlay (``hma-slurmroot-<base>/root`` next to the base
folder; writes go to its ``upper``, the cache stays pristine), with /proc, a read-only /sys,
/dev, the host's /tmp (so the cluster's base folder and the tests' work folders have the same
path inside and out) and the source tree (read-only, for jobs that run hma) mounted in. The
host's users and groups are copied in, so uids agree on both sides. Daemons and clients run
with ``chroot <root> /usr/...``; the ``bin/`` folder of the base holds one wrapper script per
client for callers that take a path (the agent's ``[slurm]`` options).
"""

from __future__ import annotations

import os
import shutil
import signal
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


ROOTS = "hma-slurmroot-"  # not "hma-slurm-*": older sweeps would rmtree through the mounts


class SlurmRoot:
    """One cluster's overlay of the cached root, with its mounts; see the module doc.

    The mounts live in their own folder next to the cluster's base (``hma-slurmroot-<base>``,
    with ``owner.pid``), never inside it: a folder that holds a bind mount of /tmp must only
    ever be removed by code that unmounts first (``remove``, ``sweep``)."""

    def __init__(self, base: Path) -> None:
        self.bin = base / "bin"
        self.top = base.parent / f"{ROOTS}{base.name}"
        self.root = self.top / "root"

    def argv(self, tool: str) -> list[str]:
        """The command line prefix that runs ``tool`` (a client or daemon) inside the root."""
        inside = DAEMONS.get(tool, f"/usr/bin/{tool}")
        chroot = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "chroot"
        return [chroot, str(self.root), inside]

    def mount(self) -> None:
        """Mount the overlay and everything inside it, copy users in, write the wrappers."""
        lower = image()
        for sub in ("root", "upper", "work"):
            (self.top / sub).mkdir(parents=True, exist_ok=True)
        (self.top / "owner.pid").write_text(str(os.getpid()))
        _mount(
            "-t", "overlay", "overlay", "-o",
            f"lowerdir={lower},upperdir={self.top / 'upper'},workdir={self.top / 'work'}",
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
        self.bin.mkdir(exist_ok=True)
        for tool in CLIENTS:
            wrapper = self.bin / tool
            wrapper.write_text('#!/bin/sh\nexec {} "$@"\n'.format(" ".join(self.argv(tool))))
            wrapper.chmod(0o755)

    def remove(self) -> None:
        """Kill what still runs in the root (jobs), unmount everything, delete the folder."""
        _remove_top(self.top)


def sweep(tmp: str) -> list[str]:
    """Remove the roots of dead runs (owner.pid no longer running); returns the folders."""
    removed = []
    for top in sorted(Path(tmp).glob(ROOTS + "*")):
        try:
            owner = int((top / "owner.pid").read_text())
        except (OSError, ValueError):
            owner = 0
        if owner and Path(f"/proc/{owner}").exists():
            continue
        _remove_top(top)
        removed.append(str(top))
    return removed


def _remove_top(top: Path) -> None:
    root = str(top / "root")
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                inside = os.readlink(f"/proc/{entry}/root")
            except OSError:
                continue
            if inside == root or inside.startswith(root + "/"):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    umount_under(top)  # raises if a mount stays: then nothing is deleted
    shutil.rmtree(top, ignore_errors=True)


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
