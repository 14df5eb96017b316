"""The strict reader of numbers and state words (hma.adapters.strict); RootReader on bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from hma.adapters.files import ReadError, RootReader
from hma.adapters.strict import (
    U64_MAX,
    ParseError,
    parse_counter,
    parse_decimal,
    parse_uint,
    parse_word,
)


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


@pytest.mark.parametrize("raw", ["\u200812\n", "12\u3000\n", "\u00a07", "7\u2028", "\x1c7"])
def test_root_reader_keeps_unicode_spaces_for_the_parser_to_refuse(
    tmp_path: Path, raw: str
) -> None:
    """``str.strip()`` drops Unicode spaces (and \\x1c-\\x1f): the reader strips ASCII only."""
    (tmp_path / "value").write_text(raw)
    reader = RootReader(str(tmp_path))
    with pytest.raises(ReadError, match="value"):
        reader.integer("value")
    with pytest.raises(ReadError, match="value"):
        reader.counter("value")
    assert reader.text("value") == raw.strip(" \n")


@pytest.mark.parametrize("raw", ["0x10", "0X10", str(2**64 - 1), str(2**32 - 1), "\u200812"])
def test_counter_refuses_hex_and_unsigned_minus_one(tmp_path: Path, raw: str) -> None:
    """A decimal counter written in hex is garbage, not 16; -1 written unsigned is "not
    available", never a count."""
    with pytest.raises(ParseError):
        parse_counter(raw)
    (tmp_path / "c").write_text(raw + "\n")
    reader = RootReader(str(tmp_path))
    with pytest.raises(ReadError, match="c: "):
        reader.counter("c")
    with pytest.raises(ReadError):
        reader.integer("c", hex_ok=False, limit=2**32 - 2)
    assert parse_counter("4294967294\n") == 2**32 - 2
    assert parse_counter(str(2**64 - 2)) == 2**64 - 2


def test_a_read_cut_at_its_limit_is_a_read_failure(tmp_path: Path) -> None:
    """A file longer than the read limit is never parsed from its first bytes."""
    (tmp_path / "long").write_text("1" + " " * 65535 + "\n")  # 65537 bytes
    (tmp_path / "full").write_text("1" + " " * 65534 + "\n")  # exactly 65536
    reader = RootReader(str(tmp_path))
    with pytest.raises(ReadError, match="long: .*read cut"):
        reader.text("long")
    with pytest.raises(ReadError, match="long: .*read cut"):
        reader.integer("long")
    assert reader.integer("full") == 1
    with pytest.raises(ReadError, match="read cut"):
        reader.data("full", 100)
    assert reader.data("full", 100, prefix=True) == b"1" + b" " * 99
