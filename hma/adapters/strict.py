"""One strict reader of numbers and state words, for every probe.

What hma cannot parse strictly is unknown, never evidence of a fault (docs/unknown.md): a counter
is ASCII digits (or ``0x`` hex where the caller says the writer writes hex) within range, a state
is one of the words the caller recognises. Python's ``int()`` is too lenient for this (it takes
``-1``, ``1_0``, ``٣``, surrounding blanks, and any number of digits), ``float()`` takes
``1e-9``, ``inf`` and ``nan``, and ``str.strip()`` drops Unicode spaces (U+2008 before ``12``).
"""

from __future__ import annotations

import re
from typing import Collection

U64_MAX = 2**64 - 1
"""Largest value of an unsigned 64-bit counter (NVML, sysfs hw_counters)."""
U32_MAX = 2**32 - 1
NOT_AVAILABLE = frozenset({U64_MAX, U32_MAX})
"""-1 written unsigned (``%llu``/``%u`` of -1): a driver's "not available", never a count."""
ASCII_SPACE = " \t\n\r\x0b\x0c"
"""The blanks a value may be surrounded by; ``str.strip()`` also drops Unicode spaces."""

_DEC = re.compile(r"[0-9]{1,20}\Z", re.ASCII)
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,16}\Z", re.ASCII)
_DECIMAL = re.compile(r"-?[0-9]{1,20}(?:\.[0-9]{1,20})?\Z", re.ASCII)


class ParseError(ValueError):
    """A value that is not strictly what it should be; the message quotes it (shortened)."""


def _shown(raw: str) -> str:
    return repr(raw[:40] + ("..." if len(raw) > 40 else ""))


def parse_uint(raw: str, *, limit: int = U64_MAX, hex_ok: bool = True) -> int:
    """An unsigned integer: ASCII decimal digits (or ``0x`` hex when ``hex_ok``), at most ``limit``.

    Callers reading what is written in decimal pass ``hex_ok=False``: ``0x10`` in a decimal
    counter is garbage, not 16. Surrounding ASCII whitespace (a trailing newline) is allowed;
    Unicode spaces, signs, underscores, exponents, non-ASCII digits, NUL bytes and anything else
    raise ParseError.
    """
    text = raw.strip(ASCII_SPACE)
    if _DEC.match(text):
        value = int(text, 10)
    elif hex_ok and _HEX.match(text):
        value = int(text, 16)
    else:
        raise ParseError(f"not an unsigned integer: {_shown(raw)}")
    if value > limit:
        raise ParseError(f"out of range (> {limit}): {_shown(raw)}")
    return value


def parse_counter(raw: str) -> int:
    """A decimal event counter; ``-1`` written unsigned (2^64-1, 2^32-1: "not available") raises
    ParseError, so an unavailable counter is unknown, never growth."""
    value = parse_uint(raw, hex_ok=False)
    if value in NOT_AVAILABLE:
        raise ParseError(f"not available (-1 written unsigned): {_shown(raw)}")
    return value


def parse_decimal(raw: str, *, low: float, high: float) -> float:
    """A plain decimal number (``-12``, ``37.5``; no exponent, inf or nan) within [low, high]."""
    text = raw.strip(ASCII_SPACE)
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
    text = raw.strip(ASCII_SPACE)
    for word in allowed:
        if text == word or (fold_case and text.isascii() and text.lower() == word.lower()):
            return word
    raise ParseError(f"unrecognised state {_shown(raw)} (expected one of {', '.join(allowed)})")
