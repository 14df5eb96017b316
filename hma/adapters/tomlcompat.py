"""TOML reading on every supported Python (``tomllib`` from 3.11, ``tomli`` before), and the
one writer of TOML (``dumps``: what `hma genconf` writes).

Files come from operators and sites, so a parse never raises anything but ``TOMLDecodeError``,
and nesting past ``MAX_DEPTH`` (arrays and tables together) is refused, whether it overflows the
parser's recursion or not, so that every caller can walk the result recursively.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

# hma's deepest table is 4 levels ([probes.efa_mesh.adapters.X]); 32 leaves room for site rules.
MAX_DEPTH = 32


class TOMLDecodeError(ValueError):
    """The text is not TOML, or nests deeper than ``MAX_DEPTH``."""


def loads(text: str) -> dict[str, Any]:
    """Parse TOML text; raises ``TOMLDecodeError`` (and nothing else) on bad input.

    The parser is imported here, when there is a file to read: a start without one skips it."""
    if sys.version_info >= (3, 11):
        import tomllib as _toml
    else:  # pragma: no cover - exercised by the 3.9/3.10 unit runs
        import tomli as _toml
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise TOMLDecodeError(str(exc)) from None
    except RecursionError:
        raise TOMLDecodeError(f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    if _depth(data) > MAX_DEPTH:
        raise TOMLDecodeError(f"nested too deeply (at most {MAX_DEPTH} levels)")
    return data


def _depth(value: Any) -> int:
    """Nesting depth of tables and arrays, without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack += [(child, level + 1) for child in children]
    return deepest


_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def dumps(data: Mapping[str, Any], header: str = "") -> str:
    """TOML text of ``data`` (tables of strings, integers, finite floats, booleans and lists of
    those; ``header``: comment lines put first), read back with ``loads`` before it is returned,
    so what hma writes is TOML that reads as ``data``; ValueError for anything else."""
    lines = [f"# {line}" for line in header.splitlines()]
    _table(lines, [], data)
    text = "\n".join(lines).lstrip("\n") + "\n"
    if loads(text) != data:
        raise ValueError("the TOML written does not read back as the data given")
    return text


def _table(lines: list[str], path: list[str], table: Mapping[str, Any]) -> None:
    plain = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
    if path and (plain or not table):
        lines += ["", "[" + ".".join(_key(p) for p in path) + "]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in plain]
    for key, value in table.items():
        if isinstance(value, Mapping):
            _table(lines, [*path, key], value)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise ValueError(f"a TOML key must be a string, got {type(key).__name__}")
    return key if key and set(key) <= _BARE_KEY else _string(key)


def _string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and every control character escaped."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            raise ValueError("a TOML string cannot hold a lone surrogate")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("hma writes finite numbers only")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise ValueError(f"cannot write a {type(value).__name__} as TOML")
