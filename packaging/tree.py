#!/usr/bin/env python3
"""Lay out hma's private tree inside a package build root (used by debian/rules and hma.spec).

One layout for every package format, independent of the Python version it is built with:

    /usr/lib/hma/hma/                  the hma package (with hma.probes, catalogue data, ...)
    /usr/lib/hma/hma-<v>.dist-info/    its metadata: entry points, so probes are discovered
    /usr/lib/hma/vendor/               nvidia-ml-py and tomli with their dist-info and licenses
    /usr/bin/hma, /usr/bin/hma-...     launchers (one per console script of the wheel) that put
                                       the two folders first on sys.path
    /etc/hma/hma.toml                  every key with its default, commented (`hma config defaults`)
    /usr/lib/systemd/catalog/*.catalog journal message catalog(s) found in the source tree

Standard library only, Python 3.9+: it also runs inside rpmbuild on RHEL-family hosts.

    tree.py download DEST [--pip PYTHON]     fetch the wheels pinned in vendor.txt (hash-checked)
    tree.py install --root R --vendor DIR [--wheel W] [--lib /usr/lib/hma] [--bindir /usr/bin]
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple, Optional

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent
VENDOR_LIST = HERE / "vendor.txt"

LAUNCHER = '''#!{python} -I
"""{name}: launcher of hma's private tree {lib} ({module}:{func})."""
import sys

sys.path[:0] = ["{lib}", "{lib}/vendor"]
from {module} import {func}  # noqa: E402

sys.exit({func}())
'''

# Runs with the freshly installed tree first on sys.path: refuses to write a partial config file
# when a probe, source or reporter fails to load (e.g. a missing build dependency).
DEFAULTS_SNIPPET = """
import sys
sys.path[:0] = sys.argv[1:3]
from hma import assembly
from hma.contracts import catalogue
from hma.config import schema as config
from hma.detection import registry
from hma.contracts.probe import Probe
from hma.contracts.source import EventSource, GROUP
classes, broken = registry.discover()
sources, broken2 = registry.discover(GROUP, EventSource)
broken += broken2
if broken:
    for item in broken:
        print(f"tree.py: plugin {item.name} does not load: {item.error}", file=sys.stderr)
    sys.exit(1)
schema = assembly.schema_for(classes, broken, catalogue.load_builtin(), sources)
print(config.render_defaults(schema))
"""


class Vendored(NamedTuple):
    """One line of vendor.txt."""

    name: str
    version: str
    sha256: str
    imports: tuple[str, ...]

    @property
    def wheel_prefix(self) -> str:
        """Start of the wheel's file name (PEP 427 escapes '-' in the name as '_')."""
        return f"{self.name.replace('-', '_')}-{self.version}-"


def read_vendor_list(path: Path = VENDOR_LIST) -> list[Vendored]:
    """Parse vendor.txt: ``name==version  sha256  import [import...]`` per line."""
    out = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) < 3 or "==" not in fields[0]:
            raise SystemExit(f"{path}: bad line: {raw!r}")
        name, version = fields[0].split("==", 1)
        out.append(Vendored(name, version, fields[1].lower(), tuple(fields[2:])))
    return out


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def find_wheel(folder: Path, item: Vendored) -> Optional[Path]:
    """The wheel of ``item`` in ``folder`` whose hash matches, or None."""
    for candidate in sorted(folder.glob(item.wheel_prefix + "*.whl")):
        if sha256(candidate) == item.sha256:
            return candidate
    return None


def download(dest: Path, python: str) -> None:
    """Fetch the pinned wheels with pip (hash-checked); keeps wheels already present."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = [item for item in read_vendor_list() if find_wheel(dest, item) is None]
    if not wanted:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        for item in wanted:
            req.write(f"{item.name}=={item.version} --hash=sha256:{item.sha256}\n")
    try:
        subprocess.run(
            [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--require-hashes", "--dest", str(dest), "--requirement", req.name],
            check=True, timeout=600,
        )  # fmt: skip
    finally:
        os.unlink(req.name)
    for item in wanted:
        if find_wheel(dest, item) is None:
            raise SystemExit(f"tree.py: pip did not leave {item.name}=={item.version} in {dest}")


def unpack_wheel(wheel: Path, target: Path, keep: Optional[tuple[str, ...]] = None) -> str:
    """Extract a pure-Python wheel's library files into ``target``; returns its dist-info name.

    ``keep`` limits the top-level modules to those import names (plus the dist-info). RECORD is
    dropped: files are left out and byte-code is compiled on the target, so it would be wrong.
    """
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        for name in names:
            top = name.split("/")[0]
            if name.endswith("/") or "__pycache__" in name.split("/"):
                continue
            if top.endswith(".data"):
                continue  # pure wheels here carry no scripts or data we want
            if top == dist_info:
                if name.endswith("/RECORD"):
                    continue
            elif keep is not None and top not in keep and top.removesuffix(".py") not in keep:
                continue
            out = target / name
            out.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(name) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            out.chmod(0o644)
    return dist_info


def license_from_header(module: Path) -> str:
    """The leading comment block of a module when it holds a copyright notice, else ''."""
    lines = []
    for line in module.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").rstrip()[1:] if line.startswith("# ") else "")
    text = "\n".join(lines).strip() + "\n"
    return text if "copyright" in text.lower() else ""


def install_vendor(vendor_dir: Path, target: Path) -> None:
    """Unpack every vendored wheel into ``target`` and make sure each has a license file."""
    target.mkdir(parents=True, exist_ok=True)
    for item in read_vendor_list():
        wheel = find_wheel(vendor_dir, item)
        if wheel is None:
            raise SystemExit(
                f"tree.py: no wheel of {item.name}=={item.version} with sha256 {item.sha256} in "
                f"{vendor_dir} (run `make vendor`)"
            )
        info = target / unpack_wheel(wheel, target, item.imports)
        found = sorted(
            p for p in info.rglob("*") if p.name.upper().startswith(("LICENSE", "COPYING"))
        )
        if found:  # every vendored dist-info ends up with a file named exactly LICENSE
            if not (info / "LICENSE").exists():
                shutil.copyfile(found[0], info / "LICENSE")
            continue
        for name in item.imports:
            module = target / f"{name}.py"
            if not module.exists():
                module = target / name / "__init__.py"
            text = license_from_header(module) if module.exists() else ""
            if text:
                (info / "LICENSE").write_text(text, encoding="utf-8")
                break
        else:
            raise SystemExit(f"tree.py: {item.name} ships no license file or header")


def launcher(python: str, lib: str, name: str = "hma", entry: str = "hma.cli:main") -> str:
    """The text of the launcher ``name`` that runs ``entry`` (``module:function``) from ``lib``."""
    match = re.fullmatch(r"([A-Za-z_][\w.]*):([A-Za-z_]\w*)", entry.strip())
    if not match:
        raise SystemExit(f"tree.py: console script {name} = {entry!r} is not module:function")
    return LAUNCHER.format(python=python, lib=lib, name=name, module=match[1], func=match[2])


def console_scripts(tree: Path) -> dict[str, str]:
    """``name -> module:function`` of every console script in hma's installed dist-info."""
    infos = sorted(tree.glob("hma-*.dist-info/entry_points.txt"))
    if len(infos) != 1:
        raise SystemExit(f"tree.py: want one hma-*.dist-info/entry_points.txt in {tree}: {infos}")
    entries = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    entries.optionxform = str  # type: ignore[assignment,method-assign]  # keep the names' case
    entries.read(infos[0], encoding="utf-8")
    scripts = dict(entries["console_scripts"]) if entries.has_section("console_scripts") else {}
    if "hma" not in scripts:
        raise SystemExit(f"tree.py: {infos[0]} names no hma console script")
    return scripts


def write_config(root: Path, lib: str, python: str, path: str) -> None:
    """Generate the commented defaults with the installed tree itself."""
    tree = root / lib.lstrip("/")
    result = subprocess.run(
        [python, "-I", "-B", "-c", DEFAULTS_SNIPPET, str(tree), str(tree / "vendor")],
        stdout=subprocess.PIPE, check=False, timeout=120, text=True,
    )  # fmt: skip
    if result.returncode != 0 or "[agent]" not in result.stdout:
        raise SystemExit(f"tree.py: `hma config defaults` failed (exit {result.returncode})")
    out = root / path.lstrip("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(result.stdout, encoding="utf-8")
    out.chmod(0o644)


def catalogs() -> list[Path]:
    """Journal message catalogs anywhere under hma/ or packaging/ of the source tree."""
    found = []
    for folder in ("hma", "probes", "packaging"):
        found += sorted((SOURCE / folder).rglob("*.catalog"))
    names = [p.name for p in found]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise SystemExit(f"tree.py: two catalog files named {sorted(dupes)}")
    return found


def install(args: argparse.Namespace) -> None:
    """Build the private tree, launcher, config and catalogs under ``args.root``."""
    root = Path(args.root)
    tree = root / args.lib.lstrip("/")
    if args.wheel:
        unpack_wheel(Path(args.wheel), tree)
    if not (tree / "hma" / "__init__.py").exists():
        raise SystemExit(f"tree.py: no hma package in {tree} (give --wheel)")
    for cache in list(tree.rglob("__pycache__")):
        shutil.rmtree(cache)
    install_vendor(Path(args.vendor), tree / "vendor")
    bindir = root / args.bindir.lstrip("/")
    bindir.mkdir(parents=True, exist_ok=True)
    for name, entry in console_scripts(tree).items():
        script = bindir / name
        if script.exists() or script.is_symlink():
            script.unlink()  # the wheel install's console script cannot see the private tree
        script.write_text(launcher(args.python, args.lib, name, entry), encoding="utf-8")
        script.chmod(0o755)
    write_config(root, args.lib, args.build_python, args.config)
    for folder in ("probes.d", "hma.d", "rules.d"):  # exec probes; config drop-ins; site rules
        (root / args.config.lstrip("/")).parent.joinpath(folder).mkdir(mode=0o755, exist_ok=True)
    catdir = root / args.catalogdir.lstrip("/")
    for catalog in catalogs():
        catdir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(catalog, catdir / catalog.name)
        (catdir / catalog.name).chmod(0o644)


def main(argv: Optional[list[str]] = None) -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="tree.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("download", help="fetch the pinned vendored wheels")
    p.add_argument("dest")
    p.add_argument("--pip", default=sys.executable, help="Python whose pip downloads")
    p = sub.add_parser("install", help="lay out the private tree in a build root")
    p.add_argument("--root", required=True, help="package build root (DESTDIR)")
    p.add_argument("--vendor", required=True, help="folder with the vendored wheels")
    p.add_argument("--wheel", help="hma wheel to unpack (omit when already installed there)")
    p.add_argument("--lib", default="/usr/lib/hma")
    p.add_argument("--bindir", default="/usr/bin")
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter of the launcher")
    p.add_argument("--build-python", default=sys.executable, help="runs `config defaults`")
    p.add_argument("--config", default="/etc/hma/hma.toml")
    p.add_argument("--catalogdir", default="/usr/lib/systemd/catalog")
    args = parser.parse_args(argv)
    if args.cmd == "download":
        download(Path(args.dest), args.pip)
    else:
        install(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
