"""Mutation helpers for the property-based probe suites (``tests/unit/test_prop_*.py``).

Values and file shapes that a strict reader must refuse (docs/unknown.md): what hma cannot read, or
parse strictly, is unknown for its component, never evidence of a fault. Strategies draw from a
catalogue of known-bad inputs (the ones that fooled Python's ``int()``/``float()``) mixed with
random text, and from file shapes that cannot be read as a value (FIFO, folder, symlink loop).

Shared with the EFA suite: import as ``from mutate import ...`` (tests/unit is on sys.path).
"""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hma.adapters.strict import ParseError, parse_uint


def budget(examples: int) -> settings:
    """Hypothesis settings of the property suites: a fixed, derandomized example budget, no
    deadline (shared CI machines), the reproduction blob printed on failure."""
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


# Text values that are not strictly an unsigned 64-bit counter nor a state word.
GARBAGE_TEXT: tuple[str, ...] = (
    "",
    " ",
    "-1",
    "-0x1",
    "1e-9",
    "1e3",
    "1.5",
    "+3",
    "\u0663",  # Arabic-Indic digit three: int() takes it
    "1_0",  # int() takes it
    "9" * 30,
    "9" * 400,  # float() overflows
    str(2**64),
    "0x",
    "0x1g",
    "0x" + "f" * 17,
    "abc",
    "nan",
    "inf",
    "-inf",
    "N/A?",
    "1 2",
    "\x00",
    "1\x002",
    "\u00a0",
    "\u216b",  # Roman numeral twelve
    "ACTIVE!",
    "4: ",
)
# Raw file contents that are not UTF-8 text, or hold NUL bytes.
GARBAGE_BYTES: tuple[bytes, ...] = (b"\xff\xfe", b"\x80", b"1\x00", b"\x00\x00\x00", b"7\xc3")

# File shapes that replace a regular file and cannot be read as a value (``apply_file`` also
# takes "missing": the path removed).
SHAPES: tuple[str, ...] = ("fifo", "folder", "loop", "dangling")

Mutation = tuple[str, Union[str, bytes]]
"""``("text", value)``, ``("bytes", raw)`` or ``("shape", name)``."""


def is_strict_uint(text: str) -> bool:
    """Whether ``text`` is a valid counter reading (so a mutation to it may be a fault signal)."""
    try:
        parse_uint(text)
    except ParseError:
        return False
    return True


def garbage_text() -> st.SearchStrategy[str]:
    """Text that never parses strictly as an unsigned integer."""
    known = st.sampled_from(GARBAGE_TEXT)
    drawn = st.one_of(
        known,
        known,
        known,
        st.text(max_size=12),
        st.integers(min_value=-(2**70), max_value=-1).map(str),
        st.integers(min_value=2**64, max_value=2**200).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )
    return drawn.filter(lambda t: not is_strict_uint(t))


# Spaces ``str.strip()``/``str.split()`` drop or split at, that a strict reader keeps (ASCII only).
UNICODE_SPACES: tuple[str, ...] = ("\u00a0", "\u2003", "\u2008", "\u3000", "\u2028", "\x85", "\x1c")


def lenient_number() -> st.SearchStrategy[str]:
    """Text that ``int(text.strip())`` reads as a count, but a strict reader of a decimal file
    refuses: digits beside a Unicode space, ``0x`` hex, -1 written unsigned ("not available"),
    digits followed by blanks past the 64 KiB read limit (a cut read)."""
    digits = st.integers(min_value=1, max_value=10**6).map(str)
    space = st.sampled_from(UNICODE_SPACES)
    return st.one_of(
        st.tuples(space, digits).map("".join),
        st.tuples(digits, space).map("".join),
        st.integers(min_value=1, max_value=2**32).map(hex),
        st.sampled_from((str(2**64 - 1), str(2**32 - 1))),
        digits.map(lambda d: d + " " * 65536),
    )


def file_mutation() -> st.SearchStrategy[Mutation]:
    """A mutation of one file: garbage text, garbage bytes or an unreadable shape."""
    return st.one_of(
        garbage_text().map(lambda t: ("text", t)),
        st.sampled_from(GARBAGE_BYTES).map(lambda b: ("bytes", b)),
        st.sampled_from(SHAPES).map(lambda s: ("shape", s)),
    )


def folder_mutation() -> st.SearchStrategy[str]:
    """An unreadable shape for a folder: a plain file, a FIFO, a symlink loop, a dangling link."""
    return st.sampled_from(("file", "fifo", "loop", "dangling"))


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file() or path.is_fifo():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _shape(path: Path, shape: str) -> None:
    if shape == "missing":
        return  # removed, nothing in its place
    if shape == "fifo":
        os.mkfifo(path)
    elif shape == "folder":
        path.mkdir()
    elif shape == "file":
        path.write_bytes(b"0\n")
    elif shape == "loop":
        os.symlink(path.name, path)  # a link to itself: ELOOP
    elif shape == "dangling":
        os.symlink(f"{path.name}.gone", path)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def apply_file(path: Path, mutation: Mutation) -> None:
    """Replace the file at ``path`` (which may be missing) by ``mutation``."""
    kind, payload = mutation
    _remove(path)
    if kind == "text":
        assert isinstance(payload, str)
        path.write_bytes(payload.encode("utf-8", "surrogatepass"))
    elif kind == "bytes":
        assert isinstance(payload, bytes)
        path.write_bytes(payload)
    else:
        assert isinstance(payload, str)
        _shape(path, payload)


def break_folder(path: Path, shape: str) -> None:
    """Replace the folder at ``path`` by an unreadable ``shape`` (folder_mutation)."""
    _remove(path)
    _shape(path, shape)


@contextmanager
def mutated_file(path: Path, mutation: Mutation) -> Iterator[None]:
    """``path`` replaced by ``mutation`` for the ``with`` block, then put back as it was."""
    original = path.read_bytes()
    apply_file(path, mutation)
    try:
        yield
    finally:
        apply_file(path, ("bytes", original))


@contextmanager
def broken(path: Path, shape: str) -> Iterator[None]:
    """The folder ``path`` replaced by an unreadable ``shape`` for the block, then restored."""
    backup = path.with_name(path.name + ".orig")
    shutil.copytree(path, backup, symlinks=True)
    break_folder(path, shape)
    try:
        yield
    finally:
        _remove(path)
        backup.rename(path)


def files_under(root: Path, pattern: str = "*") -> list[Path]:
    """Regular files below ``root`` whose name matches ``pattern``, sorted (links not followed)."""
    return sorted(p for p in root.rglob(pattern) if p.is_file() and not p.is_symlink())


_XML_TEXT = re.compile(r"<([A-Za-z_][\w]*)>([^<]*)</\1>")


def xml_leaves(doc: str) -> list[re.Match[str]]:
    """Leaf elements (``<tag>text</tag>``) of an XML document, in order."""
    return list(_XML_TEXT.finditer(doc))


def replace_leaf(doc: str, leaf: re.Match[str], text: str) -> str:
    """``doc`` with the text of ``leaf`` replaced by ``text`` (XML-escaped)."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return doc[: leaf.start(2)] + escaped + doc[leaf.end(2) :]
