"""Typed configuration options: one declaration gives the default, the check and the docs."""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

Check = Callable[[Any], Optional[str]]


@dataclass(frozen=True)
class Option:
    """A configuration key: its kind, default, one-line documentation and optional extra check.

    Kinds: ``bool``, ``int`` (64-bit), ``float`` (finite, within ``FLOAT_LIMIT`` unless a
    ``maximum`` is declared; ints accepted), ``str`` (one line, no C0, C1 or bidi control
    characters), ``path`` (absolute), ``pathlist`` (list of absolute paths), ``argv`` (non-empty
    list of strings), ``strlist`` (items from ``choices`` when given), ``choice`` (one of
    ``choices``), ``table`` (any TOML table, checked by ``check``). ``check`` runs before the
    bounds; ``minimum``/``maximum`` bound numbers (inclusive); ``below`` names a
    key of the same table that a number must stay under (``nvml_deadline_s`` below ``timeout``).
    No value anywhere holds a non-finite float or a NUL. ``default=None`` means "unset".
    """

    kind: str
    default: Any
    doc: str
    choices: Sequence[str] = ()
    check: Optional[Check] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    below: Optional[str] = None

    def validate(self, value: Any) -> Optional[str]:
        """None when ``value`` is acceptable, else the problem in a few words."""
        problem = _KIND_CHECKS[self.kind](self, value) or _leaf_problem(value)
        if problem is None and self.check is not None:
            problem = self.check(value)
        if problem is None and self.minimum is not None and value < self.minimum:
            problem = f"must be >= {self.minimum:g}"
        if problem is None and self.maximum is not None and value > self.maximum:
            problem = f"must be <= {self.maximum:g}"
        return problem

    def limits(self) -> str:
        """The declared bounds in words ('' when none), for generated documentation."""
        above_zero = self.minimum is not None and self.minimum > 0
        parts = ["> 0"] if self.check is positive and not above_zero else []
        if self.minimum is not None:
            parts.append(f">= {self.minimum:.15g}")
        if self.maximum is not None:
            parts.append(f"<= {self.maximum:.15g}")
        if self.below is not None:
            parts.append(f"< {self.below}")
        return ", ".join(parts)


def _leaf_problem(value: Any) -> Optional[str]:
    """Problems no kind allows, at any depth: non-finite numbers and NUL characters."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"must be a finite number, got {item!r}"
        if isinstance(item, str) and "\0" in item:
            return f"must not contain a NUL character, got {_show(item)}"
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return None


def _bool(_o: Option, v: Any) -> Optional[str]:
    return None if isinstance(v, bool) else f"expected true or false, got {_show(v)}"


def _int(_o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, int) or isinstance(v, bool):
        return f"expected an integer, got {_show(v)}"
    return None if -(2**63) <= v < 2**63 else "must fit in 64 bits (TOML's integer range)"


# Numbers of a ``float`` option without a declared ``maximum`` stay within this (about 31 years
# in seconds; waits beyond threading.TIMEOUT_MAX, 9.2e9 s, raise OverflowError).
FLOAT_LIMIT = 1e9


def _float(o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return f"expected a number, got {_show(v)}"
    if o.maximum is None and abs(v) > FLOAT_LIMIT:  # finite: _leaf_problem
        return f"must be between -{FLOAT_LIMIT:g} and {FLOAT_LIMIT:g}, got {v:g}"
    return None


# C0, DEL, C1, and the bidi embeddings, overrides and isolates (they reorder what a terminal shows)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _one_line(v: str) -> Optional[str]:
    bad = _CONTROL.search(v)
    return f"must not contain control character {bad.group()!r}, got {_show(v)}" if bad else None


def _str(_o: Option, v: Any) -> Optional[str]:
    return _one_line(v) if isinstance(v, str) else f"expected a string, got {_show(v)}"


def _path(_o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, str):
        return f"expected a path string, got {_show(v)}"
    return _one_line(v) if v.startswith("/") else f"must be an absolute path, got {_show(v)}"


def _pathlist(_o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return f"expected a list of path strings, got {_show(v)}"
    for item in v:
        problem = _path(_o, item)
        if problem:
            return problem
    return None


def _argv(_o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        return f"expected a non-empty list of strings (an argv), got {_show(v)}"
    return None


def _strlist(o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return f"expected a list of strings, got {_show(v)}"
    for item in v:
        problem = _choice(o, item) if o.choices else _one_line(item)
        if problem:
            return problem
    return None


def _choice(o: Option, v: Any) -> Optional[str]:
    if v in o.choices:
        return None
    return f"expected one of {', '.join(repr(c) for c in o.choices)}, got {_show(v)}"


def _table(_o: Option, v: Any) -> Optional[str]:
    return None if isinstance(v, dict) else f"expected a table, got {_show(v)}"


_KIND_CHECKS: dict[str, Callable[[Option, Any], Optional[str]]] = {
    "bool": _bool,
    "int": _int,
    "float": _float,
    "str": _str,
    "path": _path,
    "pathlist": _pathlist,
    "argv": _argv,
    "strlist": _strlist,
    "choice": _choice,
    "table": _table,
}


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 2, 36, 36


def _show(v: Any) -> str:
    """Type and a short repr (bounded in length and depth: values come from untrusted files)."""
    return f"{type(v).__name__} {_SHORT.repr(v)}"


def positive(v: Any) -> Optional[str]:
    """Check: strictly positive number."""
    return None if v > 0 else "must be > 0"


def rate_limits(v: Any) -> Optional[str]:
    """Check: a table of counter name -> positive number (a limit per second)."""
    for key, limit in v.items():
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0:
            return f"{key}: expected a positive number per second"
    return None


def pci_ids(v: Any) -> Optional[str]:
    """Check: every item a PCI id in hex (``0x1d0f``), 0 to 0xffff."""
    for item in v:
        if not re.fullmatch(r"(0[xX])?[0-9a-fA-F]{1,4}", item):
            return f"expected a PCI id in hex, 0x0000 to 0xffff, got {_show(item)}"
    return None
