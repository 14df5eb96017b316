"""Install tests: build the .deb and .rpm, install them into Debian chroots and a folder.

They run with `make install-test` (part of `make test`), which sets HMA_INSTALL_TESTS=1; a plain
`pytest tests` skips them (they need root, debootstrap and the network to the Debian mirror).
Chroots are cached as tarballs in $HMA_TEST_CACHE (default /var/cache/hma-test), outside the tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from .chroots import Chroot, ensure_tarball, hma_version, sweep_mounts

ROOT = Path(__file__).resolve().parents[2]
SYSPATH = "/usr/sbin:/usr/bin:/sbin:/bin"
ENABLED = os.environ.get("HMA_INSTALL_TESTS") == "1"
TIMINGS: dict[str, float] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the install tests unless `make install-test` asked for them."""
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="install tests run with `make install-test`")
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Print how long the package builds and chroot preparations took (for the CI budget)."""
    if TIMINGS:
        terminalreporter.write_sep("-", "install test timings (s)")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name:<40} {seconds:7.1f}")


def timed(name: str, func, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Run func and record its wall time under name."""
    start = time.monotonic()
    try:
        return func(*args, **kwargs)
    finally:
        TIMINGS[name] = time.monotonic() - start


def build(what: str, top: Path = ROOT) -> Path:
    """``TOP/packaging/build deb|rpm``; returns the package file."""
    env = {
        **os.environ,
        "PIP_PYTHON": sys.executable,
        "HMA_VENDOR_DIR": str(ROOT / "build" / "vendor"),  # a copy's build uses ours
    }
    res = subprocess.run(
        [str(top / "packaging" / "build"), what],
        cwd=top,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, f"packaging/build {what} failed:\n{res.stdout}\n{res.stderr}"
    path = top / res.stdout.strip().splitlines()[-1]
    assert path.is_file(), res.stdout
    return path


@pytest.fixture(scope="session")
def deb() -> Path:
    """The freshly built .deb."""
    if os.geteuid() != 0:
        pytest.fail("install tests need root (debootstrap, chroot)")
    return timed("make deb", build, "deb")


@pytest.fixture(scope="session")
def rpm() -> Path:
    """The freshly built .rpm."""
    return timed("make rpm", build, "rpm")


UPGRADE_SUFFIX = ".post1"
UNIT_CHANGE = "# changed in the next version (tests/install/test_upgrade.py)\n"


@pytest.fixture(scope="session")
def next_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this source as the next release: the version bumped (``.post1``) and every
    systemd unit changed, so that an upgrade shows whether the new units are loaded."""
    top = tmp_path_factory.mktemp("next") / "hma"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT, capture_output=True, timeout=60, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (top / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, top / name)
    init = top / "hma" / "__init__.py"
    text = init.read_text()
    version = hma_version()
    assert f'__version__ = "{version}"' in text
    init.write_text(text.replace(version, version + UPGRADE_SUFFIX, 1))
    for unit in (top / "systemd").iterdir():
        unit.write_text(unit.read_text() + UNIT_CHANGE)
    return top


@pytest.fixture(scope="session")
def next_deb(deb: Path, next_source: Path) -> Path:
    """The .deb of the next release (built after ours: it reuses the vendored wheels)."""
    return timed("make deb (next version)", build, "deb", next_source)


@pytest.fixture(scope="session")
def next_rpm(rpm: Path, next_source: Path) -> Path:
    """The .rpm of the next release."""
    return timed("make rpm (next version)", build, "rpm", next_source)


def chroot_fixture(suite: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    """A fresh chroot of ``suite`` from the cached tarball, /proc mounted; removed afterwards."""
    sweep_mounts(tmp_path_factory.getbasetemp())
    tarball = timed(f"chroot tarball {suite} (cached or built)", ensure_tarball, suite)
    box = Chroot(tmp_path_factory.mktemp(f"chroot-{suite}"), suite)
    try:
        timed(f"chroot {suite} unpack", box.unpack, tarball)
        box.mount_proc()
        yield box
    finally:
        box.remove()


@pytest.fixture(scope="module")
def bookworm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    """Debian 12 chroot (Python 3.11)."""
    yield from chroot_fixture("bookworm", tmp_path_factory)


@pytest.fixture(scope="module")
def bullseye(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    """Debian 11 chroot (Python 3.9)."""
    yield from chroot_fixture("bullseye", tmp_path_factory)
