"""One strict reader of numbers and state words, for every probe.

What hma cannot parse strictly is unknown, never evidence of a fault (docs/unknown.md): a counter
is ASCII digits (or ``0x`` hex) within range, a state is one of the words the caller recognises.
Python's ``int()`` is too lenient for this (it takes ``-1``, ``1_0``, ``٣``, surrounding blanks,
and any number of digits), and ``float()`` takes ``1e-9``, ``inf`` and ``nan``.
"""

from __future__ import annotations

import re
from typing import Collection

U64_MAX = 2**64 - 1
"""Largest value of an unsigned 64-bit counter (NVML, sysfs hw_counters)."""

_DEC = re.compile(r"[0-9]{1,20}\Z", re.ASCII)
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,16}\Z", re.ASCII)
_DECIMAL = re.compile(r"-?[0-9]{1,20}(?:\.[0-9]{1,20})?\Z", re.ASCII)


class ParseError(ValueError):
    """A value that is not strictly what it should be; the message quotes it (shortened)."""


def _shown(raw: str) -> str:
    return repr(raw[:40] + ("..." if len(raw) > 40 else ""))


def parse_uint(raw: str, *, limit: int = U64_MAX, hex_ok: bool = True) -> int:
    """An unsigned integer: ASCII decimal digits (or ``0x`` hex when ``hex_ok``), at most ``limit``.

    Surrounding ASCII whitespace (a trailing newline) is allowed; signs, underscores, exponents,
    non-ASCII digits, NUL bytes and anything else raise ParseError.
    """
    text = raw.strip(" \t\r\n")
    if _DEC.match(text):
        value = int(text, 10)
    elif hex_ok and _HEX.match(text):
        value = int(text, 16)
    else:
        raise ParseError(f"not an unsigned integer: {_shown(raw)}")
    if value > limit:
        raise ParseError(f"out of range (> {limit}): {_shown(raw)}")
    return value


def parse_decimal(raw: str, *, low: float, high: float) -> float:
    """A plain decimal number (``-12``, ``37.5``; no exponent, inf or nan) within [low, high]."""
    text = raw.strip(" \t\r\n")
    if not _DECIMAL.match(text):
        raise ParseError(f"not a decimal number: {_shown(raw)}")
    value = float(text)
    if not low <= value <= high:
        raise ParseError(f"out of range [{low:g}, {high:g}]: {_shown(raw)}")
    return value


def parse_word(raw: str, allowed: Collection[str], *, fold_case: bool = True) -> str:
    """A state word that the caller recognises, returned as spelled in ``allowed``.

    Whitespace around it is dropped; an empty, unknown or non-ASCII word raises ParseError, so
    only a recognised word other than the healthy one can mean "down".
    """
    text = raw.strip(" \t\r\n")
    for word in allowed:
        if text == word or (fold_case and text.isascii() and text.lower() == word.lower()):
            return word
    raise ParseError(f"unrecognised state {_shown(raw)} (expected one of {', '.join(allowed)})")
