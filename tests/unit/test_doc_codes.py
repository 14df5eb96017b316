"""Every finding code the documentation names exists in the catalogue (docs/remediation.md showed
`hma fleet` output with EFA_LINK_DOWN, which no probe raises)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from hma.contracts import catalogue

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = sorted({entry.code.split("_", 1)[0] for entry in catalogue.load_builtin()})
NAME = re.compile(rf"\b(?:{'|'.join(FAMILIES)})_[A-Z0-9_]*[A-Z0-9]\b")
# Names of a code's shape that the docs use for something else, found nowhere else in the tree.
NOT_CODES = {
    "IB_PORT_ACTIVE": "a Linux ib_verbs constant the efa driver sets (docs/neuron-efa.md)",
    "IB_PORT_PHYS_STATE_LINK_UP": "the same",
    "EFA_PORT_DOWN": "retired in issue 21; docs/neuron-efa.md says why",
}


def documents() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def other_names() -> set[str]:
    """Names of that shape that are not finding codes: environment variables and journal fields
    (read or written by the shipped code, its scripts and the test stand-ins), the NVML and Xid
    names the catalogue quotes, the kernel's own words the rules match. Found in every tracked
    file but the docs and the test modules (which use made-up codes as data)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    names: set[str] = set()
    for name in listed:
        path = ROOT / name
        if name.startswith("docs/") or name.endswith(".md") or not path.is_file():
            continue
        if name.startswith("tests/") and Path(name).name.startswith("test_"):
            continue
        names |= set(NAME.findall(path.read_text(encoding="utf-8", errors="replace")))
    return names


def site_codes(text: str) -> set[str]:
    """Codes a page defines itself in a site-rule example (``[codes.X]``, ``code = "X"``)."""
    return {a or b for a, b in re.findall(r"\[codes\.(\w+)\]|code = \"(\w+)\"", text)}


def settings(text: str) -> set[str]:
    """Names a page uses as settings: ``$NAME``, ``${NAME}``, ``NAME=``."""
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", text)) | set(
        re.findall(r"\b([A-Z][A-Z0-9_]+)=", text)
    )


def test_every_code_the_docs_name_is_in_the_catalogue() -> None:
    codes = {entry.code for entry in catalogue.load_builtin()}
    known = codes | other_names() | set(NOT_CODES)
    unknown = {}
    for doc in documents():
        text = doc.read_text(encoding="utf-8")
        named = set(NAME.findall(text)) - known - site_codes(text) - settings(text)
        if named:
            unknown[doc.relative_to(ROOT).as_posix()] = sorted(named)
    assert not unknown, f"not in the catalogue (hma explain --list): {unknown}"


def test_the_check_finds_a_code_that_does_not_exist() -> None:
    """The pattern sees a code in `hma fleet` output, in a table and in prose, and the names
    that are not codes do not hide one."""
    text = "node2  idle  EFA_LINK_DOWN  efa:rdmap16s27\n| `GPU_NO_SUCH` | x |\nSYS_NOPE drains"
    known = {entry.code for entry in catalogue.load_builtin()} | other_names()
    assert set(NAME.findall(text)) - known == {"EFA_LINK_DOWN", "GPU_NO_SUCH", "SYS_NOPE"}


def test_the_names_that_are_no_codes_are_current() -> None:
    """Each exception is still named in the docs and still no code."""
    text = "".join(doc.read_text(encoding="utf-8") for doc in documents())
    codes = {entry.code for entry in catalogue.load_builtin()}
    assert [name for name in NOT_CODES if name in codes or name not in text] == []
