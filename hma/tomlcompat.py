"""TOML reading on every supported Python (``tomllib`` from 3.11, ``tomli`` before)."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - exercised by the 3.9/3.10 unit runs
    import tomli as _toml

TOMLDecodeError = _toml.TOMLDecodeError
loads = _toml.loads
