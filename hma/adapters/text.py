"""Text that others wrote, made safe to print on a terminal (docs/security.md, "The readers")."""

from __future__ import annotations

import re

# refused besides C0: DEL, C1, bidi and format controls, U+2028/U+2029, lone surrogates
_OTHERS = r"\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_REFUSED = re.compile(rf"[\x00-\x09\x0b-\x1f{_OTHERS}]")
_REFUSED_LINE = re.compile(rf"[\x00-\x1f{_OTHERS}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    return _NAMED.get(ch) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, newlines: bool = False) -> str:
    """``text`` with every control character escaped as ``repr`` writes it (``\\x1b``,
    ``\\u202e``); line breaks are kept only with ``newlines`` (a field of several lines)."""
    return (_REFUSED if newlines else _REFUSED_LINE).sub(_escape, text)
