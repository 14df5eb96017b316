#!/usr/bin/env python3
"""``make release-check``: is this tree, and the packages built from it, a release?

    release.py [--dist DIR]     exit 0 when it is, 1 with one line per problem, 2 on misuse

A release (CONTRIBUTING.md, "Releasing") has one version, ``hma.__version__`` (hma/__init__.py),
which setup.cfg reads (``version = attr: hma.__version__``) and pyproject.toml does not repeat;
CHANGELOG.md's top section is that version with its date (``## 0.2.0 (2026-12-10)``, not
``## Unreleased``); the commit, when tagged, is tagged ``v<version>`` (and no ``v<version>`` tag
names another commit: the version was not bumped); the LICENSE file holds the Apache License 2.0
that setup.cfg names; every package in DIR (default dist/) has that version and ships the
licence: the .deb's copyright file names Apache-2.0, the .rpm lists LICENSE with ``rpm -qL``.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SOURCE = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60
HEADING = re.compile(r"^## (\S+)(?: \((\d{4}-\d{2}-\d{2})\))?\s*$", re.M)
RPM_LICENSE = "/usr/share/licenses/{name}/LICENSE"  # hma, hma-slurm-plugin
DEB_COPYRIGHT = "./usr/share/doc/{name}/copyright"


@dataclass(frozen=True)
class Tree:
    """The files of the source that carry the version and the licence (their text)."""

    init: str
    setup_cfg: str
    pyproject: str
    changelog: str
    license: str


@dataclass(frozen=True)
class Package:
    """A built package: its file, the version it declares, whether it ships hma's licence."""

    path: str
    version: str
    licensed: bool


def version_of(init: str) -> Optional[str]:
    """``__version__`` of hma/__init__.py's text, or None."""
    found = re.search(r'^__version__ = "([^"]+)"$', init, re.M)
    return found.group(1) if found else None


def tree_problems(tree: Tree) -> list[str]:
    """What keeps the source from being release ``hma.__version__``."""
    version = version_of(tree.init)
    if version is None:
        return ['hma/__init__.py: no __version__ = "X.Y.Z" line']
    out = []
    if not re.search(r"^version = attr: hma\.__version__$", tree.setup_cfg, re.M):
        out.append("setup.cfg: [metadata] version is not `attr: hma.__version__`")
    if re.search(r"^version\s*=", tree.pyproject, re.M):
        out.append("pyproject.toml: declares a version of its own (hma/__init__.py is the one)")
    top = HEADING.search(tree.changelog)
    if top is None:
        out.append("CHANGELOG.md: no `## <version> (<date>)` section")
    elif top.group(1) != version or top.group(2) is None:
        out.append(
            f"CHANGELOG.md: the top section is {top.group(0).strip()!r}, not "
            f"'## {version} (YYYY-MM-DD)'"
        )
    if not re.search(r"^license = Apache-2\.0$", tree.setup_cfg, re.M):
        out.append("setup.cfg: license is not Apache-2.0")
    if not ("Apache License" in tree.license and "Version 2.0, January 2004" in tree.license):
        out.append("LICENSE: not the Apache License 2.0 text")
    return out


def tag_problems(version: str, head_tags: list[str], elsewhere: list[str]) -> list[str]:
    """The commit's release tags (``v*`` on HEAD) and those on other commits, against
    ``version``. Untagged is fine (the check before tagging)."""
    want = f"v{version}"
    out = [f"HEAD is tagged {t}, but the version is {version}" for t in head_tags if t != want]
    if want in elsewhere:
        out.append(f"tag {want} names another commit: bump hma.__version__")
    return out


def package_problems(version: str, packages: list[Package]) -> list[str]:
    """Each package's version and licence; none at all is a problem (make deb rpm)."""
    if not packages:
        return ["no .deb or .rpm in the dist folder: make deb rpm (from the tag)"]
    out = []
    for package in packages:
        if package.version != version:
            out.append(f"{package.path}: version {package.version}, not {version}")
        if not package.licensed:
            out.append(f"{package.path}: does not ship hma's Apache-2.0 licence")
    return out


def run(argv: list[str], cwd: Path = SOURCE) -> subprocess.CompletedProcess:
    """``argv``'s result (bytes), never raising for its exit status."""
    return subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, check=False, cwd=cwd)


def read_tree(root: Path) -> Tree:
    """The source's version- and licence-carrying files (missing ones read as empty)."""

    def text(name: str) -> str:
        path = root / name
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    return Tree(
        text("hma/__init__.py"),
        text("setup.cfg"),
        text("pyproject.toml"),
        text("CHANGELOG.md"),
        text("LICENSE"),
    )


def tags(root: Path) -> tuple[list[str], list[str]]:
    """Release tags (``v*``) on HEAD, and those on other commits."""
    every = run(["git", "tag", "--list", "v*"], root).stdout.decode().split()
    on_head = run(["git", "tag", "--list", "v*", "--points-at", "HEAD"], root).stdout.decode()
    return on_head.split(), [t for t in every if t not in on_head.split()]


def read_package(path: Path) -> Package:
    """A .deb's or .rpm's version and whether it ships the licence (dpkg-deb, rpm)."""
    if path.suffix == ".deb":
        fields = run(["dpkg-deb", "-f", str(path), "Package", "Version"]).stdout.decode()
        values = dict(line.split(": ", 1) for line in fields.splitlines() if ": " in line)
        version = values.get("Version", "").strip()
        copyright_path = DEB_COPYRIGHT.format(name=values.get("Package", "").strip())
        tree = run(["dpkg-deb", "--fsys-tarfile", str(path)]).stdout
        copyright_text = ""
        with tarfile.open(fileobj=io.BytesIO(tree)) as tar:
            if copyright_path in tar.getnames():
                member = tar.extractfile(copyright_path)
                copyright_text = member.read().decode() if member else ""
        licensed = re.search(
            r"^Files: \*\nCopyright: .*\nLicense: Apache-2\.0$", copyright_text, re.M
        )
        return Package(str(path), version, licensed is not None)
    query = run(["rpm", "-qp", "--qf", "%{NAME} %{VERSION}", str(path)]).stdout.decode().split()
    name, version = (query + ["", ""])[:2]
    listed = run(["rpm", "-qpL", str(path)]).stdout.decode().split()
    return Package(str(path), version, RPM_LICENSE.format(name=name) in listed)


def main(argv: list[str]) -> int:
    """Print each problem on stderr; 0 when there is none."""
    parser = argparse.ArgumentParser(prog="release.py", description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=SOURCE / "dist", help="the packages' folder")
    dist = parser.parse_args(argv).dist  # exits 2 on misuse
    tree = read_tree(SOURCE)
    problems = tree_problems(tree)
    version = version_of(tree.init)
    if version is not None:
        problems += tag_problems(version, *tags(SOURCE))
        found = sorted(
            [*dist.glob("hma_*.deb"), *dist.glob("hma-slurm-plugin_*.deb"), *dist.glob("hma-*.rpm")]
        )
        problems += package_problems(version, [read_package(p) for p in found])
    for problem in problems:
        print(f"release-check: {problem}", file=sys.stderr)
    if not problems:
        print(f"release-check: hma {version} is a release (tree, tag, packages)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
