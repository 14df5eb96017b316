"""packaging/release.py (`make release-check`): what makes a tree, its tag and its packages a
release, on texts, on a real git repository and on a real .deb (dpkg-deb)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hma_release", ROOT / "packaging" / "release.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


release = load()

CHANGELOG = "# Changelog\n\n## 0.2.0 (2026-12-10)\n\n- things\n\n## 0.1.0 (2026-11-29)\n\n- first\n"


def tree(**changes: str) -> object:
    """A release tree of version 0.2.0, with ``changes`` to its files' texts."""
    base = release.Tree(
        init='"""hma."""\n\n__version__ = "0.2.0"\n',
        setup_cfg="[metadata]\nname = hma\nversion = attr: hma.__version__\nlicense = Apache-2.0\n",
        pyproject="[tool.ruff]\nline-length = 100\n",
        changelog=CHANGELOG,
        license=(ROOT / "LICENSE").read_text(),
    )
    return replace(base, **changes)


def test_the_shipped_licence_is_the_apache_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.splitlines()[1].strip() == "Apache License"
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # this tree is a release but for its CHANGELOG's top section (`## Unreleased` between releases)
    problems = release.tree_problems(release.read_tree(ROOT))
    assert [p for p in problems if not p.startswith("CHANGELOG.md:")] == []


def test_a_release_tree_has_no_problem() -> None:
    assert release.tree_problems(tree()) == []


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"changelog": "# Changelog\n\n## Unreleased\n\n- x\n" + CHANGELOG[13:]},
            "'## Unreleased'",
        ),
        ({"changelog": CHANGELOG.replace("0.2.0 (2026-12-10)", "0.2.0")}, "'## 0.2.0'"),
        ({"changelog": CHANGELOG.replace("## 0.2.0", "## 0.1.9")}, "'## 0.1.9 (2026-12-10)'"),
        ({"changelog": "# Changelog\n"}, "no `## <version> (<date>)` section"),
        ({"init": "__version__ = 2\n"}, "no __version__"),
        ({"setup_cfg": "version = 0.2.0\nlicense = Apache-2.0\n"}, "attr: hma.__version__"),
        ({"pyproject": '[project]\nversion = "0.2.0"\n'}, "pyproject.toml: declares a version"),
        ({"license": ""}, "LICENSE: not the Apache License 2.0 text"),
        ({"setup_cfg": "version = attr: hma.__version__\nlicense = MIT\n"}, "not Apache-2.0"),
    ],
)
def test_what_is_not_a_release(changes: dict[str, str], problem: str) -> None:
    (found,) = release.tree_problems(tree(**changes))
    assert problem in found


def test_tags() -> None:
    assert release.tag_problems("0.2.0", [], ["v0.1.0"]) == []  # untagged: before tagging
    assert release.tag_problems("0.2.0", ["v0.2.0"], ["v0.1.0"]) == []
    assert release.tag_problems("0.2.0", ["v0.1.9"], []) == [
        "HEAD is tagged v0.1.9, but the version is 0.2.0"
    ]
    assert release.tag_problems("0.2.0", [], ["v0.2.0"]) == [
        "tag v0.2.0 names another commit: bump hma.__version__"
    ]


def test_packages() -> None:
    good = [release.Package("dist/hma_0.2.0_all.deb", "0.2.0", True)]
    assert release.package_problems("0.2.0", good) == []
    assert release.package_problems("0.2.0", []) == [
        "no .deb or .rpm in the dist folder: make deb rpm (from the tag)"
    ]
    bad = [release.Package("dist/hma-0.1.0-1.noarch.rpm", "0.1.0", False)]
    assert release.package_problems("0.2.0", bad) == [
        "dist/hma-0.1.0-1.noarch.rpm: version 0.1.0, not 0.2.0",
        "dist/hma-0.1.0-1.noarch.rpm: does not ship hma's Apache-2.0 licence",
    ]


def git(repo: Path, *argv: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *argv],
        cwd=repo, check=True, capture_output=True, timeout=30,
    )  # fmt: skip


def test_tags_of_a_real_repository(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("1")
    git(tmp_path, "add", "f")
    git(tmp_path, "commit", "-qm", "one")
    git(tmp_path, "tag", "-a", "v0.1.0", "-m", "0.1.0")
    assert release.tags(tmp_path) == (["v0.1.0"], [])
    (tmp_path / "f").write_text("2")
    git(tmp_path, "commit", "-qam", "two")
    git(tmp_path, "tag", "not-a-release")
    assert release.tags(tmp_path) == ([], ["v0.1.0"])


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed")
@pytest.mark.parametrize(("licence", "licensed"), [("Apache-2.0", True), ("MIT", False)])
def test_a_real_deb(tmp_path: Path, licence: str, licensed: bool) -> None:
    root = tmp_path / "root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: hma\nVersion: 0.2.0\nArchitecture: all\nMaintainer: t <t@localhost>\n"
        "Description: test\n"
    )
    doc = root / "usr" / "share" / "doc" / "hma"
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(
        f"Format: x\n\nFiles: *\nCopyright: hma developers\nLicense: {licence}\n"
    )
    deb = tmp_path / "hma_0.2.0_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert release.read_package(deb) == release.Package(str(deb), "0.2.0", licensed)
