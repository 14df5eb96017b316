"""The strict reader of numbers and state words (hma.adapters.strict); RootReader on bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from hma.adapters.files import ReadError, RootReader
from hma.adapters.strict import U64_MAX, ParseError, parse_decimal, parse_uint, parse_word


@pytest.mark.parametrize("raw,value", [("0", 0), ("12\n", 12), (" 7 ", 7), ("0x1d0f", 0x1D0F)])
def test_uint_accepts_plain_counters(raw: str, value: int) -> None:
    assert parse_uint(raw) == value


@pytest.mark.parametrize(
    "raw",
    ["", "-1", "+1", "1_0", "\u0663", "1e-9", "1.0", "9" * 21, "9" * 400, "\x00", "1\x002", "abc"],
)
def test_uint_refuses_what_int_would_take_or_overflow(raw: str) -> None:
    with pytest.raises(ParseError):
        parse_uint(raw)


def test_uint_range() -> None:
    assert parse_uint(str(U64_MAX)) == U64_MAX
    with pytest.raises(ParseError, match="out of range"):
        parse_uint(str(U64_MAX + 1))
    with pytest.raises(ParseError):
        parse_uint("0x10", hex_ok=False)


def test_decimal() -> None:
    assert parse_decimal("37.5", low=-300, high=300) == 37.5
    for raw in ("inf", "nan", "1e3", "400"):
        with pytest.raises(ParseError):
            parse_decimal(raw, low=-300, high=300)


def test_word_recognised_or_refused() -> None:
    assert parse_word("active\n", ["ACTIVE", "DOWN"]) == "ACTIVE"
    for raw in ("", "abc", "ACT\u0130VE", "\x00"):
        with pytest.raises(ParseError, match="unrecognised"):
            parse_word(raw, ["ACTIVE", "DOWN"])


def test_root_reader_bad_files(tmp_path: Path) -> None:
    (tmp_path / "nul").write_bytes(b"4\x00")
    (tmp_path / "latin").write_bytes(b"\xff\xfe")
    (tmp_path / "neg").write_text("-1\n")
    reader = RootReader(str(tmp_path))
    for name in ("nul", "latin", "neg"):
        with pytest.raises(ReadError, match=name):
            reader.integer(name)
    (tmp_path / "ok").write_text("0x10\n")
    assert reader.integer("ok") == 16


def test_root_reader_absent_or_unreadable(tmp_path: Path) -> None:
    """Only a path with nothing at all there is absent; a dangling symlink or a real symlink
    loop in its place cannot be read (a ReadError naming it), for files and folders alike."""
    reader = RootReader(str(tmp_path))
    assert reader.text_or_none("missing") is None
    assert reader.listdir("missing") == []
    (tmp_path / "present").write_text("1\n")
    assert reader.text_or_none("present") == "1"
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    for name, why in (("dangling", "dangling symlink"), ("loop_a", "symbolic links")):
        with pytest.raises(ReadError, match=f"{name}: .*{why}"):
            reader.text_or_none(name)
        with pytest.raises(ReadError, match=f"{name}: .*{why}"):
            reader.listdir(name)
