"""Typed configuration options: one declaration gives the default, the check and the docs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

Check = Callable[[Any], Optional[str]]


@dataclass(frozen=True)
class Option:
    """A configuration key: its kind, default, one-line documentation and optional extra check.

    Kinds: ``bool``, ``int``, ``float`` (ints accepted), ``str``, ``path`` (absolute), ``argv``
    (non-empty list of strings), ``strlist``, ``choice`` (one of ``choices``), ``table`` (any TOML
    table, checked by ``check``). ``default=None`` means "unset" and is documented as such.
    """

    kind: str
    default: Any
    doc: str
    choices: Sequence[str] = ()
    check: Optional[Check] = None
    minimum: Optional[float] = None

    def validate(self, value: Any) -> Optional[str]:
        """None when ``value`` is acceptable, else the problem in a few words."""
        problem = _KIND_CHECKS[self.kind](self, value)
        if problem is None and self.minimum is not None and value < self.minimum:
            problem = f"must be >= {self.minimum:g}"
        if problem is None and self.check is not None:
            problem = self.check(value)
        return problem


def _bool(_o: Option, v: Any) -> Optional[str]:
    return None if isinstance(v, bool) else f"expected true or false, got {_show(v)}"


def _int(_o: Option, v: Any) -> Optional[str]:
    ok = isinstance(v, int) and not isinstance(v, bool)
    return None if ok else f"expected an integer, got {_show(v)}"


def _float(_o: Option, v: Any) -> Optional[str]:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    return None if ok else f"expected a number, got {_show(v)}"


def _str(_o: Option, v: Any) -> Optional[str]:
    return None if isinstance(v, str) else f"expected a string, got {_show(v)}"


def _path(_o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, str):
        return f"expected a path string, got {_show(v)}"
    return None if v.startswith("/") else f"must be an absolute path, got {v!r}"


def _argv(_o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        return f"expected a non-empty list of strings (an argv), got {_show(v)}"
    return None


def _strlist(_o: Option, v: Any) -> Optional[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return f"expected a list of strings, got {_show(v)}"
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
    "argv": _argv,
    "strlist": _strlist,
    "choice": _choice,
    "table": _table,
}


def _show(v: Any) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) < 40 else text[:37] + '...'}"


def positive(v: Any) -> Optional[str]:
    """Check: strictly positive number."""
    return None if v > 0 else "must be > 0"
