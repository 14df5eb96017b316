"""When the Slurm 24.11 tests may skip: only when no root is cached and the mirror is
unreachable (a missing tool or a failed build is an error, never a skip)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests import slurmchroot
from tests.install import chroots

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="why_not() first asks for root")


def test_unreachable_mirror_without_a_cached_root_is_a_skip_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(chroots, "CACHE", tmp_path)
    monkeypatch.setattr(slurmchroot, "mirror", lambda: f"http://127.0.0.1:{port}/debian")
    why = slurmchroot.why_not()
    assert why is not None and "mirror is unreachable" in why


def test_a_cached_root_needs_no_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / f"{slurmchroot.SUITE}-tree"
    tree.mkdir()
    (tree / "root").mkdir()
    packages = " ".join(sorted(slurmchroot.PACKAGES))
    (tree / "stamp").write_text(f"{chroots.CACHE_FORMAT} trixie {packages}\n")
    monkeypatch.setattr(chroots, "CACHE", tmp_path)
    monkeypatch.setattr(slurmchroot, "mirror", lambda: "http://127.0.0.1:1/never-asked")
    assert slurmchroot.why_not() is None
    (tree / "stamp").write_text(
        f"{chroots.CACHE_FORMAT} trixie munge\n"
    )  # another package list: rebuilt, so asked
    assert "unreachable" in str(slurmchroot.why_not())


def test_a_failed_build_is_remembered_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def broken(suite: str, packages: object) -> None:
        calls.append(suite)
        raise RuntimeError("debootstrap exited 1\nE: no such script")

    monkeypatch.setattr(slurmchroot, "ensure_tree", broken)
    monkeypatch.setattr(slurmchroot, "BUILD_ERROR", {})
    for _ in range(2):
        with pytest.raises(RuntimeError, match="root for Slurm 24.11 failed: debootstrap exited"):
            slurmchroot.image()
    assert calls == ["trixie"]  # not built again for every cluster
    assert slurmchroot.describe() == (
        "building the trixie root for Slurm 24.11 failed: debootstrap exited 1"
    )
