"""TOML reading on every supported Python (``tomllib`` from 3.11, ``tomli`` before).

Files come from operators and sites, so a parse never raises anything but ``TOMLDecodeError``,
and nesting past ``MAX_DEPTH`` (arrays and tables together) is refused, whether it overflows the
parser's recursion or not, so that every caller can walk the result recursively.
"""

from __future__ import annotations

import sys
from typing import Any

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
