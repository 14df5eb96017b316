"""Checks of an installed package, the same for the .deb and the .rpm: every shipped executable
runs, every documentation path a shipped file names is there to read, the man pages and the
shell completion match hma's argument parser."""

from __future__ import annotations

import argparse
import gzip
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterable

from hma.cli import build_parser
from hma.contracts import catalogue
from hma.contracts.model import Severity
from hma.detection import registry

from .chroots import ROOT

Run = Callable[..., subprocess.CompletedProcess]  # run(*argv) inside the installed root
DOC = "/usr/share/doc/hma"
DOC_PATH = re.compile(r"/usr/share/doc/hma(?:/[\w.-]+)*")
DOC_NAME = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)\b")  # docs/NAME.md: DOC/NAME.md
MAN = "/usr/share/man/man1"
VERDICT = re.compile(r"^\S+: (OK|WARNING|CRITICAL|UNKNOWN)\b")


def commands() -> list[str]:
    """hma's subcommands, from the argument parser of this source."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return list(sub.choices)  # type: ignore[arg-type]


def check_executables(run: Run, shipped: Iterable[str], version: str) -> None:
    """Every executable the package puts in /usr/bin runs in the installed root."""
    shipped_bins = sorted(f for f in shipped if f.startswith("/usr/bin/"))
    assert shipped_bins == ["/usr/bin/hma", "/usr/bin/hma-healthcheck"], shipped_bins
    res = run("hma", "--version")
    assert (res.returncode, res.stdout.strip()) == (0, f"hma {version}"), res.stderr
    res = run("hma", "--help")
    assert res.returncode == 0 and res.stdout.startswith("usage: hma"), res.stderr
    assert all(name in res.stdout for name in commands()), res.stdout
    res = run("hma", "explain", "GPU_XID_79")
    assert res.returncode == 0 and res.stdout.startswith("GPU_XID_79\n"), res.stderr
    # slurm.conf HealthCheckProgram=/usr/bin/hma-healthcheck: the verdict, its exit code
    for argv in (["hma-healthcheck"], ["hma", "healthcheck"]):
        res = run(*argv)
        assert "Traceback" not in res.stderr, res.stderr
        verdict = VERDICT.match(res.stdout)
        assert verdict, (argv, res.stdout, res.stderr)
        assert res.returncode == int(Severity.parse(verdict[1].lower())), (argv, res.stdout)


def check_docs(root: Path) -> None:
    """Every page of docs/ (and its examples) and contrib/monitoring is installed under DOC
    as it is in the source: uncompressed, byte for byte."""
    sources = {f"{DOC}/{p.name}": p for p in (ROOT / "docs").glob("*.md")}
    sources |= {f"{DOC}/examples/{p.name}": p for p in (ROOT / "docs" / "examples").iterdir()}
    sources |= {
        f"{DOC}/monitoring/{p.name}": p for p in (ROOT / "contrib" / "monitoring").iterdir()
    }
    for installed, source in sources.items():
        path = root / installed.lstrip("/")
        assert path.is_file() and path.read_bytes() == source.read_bytes(), installed


def dead_doc_links(root: Path, shipped: Iterable[str]) -> dict[str, list[str]]:
    """``{shipped file: [documentation paths it names that are not readable as named]}``.

    A path under /usr/share/doc/hma, or docs/NAME.md (the source tree's name of DOC/NAME.md),
    in any shipped file, man pages (gzip) included; a page compressed as NAME.md.gz is dead."""
    dead: dict[str, list[str]] = {}
    for name in shipped:
        path = root / name.lstrip("/")
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        text = data.decode("utf-8", errors="replace")
        named = {m.rstrip(".") for m in DOC_PATH.findall(text)}
        named |= {f"{DOC}/{m}" for m in DOC_NAME.findall(text)}
        missing = sorted(n for n in named if not (root / n.lstrip("/")).exists())
        if missing:
            dead[name] = missing
    return dead


def check_manuals(root: Path, shipped: Iterable[str]) -> None:
    """A man page for hma and one per command, each rendering without warnings and showing the
    options of its parser, its exit status and (hma, hma-check) the probes; zsh completion that
    zsh loads and bash completion that completes commands, probes and codes."""
    files = set(shipped)
    pages = {}
    for page in parsers():
        path = f"{MAN}/{page}.1.gz"
        assert path in files, f"no man page {path}"
        pages[page] = root / path.lstrip("/")
    check_pages(pages)
    (zsh_file,) = [f for f in files if f.endswith("/_hma")]
    assert zsh_file in (
        "/usr/share/zsh/vendor-completions/_hma",
        "/usr/share/zsh/site-functions/_hma",
    )
    check_zsh(root / zsh_file.lstrip("/"))
    check_bash(root / "usr/share/bash-completion/completions/hma")


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser of each man page: ``hma`` and ``hma-COMMAND``."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return {"hma": parser, **{f"hma-{name}": p for name, p in sub.choices.items()}}  # type: ignore[union-attr]


def check_pages(pages: dict[str, Path]) -> None:
    """Each page (name: its file, plain or gzip) renders without warnings, names itself, shows
    its parser's options and an EXIT STATUS; hma and hma-check list every registry probe."""
    man = shutil.which("man")
    assert man, "man missing (scripts/apt-packages.txt: man-db)"
    probes, broken = registry.discover()
    assert probes and not broken, broken
    for page, its_parser in parsers().items():
        res = subprocess.run(
            [man, "--warnings", "-l", "-Tutf8", str(pages[page])],
            capture_output=True, text=True, timeout=60, check=False,
            env={"PATH": "/usr/bin:/bin", "MANWIDTH": "80", "LC_ALL": "C.UTF-8"},
        )  # fmt: skip
        assert res.returncode == 0 and not res.stderr, (page, res.stderr)
        text = re.sub(r".\x08", "", res.stdout)  # overstrike (bold, underline)
        assert re.search(rf"^\s+{re.escape(page)}\s+-\s+\S", text, re.M), (page, text[:400])
        for action in its_parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert option in text, (page, option)
        exits = section(text, "EXIT STATUS")
        words = re.sub(r"\s+", " ", re.sub("\u2010\n\\s*", "", exits))  # hyphenated at a break
        assert "0 ok, 1 warning, 2 critical, 3 unknown" in words, (page, exits)
        usage = "hma " + page[len("hma-") :] if page != "hma" else "hma check"
        assert re.search(rf"^\s+{re.escape(usage)}\b", exits, re.M), (page, exits)
        if page in ("hma", "hma-check"):
            listed = section(text, "PROBES")
            assert re.findall(r"^ {7}(\w+)", listed, re.M)[: len(probes)] == sorted(probes)


def section(text: str, title: str) -> str:
    """A rendered page's section ``title`` (up to the next heading); AssertionError without."""
    found = re.search(rf"^{title}\n(.*?)(?=^\S)", text, re.M | re.S)
    assert found, f"no {title} section"
    return found.group(1)


def check_zsh(completion: Path) -> None:
    """zsh reads the completion file, compinit registers it for hma, and it names the registry's
    probes and the catalogue's codes (as the choices of check, explain, ack and reset)."""
    text = completion.read_text()
    for word in [*registry.discover()[0], *(e.code for e in catalogue.load_builtin())]:
        assert re.search(rf"\b{word}\b", text), word
    zsh = shutil.which("zsh")
    assert zsh, "zsh missing (scripts/apt-packages.txt)"
    script = f"fpath=({completion.parent} $fpath); autoload -Uz compinit; compinit -u -D; "
    script += "print -r -- ${_comps[hma]}"
    for argv in ([zsh, "-n", str(completion)], [zsh, "-f", "-c", script]):
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0 and not res.stderr, (argv, res.stderr)
    assert res.stdout.strip() == "_hma", res.stdout  # compinit registers it for hma


def bash_complete(completion: Path, words: list[str]) -> list[str]:
    """What bash offers for the last of ``words`` (``hma ...``) with the completion file."""
    line = " ".join(words)
    array = " ".join(shlex.quote(w) for w in words)
    script = (
        f"source {shlex.quote(str(completion))}; "
        "fn=$(complete -p hma | sed -n 's/.* -F \\([^ ]*\\) .*/\\1/p'); "
        f"COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
        f"COMP_LINE={shlex.quote(line)}; COMP_POINT={len(line)}; "
        f"$fn hma {shlex.quote(words[-1])} {shlex.quote(words[-2])}; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    res = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0 and not res.stderr, res.stderr
    return sorted(res.stdout.split())


def check_bash(completion: Path) -> None:
    """bash completes the commands, the registry's probes after ``hma check`` and the
    catalogue's codes after ``hma explain``, ``ack`` and ``reset``."""
    assert bash_complete(completion, ["hma", ""]) == sorted(commands())
    probes, _ = registry.discover()
    assert bash_complete(completion, ["hma", "check", ""]) == sorted(probes)
    assert bash_complete(completion, ["hma", "check", "gpu", "inf"]) == ["infiniband"]
    xid = sorted(e.code for e in catalogue.load_builtin() if e.code.startswith("GPU_XID_7"))
    assert xid
    for command in ("explain", "ack", "reset"):
        assert bash_complete(completion, ["hma", command, "GPU_XID_7"]) == xid, command
