"""Text that others wrote, made safe to print on a terminal (docs/security.md, "The readers").

One rule for every operator-facing text: a character is refused when its Unicode category
(``unicodedata.category``) is a control (Cc: C0, DEL, C1), a format control (Cf: bidi marks
and embeddings, zero-width characters, the BOM, the soft hyphen, tag characters), a surrogate
(Cs), private use (Co), unassigned (Cn), or a line or paragraph separator (Zl, Zp). Refused
characters are escaped as ``repr`` writes them; ``refused``/``plain`` are the same rule as a
predicate, for readers that refuse such text instead of escaping it.
"""

from __future__ import annotations

import re
import unicodedata

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# The refused ASCII characters (all Cc): the fast path for ASCII text
_ASCII = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
_ASCII_LINE = re.compile(r"[\x00-\x1f\x7f]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def refused(ch: str) -> bool:
    """Whether the character ``ch`` may not reach a terminal as it is (see the module doc)."""
    return unicodedata.category(ch) in REFUSED_CATEGORIES


def plain(text: str) -> bool:
    """Whether ``text`` holds no refused character (a line break is one): ``printable`` leaves
    it as it is."""
    return not any(refused(ch) for ch in text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, newlines: bool = False) -> str:
    """``text`` with every refused character escaped as ``repr`` writes it (``\\x1b``,
    ``\\u202e``, ``\\U000e0041``); line breaks are kept only with ``newlines`` (a field of
    several lines)."""
    if text.isascii():
        return (_ASCII if newlines else _ASCII_LINE).sub(lambda m: _escaped(m.group()), text)
    return "".join(
        _escaped(ch) if refused(ch) and not (newlines and ch == "\n") else ch for ch in text
    )
