"""Debian chroots for the install tests and the Slurm 24.11 cluster, cached outside the tree.

For the install tests, a tarball holds a `debootstrap --variant=minbase` system with its package
lists fetched and the archives of hma's dependencies downloaded (not installed):
`apt-get install ./hma_*.deb` then resolves every dependency against the distribution's own
archive metadata, offline and fast. Tarballs are built atomically (temporary folder, tar,
rename) and rebuilt after a week.

For tests/slurmchroot.py, a folder (``ensure_tree``) holds a system with packages installed
(trixie's Slurm 24.11), used in place as the lower layer of overlays: rebuilt only when its
package list changes. Every cache entry is built under an flock, so that concurrent test runs
build it once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

CACHE = Path(os.environ.get("HMA_TEST_CACHE", "/var/cache/hma-test"))
MAX_AGE_S = 7 * 24 * 3600
SYSPATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# What `apt-get install ./hma_*.deb` pulls in (Depends and Recommends), prefetched in the cache.
PREFETCH = ["python3", "python3-psutil", "python3-pyudev", "python3-systemd"]
RECOMMENDS = ["python3-prometheus-client"]
CACHE_FORMAT = "2"  # bump to invalidate cached tarballs when what they hold changes


def mirror() -> str:
    """The Debian mirror of this machine: the URIs: line of debian.sources."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    for line in sources.read_text().splitlines():
        if line.startswith("URIs:"):
            return line.split()[1]
    raise RuntimeError(f"no URIs: line in {sources}")


def run(argv: Sequence[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    """Run a command with a system-only PATH; raise with its output when it fails."""
    env = {"PATH": SYSPATH, "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    env.update(kwargs.pop("env", {}))
    res = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, env=env, **kwargs, check=False
    )
    if res.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        )
    return res


def tarball_path(suite: str) -> Path:
    """Where the cached tarball of ``suite`` lives."""
    return CACHE / f"{suite}-minbase-v{CACHE_FORMAT}.tar"


def ensure_tarball(suite: str) -> Path:
    """The cached tarball of ``suite``, built first when missing or older than a week."""
    path = tarball_path(suite)
    with _build_lock(path.name):
        if path.exists() and time.time() - path.stat().st_mtime < MAX_AGE_S:
            return path
        work = CACHE / f".build-{suite}-{os.getpid()}"
        box = Chroot(work / "root", suite)
        try:
            _bootstrap(box, ["--download-only", *PREFETCH, *RECOMMENDS])
            partial = work / "root.tar"
            run(["tar", "-C", str(box.root), "-cf", str(partial), "."], timeout=600)
            os.replace(partial, path)  # atomic: readers see the old tarball or the new one
        finally:
            box.remove()
            shutil.rmtree(work, ignore_errors=True)
    return path


def ensure_tree(suite: str, packages: Sequence[str]) -> tuple[Path, Optional[float]]:
    """A cached root folder of ``suite`` with ``packages`` installed, and the seconds its build
    took (None when it was cached already).

    Kept as a folder (``<suite>-tree/root``), not a tarball: it is used in place, as the
    read-only lower layer of overlays (tests/slurmchroot.py). Its ``stamp`` holds the package
    list; it is rebuilt only when that list (or CACHE_FORMAT) changes, not by age.
    """
    final = CACHE / f"{suite}-tree"
    with _build_lock(final.name):
        if tree_cached(suite, packages):
            return final / "root", None
        start = time.monotonic()
        work = CACHE / f".build-{suite}-{os.getpid()}"
        box = Chroot(work / "root", suite)
        try:
            _bootstrap(box, ["--no-install-recommends", *packages])
            box.run(["apt-get", "clean"], timeout=60)
            (work / "stamp").write_text(_stamp(suite, packages))
            if final.exists():  # an older package list: replaced whole
                old = CACHE / f".build-old-{os.getpid()}"
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(work, final)
        finally:
            box.remove()
            shutil.rmtree(work, ignore_errors=True)
        return final / "root", time.monotonic() - start


def tree_cached(suite: str, packages: Sequence[str]) -> bool:
    """Whether ``ensure_tree(suite, packages)`` would find its folder built and current."""
    final = CACHE / f"{suite}-tree"
    return _read(final / "stamp") == _stamp(suite, packages) and (final / "root").is_dir()


def _stamp(suite: str, packages: Sequence[str]) -> str:
    return f"{CACHE_FORMAT} {suite} {' '.join(sorted(packages))}\n"


def _bootstrap(box: Chroot, install: Sequence[str]) -> None:
    """debootstrap a minbase system into ``box`` and ``apt-get install -y`` ``install`` in it."""
    box.root.mkdir(parents=True)
    run(["debootstrap", "--variant=minbase", box.suite, str(box.root), mirror()], timeout=900)
    box.mount_proc()
    box.run(["apt-get", "update", "-qq"], timeout=300)
    box.run(["apt-get", "install", "-y", "-q", *install], timeout=900)
    box.umount_proc()
    for cache in box.root.glob("var/cache/apt/*.bin"):
        cache.unlink()  # apt rebuilds them; they only double the cache


@contextlib.contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """Hold an exclusive flock on ``CACHE/<name>.lock``: a second builder of the same cache
    entry (another checkout's `make test`) waits, then finds it built."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _sweep()
        yield


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


STALE = re.compile(
    r"(/pytest-of-[^/]+/pytest-\d+/chroot-[a-z]+\d*|/\.build-[a-z]+-\d+/root)/(proc|sys)$"
)


def sweep_mounts(keep: Path) -> None:
    """Unmount /proc and /sys left in chroots of killed earlier runs (not those under keep)."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    mine = str(keep.resolve())
    for point in reversed(points):
        if STALE.search(point) and not point.startswith(mine + "/") and not _owner_alive(point):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)


def _owner_alive(point: str) -> bool:
    """Whether the run that made this mount still runs: the pid in pytest's numbered-folder
    `.lock` (another checkout's `make test` may be using its chroot right now), or in the
    `.build-<suite>-<pid>` folder name."""
    match = re.search(r"/\.build-[a-z]+-(\d+)/", point)
    if match:
        return Path(f"/proc/{match.group(1)}").exists()
    match = re.search(r"^(.*/pytest-of-[^/]+/pytest-\d+)/", point)
    try:
        pid = (Path(match.group(1)) / ".lock").read_text().strip() if match else ""
    except OSError:
        return False
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


def _sweep() -> None:
    """Remove half-built chroots of dead builders (a killed run leaves them)."""
    for old in CACHE.glob(".build-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            Chroot(old / "root", "").remove()
            shutil.rmtree(old, ignore_errors=True)


class Chroot:
    """A Debian root folder to run commands in."""

    def __init__(self, root: Path, suite: str) -> None:
        self.root = Path(root)
        self.suite = suite

    def unpack(self, tarball: Path) -> None:
        """Fill the root from a cached tarball."""
        self.root.mkdir(parents=True, exist_ok=True)
        run(["tar", "-C", str(self.root), "-xf", str(tarball)], timeout=600)

    def mount_proc(self) -> None:
        """Mount /proc (apt needs it) and a read-only /sys (the system probe reads it)."""
        for fstype, options in (("proc", "rw"), ("sysfs", "ro")):
            target = self.root / ("proc" if fstype == "proc" else "sys")
            target.mkdir(exist_ok=True)
            if not os.path.ismount(target):
                run(["mount", "-t", fstype, "-o", options, fstype, str(target)], timeout=30)

    def umount_proc(self) -> None:
        """Unmount /proc and /sys if mounted (lazily, so a stray process cannot keep them busy)."""
        for name in ("sys", "proc"):
            if os.path.ismount(self.root / name):
                run(["umount", "-l", str(self.root / name)], timeout=30)

    def remove(self) -> None:
        """Unmount and delete the root; refuses to delete while anything is still mounted."""
        if not self.root.exists():
            return
        self.umount_proc()
        root = str(self.root.resolve())
        with open("/proc/self/mounts") as mounts:
            busy = [m.split()[1] for m in mounts if m.split()[1].startswith(root + "/")]
        if busy:
            raise RuntimeError(f"still mounted under {root}: {busy}")
        shutil.rmtree(self.root, ignore_errors=True)

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 300,
        check: bool = True,
        env: Optional[dict] = None,
        input: Optional[str] = None,
    ) -> subprocess.CompletedProcess:
        """Run argv inside the chroot (system PATH, no pyenv, no host Python variables)."""
        full = ["chroot", str(self.root), *argv]
        if check:
            return run(full, timeout=timeout, env=env or {}, input=input)
        base = {"PATH": SYSPATH, "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
        return subprocess.run(
            full,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**base, **(env or {})},
            input=input,
            check=False,
        )

    def path(self, inside: str) -> Path:
        """The host path of a path inside the chroot."""
        return self.root / inside.lstrip("/")


ROOT = Path(__file__).resolve().parents[2]


def hma_version() -> str:
    """hma's version from the source tree."""
    for line in (ROOT / "hma" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__ = "):
            return line.split('"')[1]
    raise RuntimeError("no __version__")


def source_files() -> list[str]:
    """Every file the installed package must carry, relative to the private tree (hma/...).

    Python modules of hma/ and of probes/ (installed as hma/probes/) and every data file under
    them: what setup.py's packages and setup.cfg's package_data must cover as the project grows.
    """
    plugins = ("probes",)
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "hma", *plugins],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        listed = [
            p.relative_to(ROOT).as_posix()
            for top in ("hma", *plugins)
            for p in (ROOT / top).glob("**/*")
            if p.is_file()
        ]
    out = []
    for name in sorted(listed):
        top, _, rel = name.partition("/")
        if "__pycache__" in name or name.endswith((".pyc", ".so")) or not (ROOT / name).is_file():
            continue
        if top == "hma":
            out.append(name)
        elif top in plugins:
            out.append(f"hma/{top}/{rel}")
    return out
